"""Embedder: sentence-transformers behind the MicroBatcher, with a device-resident embedding cache.

Concurrent ``embed`` calls from many threads or tasks are coalesced into batched forward passes;
a text seen before (same model, same text) is served from the cache and never re-encoded. On CPU
``quantize="int8"`` swaps only the forward pass for an int8 one (:mod:`gpuprompt._quant`), behind a
quality guard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt._device import default_dtype, resolve_device
from gpuprompt._quant import QUANTIZE_CHOICES, QualityReport, QualityThresholds
from gpuprompt._tokens import Encoded, Tokens
from gpuprompt._validate import check_bool, check_choice, check_int, check_number, check_str, check_str_list
from gpuprompt.batching import MAX_WAIT_MS_LIMIT, BatcherStats, MicroBatcher, check_priority
from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    DependencyError,
    DeviceOutOfMemoryError,
    InputTypeError,
    ModelLoadError,
    describe,
)
from gpuprompt.models import BUNDLED_EMBEDDING_ALIASES, BUNDLED_EMBEDDING_MODEL, resolve_embedding_model

if TYPE_CHECKING:
    import torch

__all__ = [
    "Embedder",
    "EmbedderConfig",
    "EmbedderStats",
    "EmbeddingCache",
    "QualityReport",
    "QualityThresholds",
    "validate_texts",
]

logger = logging.getLogger(__name__)

_MAX_INT32 = 2**31 - 1

_ASYNC_INLINE_LIMIT = 64  # aembed prepares at most this many texts on the loop thread


@dataclass(frozen=True, kw_only=True)
class EmbedderConfig:
    """Everything that identifies one loaded embedder and its batch queue.

    Attributes:
        model: a local folder, a hub id, or None for the bundled all-MiniLM-L6-v2.
        device: ``"auto"`` (cuda > mps > cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        normalize: L2-normalise embeddings (then inner product equals cosine similarity).
        dtype: compute dtype (``"float16"``, ``"bfloat16"``, ``"float32"``); None = fp16 on CUDA,
            fp32 elsewhere. Embeddings are always returned as float32.
        batch_size: most texts per forward pass.
        max_batch_tokens: most (non-padded) tokens per forward pass.
        max_wait_ms: the longest a queued text waits for its batch to fill while under load.
        max_queue: most texts waiting; more raises ``QueueFullError``.
        cache_size: most embeddings kept in the device cache (LRU); 0 disables the cache.
        show_progress: show a tqdm bar for bulk calls (more than one batch of new texts).
        quantize: None (full precision), ``"int8"`` or ``"auto"``. ``"int8"`` runs the forward
            pass as int8 on CPU (onnxruntime, ``pip install 'gpuprompt[quant]'``): the model is
            exported and quantised once into the models cache, then checked against fp32 by the
            quality guard; under ``quantize_guard`` it raises ``QualityError`` naming the figures.
            ``"auto"`` uses int8 where it runs and passes the guard, else full precision (logging
            why). On CUDA, fp16 is already fast: ``"int8"`` is refused there and ``"auto"`` keeps
            fp16 (for a model this small int8 would save memory, not time: see :mod:`gpuprompt._quant`).
        quantize_guard: the quality guard's thresholds (cosine mean/min and recall@10 kept vs fp32),
            a :class:`QualityThresholds` or a dict of its fields.
    """

    model: str | None = None
    device: str = "auto"
    normalize: bool = True
    dtype: str | None = None
    batch_size: int = 64
    max_batch_tokens: int = 16_384
    max_wait_ms: float = 5.0
    max_queue: int = 100_000
    cache_size: int = 50_000
    show_progress: bool = False
    quantize: str | None = None
    quantize_guard: QualityThresholds = dataclasses.field(default_factory=QualityThresholds)

    def __post_init__(self) -> None:
        check_int(self.batch_size, "batch_size", min=1, max=_MAX_INT32, error=ConfigurationError)
        check_int(self.max_batch_tokens, "max_batch_tokens", min=1, max=_MAX_INT32, error=ConfigurationError)
        check_int(self.max_queue, "max_queue", min=1, max=_MAX_INT32, error=ConfigurationError)
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


class EmbeddingCache:
    """Content-addressed embeddings kept in one device tensor, bounded by entries (LRU).

    Keys are digests of (model id, text). Rows live in a preallocated tensor on the device that
    grows by doubling up to ``capacity``; evicted rows are reused.

    Args:
        dim: embedding dimension.
        capacity: most entries kept.
        device: torch device string.
    """

    def __init__(self, dim: int, capacity: int, device: str) -> None:
        import torch

        self.dim = dim
        self.capacity = capacity
        self.device = device
        self._lock = threading.Lock()
        self._slots: OrderedDict[bytes, int] = OrderedDict()
        self._free: list[int] = []
        self._storage = torch.empty((min(capacity, 1024), dim), dtype=torch.float32, device=device)
        self._used = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._slots)

    def __repr__(self) -> str:
        return f"<EmbeddingCache {len(self)}/{self.capacity} dim={self.dim} device={self.device!r}>"

    def gather(self, keys: Sequence[bytes]) -> tuple[torch.Tensor, list[int]]:
        """Copy out the cached rows for ``keys``.

        Returns:
            ``(rows, positions)``: a ``(m, dim)`` tensor of the hits and their positions in ``keys``.
        """
        import torch

        with self._lock:
            positions: list[int] = []
            slots: list[int] = []
            for position, key in enumerate(keys):
                slot = self._slots.get(key)
                if slot is not None:
                    self._slots.move_to_end(key)
                    positions.append(position)
                    slots.append(slot)
            if not slots:
                return torch.empty((0, self.dim), dtype=torch.float32, device=self.device), positions
            index = torch.tensor(slots, dtype=torch.long, device=self.device)
            return self._storage.index_select(0, index), positions

    def put(self, keys: Sequence[bytes], rows: torch.Tensor) -> None:
        """Store ``rows[i]`` under ``keys[i]``, evicting least recently used entries if full."""
        import torch

        if self.capacity == 0 or not keys:
            return
        with self._lock:
            # A call with more new rows than the whole cache keeps its last `capacity` rows.
            self.evictions += max(0, len(keys) - self.capacity)
            slots: list[int] = []
            rows_kept: list[int] = []
            for i, key in enumerate(keys[-self.capacity :]):
                slot = self._slots.get(key)
                if slot is None:
                    slot = self._allocate()
                    self._slots[key] = slot
                else:
                    self._slots.move_to_end(key)
                slots.append(slot)
                rows_kept.append(i + max(0, len(keys) - self.capacity))
            index = torch.tensor(slots, dtype=torch.long, device=self.device)
            source = rows[torch.tensor(rows_kept, dtype=torch.long, device=rows.device)]
            self._storage.index_copy_(0, index, source.to(self.device, torch.float32))

    def _allocate(self) -> int:
        import torch

        if self._free:
            return self._free.pop()
        if self._used < self.capacity:
            if self._used == self._storage.shape[0]:
                grown = min(self.capacity, self._storage.shape[0] * 2)
                storage = torch.empty((grown, self.dim), dtype=torch.float32, device=self.device)
                storage[: self._used] = self._storage[: self._used]
                self._storage = storage
            self._used += 1
            return self._used - 1
        _, slot = self._slots.popitem(last=False)
        self.evictions += 1
        return slot

    def clear(self) -> None:
        """Drop every entry (the storage is kept for reuse)."""
        with self._lock:
            self._free.extend(self._slots.values())
            self._slots.clear()


@dataclass
class _Item:
    text: str
    tokens: int
    key: bytes
    encoded: Encoded | None = None


@dataclass
class _Plan:
    """One call's split into cache hits and texts queued for the model."""

    keys: list[bytes]
    hit_rows: Any
    hit_positions: list[int]
    miss_keys: list[bytes]
    futures: list[Future]


class Embedder:
    """Batched, cached sentence embeddings on the best device.

    Nothing is loaded until the first call (or :meth:`load`). Concurrent calls are coalesced by
    one :class:`~gpuprompt.batching.MicroBatcher`; texts already embedded are served from the
    device cache. Use :meth:`gpuprompt.Runtime.embedder` to share one instance per process.

    Example:
        >>> from gpuprompt import Embedder
        >>> emb = Embedder()                      # bundled all-MiniLM-L6-v2, device "auto"
        >>> vectors = emb.embed(["red dress", "blue jeans"])
        >>> vectors.shape, vectors.dtype
        ((2, 384), dtype('float32'))
        >>> emb.embed(["red dress"])              # a cache hit: the model does not run
        ...
        >>> q8 = Embedder(device="cpu", quantize="int8")   # int8 forward, guarded against fp32
        >>> q8.identity, q8.quality.cosine_mean            # built once into the models cache
        ('sentence-transformers/all-MiniLM-L6-v2;int8', 0.998...)

    Args:
        model: a local folder, a hub id, or None for the bundled all-MiniLM-L6-v2.
        config: a full :class:`EmbedderConfig` (then pass no other option).
        **options: the other :class:`EmbedderConfig` fields (``device``, ``normalize``, ...).
    """

    def __init__(self, model: str | None = None, *, config: EmbedderConfig | None = None, **options: Any) -> None:
        if config is not None and (model is not None or options):
            raise ConfigurationError("pass either 'config' or individual options to Embedder, not both.")
        if config is None:
            valid = {f.name for f in dataclasses.fields(EmbedderConfig)} - {"model"}
            unknown = sorted(set(options) - valid)
            if unknown:
                raise ConfigurationError(f"unknown Embedder option(s) {unknown}; valid options: {sorted(valid)}.")
            config = EmbedderConfig(model=model, **options)
        self.config = config
        self._load_lock = threading.Lock()
        self._model: Any = None
        self._forward: Any = None
        self._quantization: str | None = None
        self._quality: QualityReport | None = None
        self._counter: Any = None
        self._counter_lock = threading.Lock()
        self._batcher: MicroBatcher[_Item, Any] | None = None
        self._cache: EmbeddingCache | None = None
        self._device: str | None = None
        self._dim: int | None = None
        self._max_length: int | None = None
        self._model_id = config.model or BUNDLED_EMBEDDING_MODEL
        self._stats_lock = threading.Lock()
        self._texts = self._hits = self._misses = self._dups = self._truncated = 0
        self._closed = False

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        quantize = self._quantization if self._model is not None else self.config.quantize
        extra = f" quantize={quantize!r}" if quantize else ""
        return f"<Embedder {self._model_id!r} device={self._device or self.config.device!r}{extra} {state}>"

    # ------------------------------------------------------------------ loading
    @property
    def model_id(self) -> str:
        """The model's name (hub id or path) as configured; part of every cache key."""
        return self._model_id

    @property
    def device(self) -> str:
        """The resolved torch device (loads the model)."""
        self.load()
        assert self._device is not None
        return self._device

    @property
    def dim(self) -> int:
        """Embedding dimension (loads the model)."""
        self.load()
        assert self._dim is not None
        return self._dim

    @property
    def quantization(self) -> str | None:
        """The forward pass's quantisation once loaded: ``"int8"``, or None for full precision (also
        when ``quantize="auto"`` fell back). Loads the model."""
        self.load()
        return self._quantization

    @property
    def quality(self) -> QualityReport | None:
        """The quality guard's figures for the int8 model, also when ``quantize="auto"`` fell back
        because of them (None when no int8 model was asked for or built). Loads the model."""
        self.load()
        return self._quality

    @property
    def identity(self) -> str:
        """Which embedder produces these vectors: the model id, plus ``;int8`` when quantised and
        ``;unnormalized`` without normalisation. Vectors of two identities must not share an index.
        Loads the model (``quantize="auto"`` is resolved then)."""
        self.load()
        parts = [self._model_id]
        if self._quantization:
            parts.append(self._quantization)
        if not self.config.normalize:
            parts.append("unnormalized")
        return ";".join(parts)

    @property
    def max_length(self) -> int:
        """The model's max sequence length in tokens; longer texts are truncated (loads the model)."""
        self.load()
        assert self._max_length is not None
        return self._max_length

    def load(self) -> Embedder:
        """Load the model now (otherwise the first call does). Idempotent and thread-safe."""
        if self._model is not None:
            return self
        with self._load_lock:
            if self._closed:
                raise ClosedError("this Embedder was closed; create a new one.")
            if self._model is not None:
                return self
            try:
                import torch
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise DependencyError(
                    "Embedder needs torch and sentence-transformers: pip install sentence-transformers"
                ) from exc
            device = resolve_device(self.config.device)
            path = resolve_embedding_model(self.config.model)
            try:
                model = SentenceTransformer(path, device=device)
            except Exception as exc:
                raise ModelLoadError(
                    f"could not load embedding model {self._model_id!r} from {path!r}: {exc}. Pass a local "
                    "sentence-transformers folder, or a hub id available offline in the HF cache."
                ) from exc
            dtype = self.config.dtype or default_dtype(device)
            model.to(getattr(torch, dtype))
            model.eval()
            forward, quantization, quality = self._choose_forward(model, path, device)
            dim = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") else None
            dim = dim or model.get_sentence_embedding_dimension()
            if not dim:
                raise ModelLoadError(f"model {self._model_id!r} does not report an embedding dimension.")
            self._device = device
            self._dim = int(dim)
            self._max_length = int(model.max_seq_length or 512)
            self._counter = Tokens(model.tokenizer, self._max_length)
            self._counter.verify(model.preprocess)
            self._cache = EmbeddingCache(self._dim, self.config.cache_size, device)
            self._batcher = MicroBatcher(
                self._run_batch,
                name=f"embed:{self._model_id.rsplit('/', 1)[-1]}",
                max_batch_size=self.config.batch_size,
                max_batch_cost=self.config.max_batch_tokens,
                cost=lambda item: item.tokens,
                max_wait_ms=self.config.max_wait_ms,
                max_queue=self.config.max_queue,
            )
            self._forward, self._quantization, self._quality = forward, quantization, quality
            self._model = model
            logger.info("loaded embedder %s on %s (%s, dim %d)", self._model_id, device, quantization or dtype,
                        self._dim)
        return self

    def _choose_forward(self, model: Any, path: str, device: str) -> tuple[Any, str | None, QualityReport | None]:
        """The forward pass for ``config.quantize``: ``(forward, quantization, guard report)``."""
        full = self._full_forward
        asked = self.config.quantize
        if asked is None:
            return full, None, None
        if device != "cpu":
            if asked == "int8":  # device "auto" resolved to an accelerator
                raise ConfigurationError(
                    f"quantize='int8' runs on CPU only, and device 'auto' resolved to {device!r}; pass device='cpu' "
                    "for int8, or quantize='auto' to keep fp16 on the accelerator (already fast there)."
                )
            logger.info("quantize='auto' on %s: keeping %s (int8 is a CPU path)", device, default_dtype(device))
            return full, None, None
        from gpuprompt import _quant

        try:
            onnx_path, report = _quant.build_int8(model, path, self._model_id)
        except (DependencyError, ModelLoadError) as exc:
            if asked == "int8":
                raise
            logger.warning("quantize='auto': using full precision for %s, int8 is unavailable: %s", self._model_id, exc)
            return full, None, None
        error = _quant.quality_error(report, self.config.quantize_guard, self._model_id)
        if error is not None:
            if asked == "int8":
                raise error
            logger.warning("quantize='auto': using full precision for %s, the int8 model failed the quality guard: %s",
                           self._model_id, "; ".join(error.failed) + f" ({report.summary()})")
            return full, None, report
        logger.info("int8 forward for %s passed the quality guard: %s", self._model_id, report.summary())
        return _quant.Int8Forward(onnx_path, model), "int8", report

    def _full_forward(self, features: dict[str, Any]) -> Any:
        return self._model(features)["sentence_embedding"]

    # ------------------------------------------------------------------ the batch function
    async def aload(self) -> Embedder:
        """Async :meth:`load`: loads on a worker thread, never on the caller's event loop."""
        if self._model is None:
            await asyncio.to_thread(self.load)
        return self

    def _run_batch(self, items: list[_Item]) -> list[Any]:
        import torch

        texts = [item.text for item in items]
        try:
            with torch.inference_mode():
                if all(item.encoded is not None and item.encoded.ids is not None for item in items):
                    features = self._counter.features([item.encoded for item in items])  # tokenised once
                else:
                    features = self._model.preprocess(texts)
                features = {k: v.to(self._device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
                out = self._forward(features)
                if self.config.normalize:
                    out = torch.nn.functional.normalize(out, p=2, dim=1)
                out = out.float()
            if self._cache is not None:
                # One cache write per batch, on the worker, instead of one per caller.
                self._cache.put([item.key for item in items], out)
        except torch.cuda.OutOfMemoryError as exc:
            # The MicroBatcher bisects a failing batch, so this retries with half the texts.
            torch.cuda.empty_cache()
            raise DeviceOutOfMemoryError(
                f"out of device memory embedding {len(texts)} texts; lower batch_size or max_batch_tokens."
            ) from exc
        return list(out.unbind(0))

    # ------------------------------------------------------------------ public API
    def _key(self, text: str) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        digest.update(self._model_id.encode())
        digest.update(b"\0")
        digest.update(text.encode("utf-8", "surrogatepass"))
        return digest.digest()

    def _count_tokens(self, texts: list[str]) -> list[int]:
        # The worker thread tokenises with the model's tokenizer; callers count with a private copy
        # (a fast tokenizer is not safe to share between threads that change its settings).
        with self._counter_lock:
            return self._counter.count(texts)

    def _encode(self, texts: list[str]) -> list[Encoded]:
        with self._counter_lock:
            return self._counter.encode(texts)

    def _prepare(self, texts: list[str], priority: int) -> _Plan:
        batcher, cache = self._batcher, self._cache
        if batcher is None or cache is None:
            raise ClosedError("this Embedder was closed; create a new one.")
        keys = [self._key(text) for text in texts]
        hit_rows, hit_positions = cache.gather(keys) if self.config.cache_size else (None, [])
        hit_set = set(hit_positions)
        unique: dict[bytes, str] = {}
        for position, key in enumerate(keys):
            if position not in hit_set and key not in unique:
                unique[key] = texts[position]
        miss_keys = list(unique)
        miss_texts = list(unique.values())
        futures: list[Future] = []
        if miss_texts:
            encoded = self._encode(miss_texts)
            truncated = sum(1 for item in encoded if item.truncated)
            # Length-sorted submission: bulk calls form batches of similar length (less padding).
            order = sorted(range(len(miss_texts)), key=lambda i: -encoded[i].tokens)
            sorted_futures = batcher.submit_many(
                [_Item(miss_texts[i], encoded[i].tokens, miss_keys[i], encoded[i]) for i in order], priority=priority
            )
            futures = [None] * len(order)  # type: ignore[list-item]
            for slot, i in enumerate(order):
                futures[i] = sorted_futures[slot]
        else:
            truncated = 0
        with self._stats_lock:
            self._texts += len(texts)
            self._hits += len(hit_positions)
            self._misses += len(miss_texts)
            self._dups += len(texts) - len(hit_positions) - len(miss_texts)
            self._truncated += truncated
        return _Plan(keys, hit_rows, hit_positions, miss_keys, futures)

    def _assemble(self, plan: _Plan, rows: list[Any]) -> torch.Tensor:
        import torch

        keys, hit_positions = plan.keys, plan.hit_positions
        if not hit_positions and len(rows) == len(keys):
            return torch.stack(rows)  # the common case: every text new and distinct
        out = torch.empty((len(keys), self._dim), dtype=torch.float32, device=self._device)
        if hit_positions:
            out[torch.tensor(hit_positions, dtype=torch.long, device=self._device)] = plan.hit_rows
        if rows:
            computed = torch.stack(rows)
            where = {key: i for i, key in enumerate(plan.miss_keys)}
            hit_set = set(hit_positions)
            positions = [p for p in range(len(keys)) if p not in hit_set]
            source = [where[keys[p]] for p in positions]
            out[torch.tensor(positions, dtype=torch.long, device=self._device)] = computed[
                torch.tensor(source, dtype=torch.long, device=computed.device)
            ]
        return out

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Each text's token count as the model reads it: special tokens included, capped at
        :attr:`max_length` (longer texts are truncated). Loads the model.

        Raises:
            InputTypeError: ``texts`` is not a list of str.
        """
        texts = validate_texts(texts)
        self.load()
        if not texts:
            return []
        assert self._max_length is not None
        return [min(n, self._max_length) for n in self._count_tokens(texts)]

    def embed_tensor(self, texts: Sequence[str], *, priority: int = 0, show_progress: bool | None = None) -> torch.Tensor:
        """Embed ``texts`` and keep the result on the device.

        Args:
            texts: a list of str.
            priority: lower is served first when the queue is busy.
            show_progress: show a progress bar (default: the config's ``show_progress``).

        Returns:
            A float32 tensor of shape ``(len(texts), dim)`` on :attr:`device`.

        Raises:
            InputTypeError: ``texts`` is not a list of str (the message names the bad item).
            QueueFullError: too many texts are waiting.
        """
        texts = validate_texts(texts)
        priority = check_priority(priority)
        self.load()
        if not texts:
            import torch

            return torch.empty((0, self.dim), dtype=torch.float32, device=self._device)
        plan = self._prepare(texts, priority)
        futures = plan.futures
        progress = self.config.show_progress if show_progress is None else show_progress
        try:
            if progress and len(futures) > self.config.batch_size:
                from concurrent.futures import as_completed

                from tqdm.auto import tqdm

                with tqdm(total=len(futures), desc="Embedding", unit="text") as bar:
                    for future in as_completed(futures):
                        future.result()
                        bar.update(1)
            rows = [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        return self._assemble(plan, rows)

    def embed(self, texts: Sequence[str], *, priority: int = 0, show_progress: bool | None = None) -> np.ndarray:
        """Embed ``texts``; safe to call from many threads at once (calls are batched together).

        Args:
            texts: a list of str.
            priority: lower is served first when the queue is busy.
            show_progress: show a progress bar (default: the config's ``show_progress``).

        Returns:
            A float32 array of shape ``(len(texts), dim)``, L2-normalised when ``normalize``.

        Raises:
            InputTypeError: ``texts`` is not a list of str (the message names the bad item).
            QueueFullError: too many texts are waiting.
        """
        return self.embed_tensor(texts, priority=priority, show_progress=show_progress).cpu().numpy()

    async def aembed_tensor(self, texts: Sequence[str], *, priority: int = 0) -> torch.Tensor:
        """Async :meth:`embed_tensor`: never runs model code on the event loop thread.

        Cancelling the awaiting task drops its texts from the queue.
        """
        texts = validate_texts(texts)
        priority = check_priority(priority)
        await self.aload()
        if not texts:
            return await asyncio.to_thread(self.embed_tensor, [])
        if len(texts) > _ASYNC_INLINE_LIMIT:
            preparing = asyncio.ensure_future(asyncio.to_thread(self._prepare, texts, priority))
            try:
                plan = await asyncio.shield(preparing)
            except asyncio.CancelledError:
                # The thread finishes preparing anyway: cancel what it queued as soon as it is done.
                preparing.add_done_callback(_cancel_plan)
                raise
        else:
            plan = self._prepare(texts, priority)
        waiting = [asyncio.wrap_future(future) for future in plan.futures]
        try:
            rows = list(await asyncio.gather(*waiting))
        except BaseException:
            for future in waiting:
                future.cancel()
            raise
        if len(rows) > _ASYNC_INLINE_LIMIT:
            return await asyncio.to_thread(self._assemble, plan, rows)
        return self._assemble(plan, rows)

    async def aembed(self, texts: Sequence[str], *, priority: int = 0) -> np.ndarray:
        """Async :meth:`embed`: concurrent tasks are batched together; the loop is never blocked
        by model code. Cancelling the awaiting task drops its texts from the queue."""
        tensor = await self.aembed_tensor(texts, priority=priority)
        return tensor.cpu().numpy()

    def stats(self) -> EmbedderStats:
        """Return a snapshot of the counters."""
        from gpuprompt.batching import BatcherStats

        batcher = self._batcher.stats() if self._batcher is not None else BatcherStats(0, 0, 0.0, 0, 0.0, 0.0, 0, 0, 0, 0)
        with self._stats_lock:
            return EmbedderStats(
                texts=self._texts,
                cache_hits=self._hits,
                cache_misses=self._misses,
                deduplicated=self._dups,
                truncated=self._truncated,
                cache_entries=len(self._cache) if self._cache is not None else 0,
                cache_evictions=self._cache.evictions if self._cache is not None else 0,
                batcher=batcher,
            )

    def clear_cache(self) -> None:
        """Forget every cached embedding."""
        if self._cache is not None:
            self._cache.clear()

    def close(self) -> None:
        """Fail queued work with ``ClosedError`` and release the model."""
        with self._load_lock:
            self._closed = True
            batcher, self._batcher = self._batcher, None
            self._model = None
            forward, self._forward = self._forward, None
        if hasattr(forward, "close"):
            forward.close()
        if batcher is not None:
            batcher.close()


def _cancel_plan(preparing: asyncio.Future) -> None:
    if preparing.cancelled() or preparing.exception() is not None:
        return
    for future in preparing.result().futures:
        future.cancel()
