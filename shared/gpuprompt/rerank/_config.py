"""RerankerConfig: everything that identifies one loaded cross-encoder and its batch queue."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuprompt._loaded import check_backend
from gpuprompt.batching import MAX_WAIT_MS_LIMIT
from gpuprompt.errors import ConfigurationError, describe
from gpuprompt.validation import check_choice, check_int, check_number, check_str

__all__ = ["ACTIVATIONS", "QUANTIZE_CHOICES", "RankingThresholds", "RerankerConfig"]

_MAX_INT32 = 2**31 - 1
ACTIVATIONS = ("auto", "sigmoid", "identity")
"""``auto``: the model's own (as sentence-transformers ``CrossEncoder``: the activation its config
names, else sigmoid for one label); or force ``sigmoid`` / ``identity`` (raw logits)."""
QUANTIZE_CHOICES = ("int8", "auto")
"""What ``RerankerConfig.quantize`` accepts besides None (full precision)."""


@dataclass(frozen=True, kw_only=True)
class RankingThresholds:
    """The int8 reranker's quality guard, measured against fp32 on real prose.

    Attributes:
        top3_agreement: least mean share of fp32's top-3 documents (of 20 per query) that int8 also
            ranks in its top 3.
        top1_agreement: least share of queries whose best document int8 and fp32 agree on.
    """

    top3_agreement: float = 0.9
    top1_agreement: float = 0.9

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check_number(getattr(self, field.name), f"quantize_guard.{field.name}", min=0.0, max=1.0,
                         error=ConfigurationError)


@dataclass(frozen=True, kw_only=True)
class RerankerConfig:
    """Everything that identifies one loaded reranker and its batch queue.

    Attributes:
        model: a local cross-encoder folder (any Hugging Face sequence-classification model), a hub
            id, or None for :data:`gpuprompt.models.DEFAULT_RERANK_MODEL`.
        device: ``"auto"`` (cuda > mps > cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        dtype: compute dtype (``"float16"``, ``"bfloat16"``, ``"float32"``); None = fp16 on CUDA,
            fp32 elsewhere. Scores are always returned as float32. ``"bfloat16"`` on a CPU with AMX
            or AVX512-BF16 packs the linear layers once for oneDNN (:mod:`gpuprompt._bf16`): faster
            than int8 there, and closer to fp32's ranking.
        max_length: most tokens of a (query, document) pair; longer pairs are truncated, longest
            part first, as ``CrossEncoder`` does. None: the model's own limit.
        activation: how logits become scores (see :data:`ACTIVATIONS`).
        batch_size: most pairs per batch taken from the queue.
        max_batch_tokens: most padded tokens per forward pass (a batch is sorted by length and cut
            into passes within it, so short pairs are not padded to long ones).
        max_wait_ms: with ``min_batch_size`` > 1, the longest the busy model lets a short queue of
            pairs gather after a batch (idle, it never waits).
        min_batch_size: the queue of pairs a busy model gathers before its next batch (within
            ``max_wait_ms``); 1, the default, takes whatever queued behind the running batch.
        max_queue: most pairs waiting; more raise ``QueueFullError``.
        cache_size: most scores kept (LRU, keyed by model, query and document); 0 disables it.
        max_documents: most documents one call may rerank.
        quantize: None, ``"int8"`` (an int8 forward pass on CPU through onnxruntime, checked
            against fp32 by ``quantize_guard``) or ``"auto"`` (int8 where it runs and passes).
        quantize_guard: the guard's thresholds (a :class:`RankingThresholds` or a dict of its fields).
        backend: ``"torch"`` (default) or ``"onnx"``: the same fp32 cross-encoder exported once to ONNX
            (into the models cache, checked against torch when built) and run by onnxruntime as
            one-thread slices, one per core (``pip install 'gpuprompt[quant]'``). CPU only. An export
            whose logits differ from torch's by more than 1e-4 of the largest is refused (measured:
            1e-6), so :attr:`~gpuprompt.Reranker.identity` is unchanged. With
            ``quantize``, int8 serves when it loads and passes its guard, else this fp32 export.
    """

    model: str | None = None
    device: str = "auto"
    dtype: str | None = None
    max_length: int | None = None
    activation: str = "auto"
    batch_size: int = 64
    max_batch_tokens: int = 16_384
    max_wait_ms: float = 5.0
    min_batch_size: int = 1
    max_queue: int = 100_000
    cache_size: int = 100_000
    max_documents: int = 1000
    quantize: str | None = None
    quantize_guard: RankingThresholds = dataclasses.field(default_factory=RankingThresholds)
    backend: str = "torch"

    def __post_init__(self) -> None:
        check_str(self.model, "model", allow_none=True, allow_empty=False, error=ConfigurationError)
        check_str(self.device, "device", allow_empty=False, error=ConfigurationError)
        if self.dtype is not None:
            check_choice(self.dtype, "dtype", ("float16", "bfloat16", "float32"), error=ConfigurationError)
        check_int(self.max_length, "max_length", min=2, max=1 << 20, allow_none=True, error=ConfigurationError)
        check_choice(self.activation, "activation", ACTIVATIONS, error=ConfigurationError)
        for name in ("batch_size", "max_batch_tokens", "max_queue", "max_documents"):
            check_int(getattr(self, name), name, min=1, max=_MAX_INT32, error=ConfigurationError)
        check_int(self.cache_size, "cache_size", min=0, max=_MAX_INT32, error=ConfigurationError)
        check_int(self.min_batch_size, "min_batch_size", min=1, max=self.batch_size, error=ConfigurationError)
        object.__setattr__(self, "max_wait_ms", check_number(self.max_wait_ms, "max_wait_ms", min=0,
                                                             max=MAX_WAIT_MS_LIMIT, error=ConfigurationError))
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
                f"quantize='int8' runs on CPU only (got device={self.device!r}); use quantize=None (fp16 on CUDA), "
                "quantize='auto' (int8 on CPU, full precision elsewhere), or device='cpu'."
            )
        guard = self.quantize_guard
        if isinstance(guard, Mapping):
            valid = {f.name for f in dataclasses.fields(RankingThresholds)}
            unknown = sorted(set(guard) - valid, key=str)
            if unknown:
                raise ConfigurationError(f"'quantize_guard' holds unknown key(s) {unknown}; valid keys: {sorted(valid)}.")
            object.__setattr__(self, "quantize_guard", RankingThresholds(**guard))
        elif not isinstance(guard, RankingThresholds):
            raise ConfigurationError(
                f"'quantize_guard' must be a RankingThresholds or a dict of its fields (got {describe(guard)})."
            )
        if self.model in ("", "default"):
            object.__setattr__(self, "model", None)

    def replace(self, **changes: Any) -> RerankerConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def key(self) -> tuple[Any, ...]:
        """The registry key: every field that changes the model or its queue."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    @classmethod
    def option_names(cls) -> list[str]:
        """The names accepted as keyword options (every field but ``model``)."""
        return sorted(f.name for f in dataclasses.fields(cls) if f.name != "model")


