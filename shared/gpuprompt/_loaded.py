"""The parts of a lazily loaded model handle that the embedder and the reranker share: the repr,
``model_id``, ``device``, ``backend``, ``quantization`` and ``quality`` (each but the first loads the
model), and the check of the ``backend`` option."""

from __future__ import annotations

from typing import Any

from gpuprompt.errors import ConfigurationError
from gpuprompt.validation import check_choice

__all__ = ["BACKENDS", "LoadedModel", "check_backend", "onnx_on_device_error"]

BACKENDS = ("torch", "onnx")
"""What ``backend`` accepts: ``"torch"`` (the model's own forward pass) or ``"onnx"`` (the same fp32
model exported once to ONNX and run by onnxruntime on CPU, measured 1.13-1.16x torch's speed on 2 AVX2 cores)."""


def check_backend(backend: Any, device: str, dtype: str | None) -> None:
    """Raise ``ConfigurationError`` unless ``backend`` is valid with this ``device`` and ``dtype``."""
    check_choice(backend, "backend", BACKENDS, error=ConfigurationError)
    if backend != "onnx":
        return
    if device not in ("auto", "cpu"):
        raise ConfigurationError(
            f"backend='onnx' runs on CPU only (got device={device!r}); on an accelerator use backend='torch' (fp16 "
            "there is faster than any CPU path), or device='cpu'."
        )
    if dtype not in (None, "float32"):
        raise ConfigurationError(
            f"'dtype' must be None or 'float32' with backend='onnx' (got {dtype!r}): the ONNX export runs in fp32; for "
            "bf16 use backend='torch', for int8 add quantize='int8'."
        )


def onnx_on_device_error(device: str) -> ConfigurationError:
    """The error for ``backend="onnx"`` when device ``"auto"`` resolved to an accelerator."""
    return ConfigurationError(
        f"backend='onnx' runs on CPU only, and device 'auto' resolved to {device!r}; pass device='cpu' for the "
        "onnxruntime forward pass, or backend='torch' for the accelerator (fp16 there is faster)."
    )


class LoadedModel:
    """A mixin for a class with ``load()``, ``config`` (``device``, ``quantize``) and the private
    fields ``_model``, ``_model_id``, ``_device``, ``_quantization``, ``_quality`` that ``load`` sets."""

    _kind = "Model"
    config: Any
    _model: Any
    _model_id: str
    _device: str | None
    _quantization: str | None
    _quality: Any
    _backend: str | None = None

    def load(self) -> Any:  # pragma: no cover - provided by the class
        raise NotImplementedError

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        quantize = self._quantization if self._model is not None else self.config.quantize
        extra = f" quantize={quantize!r}" if quantize else ""
        backend = self._backend if self._model is not None else self.config.backend
        extra += f" backend={backend!r}" if backend not in (None, "torch") else ""
        return f"<{self._kind} {self._model_id!r} device={self._device or self.config.device!r}{extra} {state}>"

    @property
    def model_id(self) -> str:
        """The model's name (hub id or path) as configured; part of every cache key."""
        return self._model_id

    @property
    def loaded(self) -> bool:
        """Whether the model is loaded (reading this loads nothing)."""
        return self._model is not None

    @property
    def device(self) -> str:
        """The resolved torch device (loads the model)."""
        self.load()
        assert self._device is not None
        return self._device

    @property
    def backend(self) -> str:
        """What runs the forward pass: ``"torch"`` or ``"onnx"`` (onnxruntime: the fp32 export, or the
        int8 one when :attr:`quantization` is ``"int8"``). Loads the model."""
        self.load()
        return self._backend or "torch"

    @property
    def quantization(self) -> str | None:
        """``"int8"`` when the int8 forward pass serves, else None for full precision (also when
        ``quantize="auto"`` fell back). Loads the model."""
        self.load()
        return self._quantization

    @property
    def quality(self) -> Any:
        """The int8 quality guard's figures (None when no int8 model was asked for or built; kept
        also when ``quantize="auto"`` fell back because of them). Loads the model."""
        self.load()
        return self._quality
