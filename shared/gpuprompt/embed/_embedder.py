"""Embedder: sentence-transformers behind the MicroBatcher, with a device-resident embedding cache.

Concurrent ``embed`` calls from many threads or tasks are coalesced into batched forward passes;
a text seen before (same model, same text) is served from the cache and never re-encoded. On CPU
``quantize="int8"`` swaps only the forward pass for an int8 one (:mod:`gpuprompt.embed._int8`),
behind a quality guard (:mod:`gpuprompt.embed._guard`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt._bf16 import pack_for_cpu_bf16
from gpuprompt._int8 import SlicedSession
from gpuprompt._loaded import LoadedModel, onnx_on_device_error
from gpuprompt._memory import HeapTrim
from gpuprompt._tokens import Encoded, Tokens, quick_on_loop
from gpuprompt.batching import MicroBatcher, check_priority
from gpuprompt.device import default_dtype, resolve_device
from gpuprompt.embed._cache import EmbeddingCache
from gpuprompt.embed._config import EmbedderConfig, EmbedderStats, validate_texts
from gpuprompt.embed._guard import QualityReport
from gpuprompt.errors import ClosedError, ConfigurationError, DependencyError, DeviceOutOfMemoryError, ModelLoadError
from gpuprompt.models import BUNDLED_EMBEDDING_MODEL, resolve_embedding_model
from gpuprompt.validation import check_bool, check_options

if TYPE_CHECKING:
    import torch

__all__ = ["Embedder"]

logger = logging.getLogger(__name__)

_ASYNC_INLINE_LIMIT = 64  # aembed prepares at most this many texts on the loop thread


def _inline(texts: list[str]) -> bool:
    """Whether the loop thread may prepare ``texts`` itself (quick: few, short texts)."""
    return quick_on_loop(len(texts), sum(map(len, texts)), _ASYNC_INLINE_LIMIT)


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


class Embedder(LoadedModel):
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

    _kind = "Embedder"

    def __init__(self, model: str | None = None, *, config: EmbedderConfig | None = None, **options: Any) -> None:
        if config is not None and (model is not None or options):
            raise ConfigurationError("pass either 'config' or individual options to Embedder, not both.")
        if config is None:
            check_options("Embedder", options, {f.name for f in dataclasses.fields(EmbedderConfig)} - {"model"},
                          remote="gpuprompt.connect(base_url).embedder() (a RemoteEmbedder)")
            config = EmbedderConfig(model=model, **options)
        self.config = config
        self._load_lock = threading.Lock()
        self._model: Any = None
        self._forward: Any = None
        self._quantization: str | None = None
        self._quality: QualityReport | None = None
        self._counter: Any = None
        self._counter_lock = threading.Lock()
        self._trim = HeapTrim()
        self._batcher: MicroBatcher[_Item, Any] | None = None
        self._cache: EmbeddingCache | None = None
        self._device: str | None = None
        self._dim: int | None = None
        self._max_length: int | None = None
        self._model_id = config.model or BUNDLED_EMBEDDING_MODEL
        self._stats_lock = threading.Lock()
        self._texts = self._hits = self._misses = self._dups = self._truncated = 0
        self._closed = False

    # ------------------------------------------------------------------ loading

    @property
    def dim(self) -> int:
        """Embedding dimension (loads the model)."""
        self.load()
        assert self._dim is not None
        return self._dim

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
            if pack_for_cpu_bf16(model, device, dtype):  # bf16 weights packed once for AMX, not per call
                dtype = f"{dtype}, packed"
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
                min_batch_size=self.config.min_batch_size,
                max_queue=self.config.max_queue,
                on_idle=self._trim,  # big batches' memory back to the OS once the queue runs dry
            )
            self._forward, self._quantization, self._quality = forward, quantization, quality
            self._backend = "onnx" if isinstance(forward, SlicedSession) else "torch"
            self._model = model
            logger.info("loaded embedder %s on %s (%s, %s, dim %d)", self._model_id, device, quantization or dtype,
                        self._backend, self._dim)
        return self

    def _choose_forward(self, model: Any, path: str, device: str) -> tuple[Any, str | None, QualityReport | None]:
        """The forward pass for ``config.quantize`` and ``config.backend``: ``(forward, quantization,
        guard report)``. int8 when asked and it loads and passes; else the fp32 ONNX export under
        ``backend="onnx"``; else the model's own forward."""
        if self.config.backend == "onnx" and device != "cpu":
            raise onnx_on_device_error(device)
        forward, quantization, report = self._int8_forward(model, path, device)
        if forward is None and self.config.backend == "onnx":
            from gpuprompt.embed._build import build_onnx
            from gpuprompt.embed._int8 import OnnxForward

            forward = OnnxForward(build_onnx(model, path, self._model_id), model, name="gpuprompt-onnx")
        return forward or self._full_forward, quantization, report

    def _int8_forward(self, model: Any, path: str, device: str) -> tuple[Any, str | None, QualityReport | None]:
        """``(int8 forward, "int8", report)`` for ``config.quantize``, or ``(None, None, report)`` for full precision."""
        asked = self.config.quantize
        if asked is None:
            return None, None, None
        if device != "cpu":
            if asked == "int8":  # device "auto" resolved to an accelerator
                raise ConfigurationError(
                    f"quantize='int8' runs on CPU only, and device 'auto' resolved to {device!r}; pass device='cpu' "
                    "for int8, or quantize='auto' to keep fp16 on the accelerator (already fast there)."
                )
            logger.info("quantize='auto' on %s: keeping %s (int8 is a CPU path)", device, default_dtype(device))
            return None, None, None
        from gpuprompt.embed._build import build_int8
        from gpuprompt.embed._guard import quality_error
        from gpuprompt.embed._int8 import OnnxForward

        try:
            onnx_path, report = build_int8(model, path, self._model_id)
        except (DependencyError, ModelLoadError) as exc:
            if asked == "int8":
                raise
            logger.warning("quantize='auto': using full precision for %s, int8 is unavailable: %s", self._model_id, exc)
            return None, None, None
        error = quality_error(report, self.config.quantize_guard, self._model_id)
        if error is not None:
            if asked == "int8":
                raise error
            logger.warning("quantize='auto': using full precision for %s, the int8 model failed the quality guard: %s",
                           self._model_id, "; ".join(error.failed) + f" ({report.summary()})")
            return None, None, report
        logger.info("int8 forward for %s passed the quality guard: %s", self._model_id, report.summary())
        return OnnxForward(onnx_path, model), "int8", report

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

        self._trim.add(sum(item.tokens for item in items))
        texts = [item.text for item in items]
        try:
            with torch.inference_mode():
                if all(item.encoded is not None and item.encoded.ids is not None for item in items):
                    features = self._counter.features([item.encoded for item in items])  # tokenised once
                else:
                    features = self._model.preprocess(texts)
                features = {k: v.to(self._device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
                out = self._forward(features).float()  # fp16 / bf16 compute: unit length in fp32
                if self.config.normalize:
                    out = torch.nn.functional.normalize(out, p=2, dim=1)
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

    def _count_tokens(self, texts: list[str], truncate: bool, *, wait: bool = True) -> list[int] | None:
        """Counts (capped at the max length with ``truncate``), or None when ``wait`` is False and
        another thread holds the tokenizer."""
        # The worker thread tokenises with the model's tokenizer; callers count with a private copy
        # (a fast tokenizer is not safe to share between threads that change its settings).
        if not self._counter_lock.acquire(blocking=wait):
            return None
        try:
            return self._counter.capped(texts) if truncate else self._counter.count(texts)
        finally:
            self._counter_lock.release()

    def _encode(self, texts: list[str], *, wait: bool = True) -> list[Encoded] | None:
        if not self._counter_lock.acquire(blocking=wait):
            return None
        try:
            return self._counter.encode(texts)
        finally:
            self._counter_lock.release()

    def _prepare(self, texts: list[str], priority: int, *, wait: bool = True) -> _Plan | None:
        """Look ``texts`` up in the cache and queue the rest; None (nothing queued) when ``wait`` is
        False and another thread holds the tokenizer."""
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
            encoded = self._encode(miss_texts, wait=wait)
            if encoded is None:
                return None
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

    def count_tokens(self, texts: Sequence[str], *, truncate: bool = True) -> list[int]:
        """Each text's token count: special tokens included, capped at :attr:`max_length` as the
        model reads it (longer texts are truncated), or the whole text's with ``truncate=False``
        (for budgets of text that is not embedded, such as a prompt). Loads the model.

        Raises:
            InputTypeError: ``texts`` is not a list of str, or ``truncate`` not a bool.
        """
        texts = validate_texts(texts)
        check_bool(truncate, "truncate")
        self.load()
        if not texts:
            return []
        counts = self._count_tokens(texts, truncate)
        assert counts is not None
        return counts

    async def acount_tokens(self, texts: Sequence[str], *, truncate: bool = True) -> list[int]:
        """Async :meth:`count_tokens`: counts on the loop thread only when that is quick (a few
        short texts, the tokenizer free), else on a worker thread.

        Raises:
            InputTypeError: ``texts`` is not a list of str.
        """
        texts = validate_texts(texts)
        check_bool(truncate, "truncate")
        await self.aload()
        if not texts:
            return []
        if _inline(texts):
            counts = self._count_tokens(texts, truncate, wait=False)
            if counts is not None:
                return counts
        return await asyncio.to_thread(self.count_tokens, texts, truncate=truncate)

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
        assert plan is not None  # waits for the tokenizer
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
        # On the loop only when quick: few short texts, and no other thread tokenising (waiting
        # for it would stall every request on the loop).
        plan = self._prepare(texts, priority, wait=False) if _inline(texts) else None
        if plan is None:
            preparing = asyncio.ensure_future(asyncio.to_thread(self._prepare, texts, priority))
            try:
                plan = await asyncio.shield(preparing)
            except asyncio.CancelledError:
                # The thread finishes preparing anyway: cancel what it queued as soon as it is done.
                preparing.add_done_callback(_cancel_plan)
                raise
            assert plan is not None
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
