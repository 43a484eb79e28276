"""The embedder's configuration (:class:`EmbedderConfig`), its counters and the text check every entry shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprompt._loaded import check_backend
from gpuprompt.batching import MAX_WAIT_MS_LIMIT, BatcherStats
from gpuprompt.embed._guard import QualityThresholds
from gpuprompt.errors import ConfigurationError, InputTypeError, describe
from gpuprompt.models import BUNDLED_EMBEDDING_ALIASES
from gpuprompt.validation import check_bool, check_choice, check_int, check_number, check_str, check_str_list

__all__ = ["QUANTIZE_CHOICES", "EmbedderConfig", "EmbedderStats", "validate_texts"]

_MAX_INT32 = 2**31 - 1

QUANTIZE_CHOICES = ("int8", "auto")
"""What ``EmbedderConfig.quantize`` accepts besides None (full precision)."""


@dataclass(frozen=True, kw_only=True)
class EmbedderConfig:
    """Everything that identifies one loaded embedder and its batch queue.

    Attributes:
        model: a local folder, a hub id, or None for the bundled all-MiniLM-L6-v2.
        device: ``"auto"`` (cuda > mps > cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        normalize: L2-normalise embeddings (then inner product equals cosine similarity).
        dtype: compute dtype (``"float16"``, ``"bfloat16"``, ``"float32"``); None = fp16 on CUDA,
            fp32 elsewhere. Embeddings are always returned as float32 (normalised in float32).
            ``"bfloat16"`` on a CPU with AMX or AVX512-BF16 packs the linear layers once for
            oneDNN (:mod:`gpuprompt._bf16`): 0.993 of fp32's top-10 kept on real prose, 2.6x fp32's
            bulk texts/s and 1.5x for many one-text callers (2 cores); elsewhere bf16 is emulated.
        batch_size: most texts per forward pass.
        max_batch_tokens: most (non-padded) tokens per forward pass.
        max_wait_ms: with ``min_batch_size`` > 1, the longest the busy worker lets a short queue
            gather after a batch (see :class:`~gpuprompt.MicroBatcher`; idle, it never waits).
        min_batch_size: the queue a busy worker gathers before its next forward pass (within
            ``max_wait_ms``); 1, the default, dispatches whatever queued behind the running batch.
        max_queue: most texts waiting; more raises ``QueueFullError``.
        cache_size: most embeddings kept in the device cache (LRU); 0 disables the cache.
        show_progress: show a tqdm bar for bulk calls (more than one batch of new texts).
        quantize: None (full precision), ``"int8"`` or ``"auto"``. ``"int8"`` runs the forward
            pass as int8 on CPU (onnxruntime, ``pip install 'gpuprompt[quant]'``): the model is
            exported and quantised once into the models cache, then checked against fp32 by the
            quality guard; under ``quantize_guard`` it raises ``QualityError`` naming the figures.
            ``"auto"`` uses int8 where it runs and passes the guard, else full precision (logging
            why). On CUDA, fp16 is already fast: ``"int8"`` is refused there and ``"auto"`` keeps
            fp16 (for a model this small int8 would save memory, not time: see :mod:`gpuprompt.embed._int8`).
        quantize_guard: the quality guard's thresholds (cosine mean/min, recall@10 kept and top-10
            agreement on real prose vs fp32), a :class:`QualityThresholds` or a dict of its fields.
        backend: ``"torch"`` (default) or ``"onnx"``: the same fp32 transformer exported once to ONNX
            (into the models cache, checked against torch when built) and run by onnxruntime as
            one-thread slices, one per core (``pip install 'gpuprompt[quant]'``). CPU only. An export
            whose outputs differ from torch's by more than 1e-4 of the largest is refused (measured:
            2e-7), so :attr:`~gpuprompt.Embedder.identity` is unchanged and an index built with either
            backend serves the other. Measured 1.16x torch's texts/s from
            concurrent callers and 1.13x in bulk on 2 AVX2 cores (``gpuprompt bench embed-quant``).
            With ``quantize``, int8 serves when it loads and passes its guard, else this fp32 export.
    """

    model: str | None = None
    device: str = "auto"
    normalize: bool = True
    dtype: str | None = None
    batch_size: int = 64
    max_batch_tokens: int = 16_384
    max_wait_ms: float = 5.0
    min_batch_size: int = 1
    max_queue: int = 100_000
    cache_size: int = 50_000
    show_progress: bool = False
    quantize: str | None = None
    quantize_guard: QualityThresholds = dataclasses.field(default_factory=QualityThresholds)
    backend: str = "torch"

    def __post_init__(self) -> None:
        check_int(self.batch_size, "batch_size", min=1, max=_MAX_INT32, error=ConfigurationError)
        check_int(self.max_batch_tokens, "max_batch_tokens", min=1, max=_MAX_INT32, error=ConfigurationError)
        check_int(self.max_queue, "max_queue", min=1, max=_MAX_INT32, error=ConfigurationError)
        check_int(self.min_batch_size, "min_batch_size", min=1, max=self.batch_size, error=ConfigurationError)
        check_int(self.cache_size, "cache_size", min=0, max=_MAX_INT32, error=ConfigurationError)
        if self.dtype is not None:
            check_choice(self.dtype, "dtype", ("float16", "bfloat16", "float32"), error=ConfigurationError)
        object.__setattr__(
            self,
            "max_wait_ms",
            check_number(self.max_wait_ms, "max_wait_ms", min=0, max=MAX_WAIT_MS_LIMIT, error=ConfigurationError),
        )
        check_str(self.model, "model", allow_none=True, allow_empty=False, error=ConfigurationError)
        check_str(self.device, "device", allow_empty=False, error=ConfigurationError)
        check_bool(self.normalize, "normalize", error=ConfigurationError)
        check_bool(self.show_progress, "show_progress", error=ConfigurationError)
        if self.quantize is not None:
            check_choice(self.quantize, "quantize", (None, *QUANTIZE_CHOICES), error=ConfigurationError)
            if self.dtype not in (None, "float32"):
                raise ConfigurationError(
                    f"'dtype' must be None or 'float32' with quantize={self.quantize!r} (got {self.dtype!r}): the "
                    "int8 forward replaces the compute dtype and is checked against fp32."
                )
        check_backend(self.backend, self.device, self.dtype)
        if self.quantize == "int8" and self.device not in ("auto", "cpu"):
            raise ConfigurationError(
                f"quantize='int8' runs on CPU only (got device={self.device!r}). On CUDA fp16 is already fast and "
                "int8 would save memory rather than time for this model: use quantize=None (fp16 there), "
                "quantize='auto' (int8 on CPU, full precision elsewhere), or device='cpu'."
            )
        if isinstance(self.quantize_guard, Mapping):
            # dataclasses.asdict(config) (the adapters pass options on that way) and JSON configs
            # give the thresholds as a dict.
            valid = {f.name for f in dataclasses.fields(QualityThresholds)}
            unknown = sorted(set(self.quantize_guard) - valid, key=str)
            if unknown:
                raise ConfigurationError(
                    f"'quantize_guard' holds unknown key(s) {unknown}; valid keys: {sorted(valid)}."
                )
            object.__setattr__(self, "quantize_guard", QualityThresholds(**self.quantize_guard))
        if not isinstance(self.quantize_guard, QualityThresholds):
            raise ConfigurationError(
                f"'quantize_guard' must be a QualityThresholds or a dict of its fields (got "
                f"{describe(self.quantize_guard)})."
            )
        if self.model in BUNDLED_EMBEDDING_ALIASES:
            # One spelling per model, so every alias of the bundled model shares one instance.
            object.__setattr__(self, "model", None)

    def replace(self, **changes: Any) -> EmbedderConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def key(self) -> tuple[Any, ...]:
        """The registry key: every field that changes the model or its queue."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "show_progress")


def validate_texts(texts: Any, *, name: str = "texts") -> list[str]:
    """Check that ``texts`` is a list (or tuple) of str and return it as a list.

    Raises:
        InputTypeError: a bare str, a non-sequence, or an item that is not a str (named by index).
    """
    if isinstance(texts, (str, bytes)):
        raise InputTypeError(
            f"'{name}' must be a list of str, got a bare {type(texts).__name__}; wrap it in a list: [text]."
        )
    if not isinstance(texts, Sequence):
        raise InputTypeError(f"'{name}' must be a list of str (got {describe(texts)}).")
    return check_str_list(list(texts), name)


@dataclass(frozen=True)
class EmbedderStats:
    """Counters of an :class:`Embedder`.

    Attributes:
        texts: texts asked for, all calls together.
        cache_hits: texts served from the cache.
        cache_misses: texts that had to be encoded (after de-duplication within a call).
        deduplicated: repeats inside one call, encoded once.
        truncated: encoded texts longer than the model's max length (cut to it).
        cache_entries: embeddings in the cache now.
        cache_evictions: embeddings dropped by the LRU bound.
        batcher: the batch queue's counters.
    """

    texts: int
    cache_hits: int
    cache_misses: int
    deduplicated: int
    truncated: int
    cache_entries: int
    cache_evictions: int
    batcher: BatcherStats
