"""Device choice, a leaf module: which torch device to run on, and its default compute dtype.

Imported by the components (embedder, index, LLM backends) and by the runtime that registers them;
it imports neither, so there is no cycle.
"""

from __future__ import annotations

import re
from typing import Any

from gpuprompt.errors import ConfigurationError, DependencyError, describe

__all__ = ["DEVICE_RE", "check_device", "default_dtype", "resolve_device"]

DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a hard dependency
        raise DependencyError("gpuprompt needs torch: pip install 'torch==2.13.0' (CPU) or a CUDA build.") from exc
    return torch


def check_device(device: object, name: str = "device") -> str:
    """Check the form of a device request without importing torch (``resolve_device`` checks
    that the device exists)."""
    if not isinstance(device, str) or not DEVICE_RE.fullmatch(device):
        raise ConfigurationError(f"'{name}' must be 'auto', 'cpu', 'mps', 'cuda' or 'cuda:N' (got {describe(device)}).")
    return device


def resolve_device(device: str = "auto") -> str:
    """Turn a device request into a concrete torch device string.

    Args:
        device: ``"auto"`` (cuda > mps > cpu), ``"cpu"``, ``"mps"``, ``"cuda"`` or ``"cuda:N"``.

    Returns:
        The device string to use, for example ``"cuda:0"`` or ``"cpu"``.

    Raises:
        ConfigurationError: the string is malformed, or names a device this machine lacks.
    """
    check_device(device)
    if device == "cpu":
        return "cpu"
    torch = _torch()
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda:0"
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return "mps"
        return "cpu"
    if device == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigurationError("device 'mps' was asked for but MPS is not available; use 'auto' or 'cpu'.")
        return "mps"
    if not torch.cuda.is_available():
        raise ConfigurationError(f"device {device!r} was asked for but CUDA is not available; use 'auto' or 'cpu'.")
    index = int(device.split(":")[1]) if ":" in device else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigurationError(f"device {device!r} does not exist: this machine has {count} CUDA device(s).")
    return f"cuda:{index}"


def default_dtype(device: str) -> str:
    """The default compute dtype for a resolved device: fp16 on CUDA, fp32 elsewhere."""
    return "float16" if device.startswith("cuda") else "float32"
