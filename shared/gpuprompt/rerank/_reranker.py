"""Reranker: a cross-encoder behind the MicroBatcher, with a bounded score cache.

The (query, document) pairs of concurrent ``rerank`` calls, from any threads or tasks, are
coalesced into shared batches; inside a batch the pairs are sorted by length and cut into forward
passes within a padded-token budget, so short pairs are never padded to a long one. A pair scored
before (same model, query and document) is served from the cache. Scores equal sentence-transformers
``CrossEncoder.predict`` on the same model with its defaults (tokenisation, truncation, activation).
On CPU ``quantize="int8"`` swaps the forward pass for an int8 one (:mod:`gpuprompt.rerank._int8`),
behind a guard on ranking agreement with fp32.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprompt._bf16 import pack_for_cpu_bf16
from gpuprompt._int8 import SlicedSession
from gpuprompt._loaded import LoadedModel, onnx_on_device_error
from gpuprompt._memory import HeapTrim
from gpuprompt._tokens import Tokens, quick_on_loop
from gpuprompt.batching import MicroBatcher, check_priority
from gpuprompt.device import default_dtype, resolve_device
from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    DependencyError,
    DeviceOutOfMemoryError,
    InputTypeError,
    InvalidInputError,
    ModelLoadError,
    describe,
)
from gpuprompt.models import DEFAULT_RERANK_MODEL, resolve_rerank_model
from gpuprompt.rerank._config import RerankerConfig
from gpuprompt.rerank._types import RerankerStats, RerankHit
from gpuprompt.validation import check_int, check_options, check_str, check_str_list

if TYPE_CHECKING:
    from gpuprompt.rerank._int8 import RankingReport

__all__ = ["Reranker", "check_documents", "check_top_n"]

logger = logging.getLogger(__name__)

_ASYNC_INLINE_LIMIT = 32  # arerank tokenises at most this many pairs on the loop thread
_SANE_MAX_LENGTH = 100_000  # tokenizers without a limit report 1e30
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet", "data2vec-text", "ibert")
"""Model types whose position ids start past the padding index (two of their positions hold no token)."""


@dataclass
class _Pair:
    query: str
    document: str
    key: bytes
    features: dict[str, list[int]] | None = None
    tokens: int = 0


def check_top_n(top_n: Any, *, error: type[Exception] = InvalidInputError) -> int | None:
    """``top_n`` as None or an int >= 1 (bools, floats and numeric strings refused).

    Args:
        error: the exception raised (a setting of an adapter raises ``ConfigurationError``).

    Raises:
        InvalidInputError (or ``error``): anything else.
    """
    if top_n is None:
        return None
    return int(check_int(top_n, "top_n", min=1, error=error))  # type: ignore[arg-type]


def check_documents(documents: Any, limit: int | None = None) -> list[str]:
    """``documents`` as a list of well-formed str (at most ``limit``).

    Raises:
        InputTypeError: a bare str, a non-list, or an item that is not a str (named by index).
        InvalidInputError: an item with a lone surrogate, or more than ``limit`` documents.
    """
    if isinstance(documents, (str, bytes)):
        raise InputTypeError(
            f"'documents' must be a list of str, got a bare {type(documents).__name__}; wrap it in a list: [text]."
        )
    if not isinstance(documents, Sequence):
        raise InputTypeError(f"'documents' must be a list of str (got {describe(documents)}).")
    documents = check_str_list(list(documents), "documents")
    if limit is not None and len(documents) > limit:
        raise InvalidInputError(
            f"'documents' must hold at most {limit} documents per call (got {len(documents)}); split the call, "
            "or raise RerankerConfig.max_documents."
        )
    return documents


class Reranker(LoadedModel):
    """Batched, cached cross-encoder reranking on the best device.

    Nothing is loaded until the first call (or :meth:`load`). Use
    ``gpuprompt.connect().reranker(model)`` to share one instance (and one batch queue) per
    process, as the LangChain and LlamaIndex rerankers do.

    Example:
        >>> from gpuprompt import Reranker
        >>> reranker = Reranker("cross-encoder/ms-marco-MiniLM-L-6-v2")   # or a local folder
        >>> reranker.rerank("Will the red dress shrink?",
        ...                 ["Aurora dress: red cotton, shrinks 3% at 40 C.", "Blue jeans, size 32."], top_n=1)
        [RerankHit(index=0, score=7.1234, document='Aurora dress: red cotton, shrinks 3...')]
        >>> reranker.score([("red dress", "Aurora dress: red cotton")])
        [6.5...]

    Args:
        model: a local folder or hub id of a Hugging Face sequence-classification model (a
            cross-encoder), or None for :data:`gpuprompt.models.DEFAULT_RERANK_MODEL`.
        config: a full :class:`RerankerConfig` (then pass no other option).
        **options: the other :class:`RerankerConfig` fields (``device``, ``max_length``, ...).
    """

    _kind = "Reranker"

    def __init__(self, model: str | None = None, *, config: RerankerConfig | None = None, **options: Any) -> None:
        if config is not None and (model is not None or options):
            raise ConfigurationError("pass either 'config' or individual options to Reranker, not both.")
        if config is None:
            check_options("Reranker", options, RerankerConfig.option_names(),
                          remote="gpuprompt.connect(base_url).reranker() (a RemoteReranker)")
            config = RerankerConfig(model=model, **options)
        self.config = config
        self._model_id = config.model or DEFAULT_RERANK_MODEL
        self._load_lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._bounds: Any = None  # a Tokens: reads very long texts from a prefix
        self._trim = HeapTrim()
        self._forward: Any = None
        self._activation: str = "identity"
        self._quantization: str | None = None
        self._quality: RankingReport | None = None
        self._device: str | None = None
        self._max_length: int | None = None
        self._batcher: MicroBatcher[_Pair, Any] | None = None
        self._cache: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()
        self._pairs = self._cache_hits = self._scored = self._truncated = 0
        self._closed = False

    # ------------------------------------------------------------------ properties

    @property
    def max_length(self) -> int:
        """Most tokens of a pair; longer pairs are truncated (loads the model)."""
        self.load()
        assert self._max_length is not None
        return self._max_length

    @property
    def activation(self) -> str:
        """How logits become scores: ``"sigmoid"`` or ``"identity"`` (loads the model)."""
        self.load()
        return self._activation

    @property
    def identity(self) -> str:
        """Which scorer produces these scores: the model id, plus ``;int8`` when quantised."""
        self.load()
        return self._model_id + (f";{self._quantization}" if self._quantization else "")

    # ------------------------------------------------------------------ loading
    def load(self) -> Reranker:
        """Load the model now (otherwise the first call does). Idempotent and thread-safe.

        Raises:
            ModelLoadError: the model cannot be found or is not a sequence-classification model.
            DependencyError: torch or transformers is missing.
            QualityError: ``quantize="int8"`` and the int8 model fell under its guard.
        """
        if self._model is not None:
            return self
        with self._load_lock:
            if self._closed:
                raise ClosedError("this Reranker was closed; create a new one.")
            if self._model is not None:
                return self
            try:
                import torch
                from transformers import AutoModelForSequenceClassification, AutoTokenizer
            except ImportError as exc:
                raise DependencyError("Reranker needs torch and transformers: pip install transformers torch") from exc
            device = resolve_device(self.config.device)
            path = resolve_rerank_model(self.config.model)
            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
                model = AutoModelForSequenceClassification.from_pretrained(path)
            except Exception as exc:
                raise ModelLoadError(
                    f"could not load rerank model {self._model_id!r} from {path!r}: {exc}. Pass a local folder of a "
                    "Hugging Face sequence-classification model (a cross-encoder saved with save_pretrained), or a hub "
                    "id available offline in the HF cache."
                ) from exc
            labels = int(getattr(model.config, "num_labels", 1))
            if labels != 1:
                raise ModelLoadError(
                    f"rerank model {self._model_id!r} has {labels} labels; a reranker needs a cross-encoder with one "
                    "relevance score (num_labels=1), such as cross-encoder/ms-marco-MiniLM-L-6-v2."
                )
            dtype = self.config.dtype or default_dtype(device)
            model.to(device=device, dtype=getattr(torch, dtype))
            model.eval()
            if pack_for_cpu_bf16(model, device, dtype):  # bf16 weights packed once for AMX, not per call
                dtype = f"{dtype}, packed"
            self._activation = _activation(self.config.activation, model.config, path)
            self._max_length = _max_length(self.config.max_length, tokenizer, model.config)
            self._tokenizer, self._device = tokenizer, device
            self._bounds = Tokens(tokenizer, self._max_length)
            self._forward, self._quantization, self._quality = self._choose_forward(model, tokenizer, path, device)
            self._backend = "onnx" if isinstance(self._forward, SlicedSession) else "torch"
            self._batcher = MicroBatcher(
                self._run_batch,
                name=f"rerank:{self._model_id.rsplit('/', 1)[-1]}",
                max_batch_size=self.config.batch_size,
                max_batch_cost=self.config.max_batch_tokens,
                cost=lambda pair: pair.tokens,
                max_wait_ms=self.config.max_wait_ms,
                min_batch_size=self.config.min_batch_size,
                max_queue=self.config.max_queue,
                on_idle=self._trim,  # big batches' memory back to the OS once the queue runs dry
            )
            self._model = model
            logger.info("loaded reranker %s on %s (%s, %s, max length %d, %s)", self._model_id, device,
                        self._quantization or dtype, self._backend, self._max_length, self._activation)
        return self

    async def aload(self) -> Reranker:
        """Async :meth:`load`: loads on a worker thread, never on the caller's event loop."""
        if self._model is None:
            await asyncio.to_thread(self.load)
        return self

    def _choose_forward(self, model: Any, tokenizer: Any, path: str, device: str) -> tuple[Any, str | None, Any]:
        """The forward pass for ``config.quantize`` and ``config.backend``: ``(forward, quantization,
        guard report)``. int8 when asked and it loads and passes; else the fp32 ONNX export under
        ``backend="onnx"``; else the model's own forward."""
        if self.config.backend == "onnx" and device != "cpu":
            raise onnx_on_device_error(device)
        forward, quantization, report = self._int8_forward(model, tokenizer, path, device)
        if forward is None and self.config.backend == "onnx":
            from gpuprompt.rerank._int8 import OnnxScorer, build_onnx

            onnx_path = build_onnx(model, tokenizer, path, self._model_id, max_length=self._max_length or 512)
            forward = OnnxScorer(onnx_path, name="gpuprompt-rerank-onnx")
        return forward or self._full_forward, quantization, report

    def _int8_forward(self, model: Any, tokenizer: Any, path: str, device: str) -> tuple[Any, str | None, Any]:
        """``(int8 forward, "int8", report)`` for ``config.quantize``, or ``(None, None, report)`` for full precision."""
        asked = self.config.quantize
        if asked is None:
            return None, None, None
        if device != "cpu":
            if asked == "int8":
                raise ConfigurationError(
                    f"quantize='int8' runs on CPU only, and device 'auto' resolved to {device!r}; pass device='cpu' "
                    "for int8, or quantize='auto' to keep fp16 on the accelerator."
                )
            return None, None, None
        from gpuprompt.rerank._int8 import OnnxScorer, build_int8, guard_error

        try:
            onnx_path, report = build_int8(model, tokenizer, path, self._model_id, self._activation,
                                           max_length=self._max_length or 512)
        except (DependencyError, ModelLoadError) as exc:
            if asked == "int8":
                raise
            logger.warning("quantize='auto': using full precision for %s, int8 is unavailable: %s", self._model_id, exc)
            return None, None, None
        error = guard_error(report, self.config.quantize_guard, self._model_id)
        if error is not None:
            if asked == "int8":
                raise error
            logger.warning("quantize='auto': using full precision for %s, the int8 model failed its guard: %s",
                           self._model_id, "; ".join(error.failed))
            return None, None, report
        logger.info("int8 reranker for %s passed its guard: %s", self._model_id, report.summary())
        return OnnxScorer(onnx_path), "int8", report

    def _full_forward(self, features: dict[str, Any]) -> Any:
        return self._model(**features).logits

    # ------------------------------------------------------------------ the batch function
    def _run_batch(self, pairs: list[_Pair]) -> list[Any]:
        """Score a batch: sorted by length, cut into passes within the padded-token budget."""
        import torch

        self._trim.add(sum(pair.tokens for pair in pairs))
        order = sorted(range(len(pairs)), key=lambda i: pairs[i].tokens)
        out: list[Any] = [None] * len(pairs)
        budget = self.config.max_batch_tokens
        start = 0
        try:
            while start < len(order):
                stop = start + 1
                # Sorted ascending: the pass's width is its last (longest) pair.
                while stop < len(order) and (stop + 1 - start) * pairs[order[stop]].tokens <= budget:
                    stop += 1
                chunk = [pairs[i] for i in order[start:stop]]
                scores = self._score_pass(chunk)
                for i, score in zip(order[start:stop], scores, strict=True):
                    out[i] = score
                start = stop
        except torch.cuda.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            raise DeviceOutOfMemoryError(
                f"out of device memory scoring {len(pairs)} pairs; lower batch_size or max_batch_tokens."
            ) from exc
        with self._lock:
            self._scored += len(pairs)
            if self.config.cache_size:
                for pair, score in zip(pairs, out, strict=True):
                    self._remember(pair.key, score)
        return out

    def _score_pass(self, chunk: list[_Pair]) -> list[float]:
        import torch

        assert all(pair.features is not None for pair in chunk)
        padded = self._tokenizer.pad([pair.features for pair in chunk], padding=True, return_tensors="pt")
        with torch.inference_mode():
            if self._quantization is None:
                padded = {k: v.to(self._device) for k, v in padded.items()}
            logits = self._forward(dict(padded))
            logits = torch.as_tensor(logits).float()
            if self._activation == "sigmoid":
                logits = torch.sigmoid(logits)
            scores = logits[:, 0] if logits.ndim > 1 else logits
        return [float(s) for s in scores.cpu().tolist()]

    def _remember(self, key: bytes, score: float) -> None:
        cache = self._cache
        cache[key] = score
        cache.move_to_end(key)
        while len(cache) > self.config.cache_size:
            cache.popitem(last=False)

    # ------------------------------------------------------------------ preparation
    def _key(self, query: str, document: str) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        digest.update(self.identity.encode())
        for text in (query, document):
            digest.update(b"\0")
            digest.update(text.encode("utf-8", "surrogatepass"))
        return digest.digest()

    def _prepare(self, pairs: list[tuple[str, str]]) -> tuple[list[bytes], dict[bytes, float], list[_Pair]]:
        """Split pairs into cached scores and new pairs (tokenised once, on the caller's thread)."""
        keys = [self._key(q, d) for q, d in pairs]
        known: dict[bytes, float] = {}
        todo: dict[bytes, _Pair] = {}
        with self._lock:
            self._pairs += len(pairs)
            for key, (query, document) in zip(keys, pairs, strict=True):
                if key in known or key in todo:
                    continue
                score = self._cache.get(key) if self.config.cache_size else None
                if score is not None:
                    self._cache.move_to_end(key)
                    known[key] = score
                    self._cache_hits += 1
                else:
                    todo[key] = _Pair(query, document, key)
        fresh = list(todo.values())
        if fresh:
            assert self._max_length is not None
            texts = self._bounds.bounded_pairs([(p.query, p.document) for p in fresh])  # long texts: a prefix
            encoded = self._tokenizer([q for q, _ in texts], [d for _, d in texts], truncation="longest_first",
                                      max_length=self._max_length)
            names = list(encoded.keys())
            for i, pair in enumerate(fresh):
                pair.features = {name: encoded[name][i] for name in names}
                pair.tokens = len(pair.features["input_ids"])
            truncated = sum(1 for p in fresh if p.tokens >= self._max_length)
            if truncated:
                with self._lock:
                    self._truncated += truncated
        return keys, known, fresh

    def _submit(self, fresh: list[_Pair], priority: int) -> list[Future]:
        if self._closed:
            raise ClosedError("this Reranker was closed; create a new one.")
        assert self._batcher is not None
        return self._batcher.submit_many(fresh, priority=priority) if fresh else []

    @staticmethod
    def _check_pairs(pairs: Any) -> list[tuple[str, str]]:
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
            raise InputTypeError(f"'pairs' must be a list of (query, document) str pairs (got {describe(pairs)}).")
        out = []
        for i, pair in enumerate(pairs):
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise InputTypeError(f"'pairs[{i}]' must be a (query, document) pair of str (got {describe(pair)}).")
            query = check_str(pair[0], f"pairs[{i}][0]")
            document = check_str(pair[1], f"pairs[{i}][1]")
            assert query is not None and document is not None
            out.append((query, document))
        return out

    def _limit(self, n: int, name: str) -> None:
        if n > self.config.max_documents:
            raise InvalidInputError(
                f"'{name}' must hold at most {self.config.max_documents} items per call (got {n}); split the call, "
                "or raise RerankerConfig.max_documents."
            )

    # ------------------------------------------------------------------ public API
    def score(self, pairs: Sequence[tuple[str, str]], *, priority: int = 0) -> list[float]:
        """The cross-encoder's score of each (query, document) pair, in order.

        Raises:
            InputTypeError, InvalidInputError: a malformed pair (named by index), too many pairs.
            QueueFullError: the queue holds ``max_queue`` pairs already.
        """
        checked = self._check_pairs(pairs)
        self._limit(len(checked), "pairs")
        priority = check_priority(priority)
        if not checked:
            return []
        self.load()
        keys, known, fresh = self._prepare(checked)
        futures = self._submit(fresh, priority)
        try:
            for pair, future in zip(fresh, futures, strict=True):
                known[pair.key] = future.result()
        finally:
            for future in futures:
                future.cancel()
        return [known[key] for key in keys]

    async def ascore(self, pairs: Sequence[tuple[str, str]], *, priority: int = 0) -> list[float]:
        """Async :meth:`score`: batched with every other caller; the loop never runs the model.
        Cancelling the caller drops its pairs from the queue."""
        checked = self._check_pairs(pairs)
        self._limit(len(checked), "pairs")
        priority = check_priority(priority)
        if not checked:
            return []
        await self.aload()
        if _inline(checked):
            keys, known, fresh = self._prepare(checked)
        else:
            keys, known, fresh = await asyncio.to_thread(self._prepare, checked)
        futures = [asyncio.wrap_future(f) for f in self._submit(fresh, priority)]
        try:
            scores = await asyncio.gather(*futures)
        finally:
            for future in futures:
                future.cancel()
        for pair, score in zip(fresh, scores, strict=True):
            known[pair.key] = score
        return [known[key] for key in keys]

    def _check_call(self, query: Any, documents: Any, top_n: Any) -> tuple[str, list[str], int | None]:
        checked = check_str(query, "query")
        assert checked is not None
        return checked, check_documents(documents, self.config.max_documents), check_top_n(top_n)

    @staticmethod
    def _hits(documents: list[str], scores: list[float], top_n: int | None) -> list[RerankHit]:
        order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
        if top_n is not None:
            order = order[:top_n]
        return [RerankHit(i, scores[i], documents[i]) for i in order]

    def rerank(self, query: str, documents: Sequence[str], top_n: int | None = None, *,
               priority: int = 0) -> list[RerankHit]:
        """The documents ordered by the cross-encoder's relevance to ``query``, best first.

        A document longer than :attr:`max_length` (with the query) is truncated, as
        ``CrossEncoder`` does, never refused. Ties keep the documents' order.

        Args:
            query: the query text.
            documents: the texts to rank (none gives ``[]``).
            top_n: keep only the best ``top_n``; None keeps them all.
            priority: lower runs first under load.

        Returns:
            One :class:`RerankHit` per kept document: its ``index`` in ``documents``, ``score``
            and ``document``.

        Raises:
            InputTypeError: ``query`` is not a str, ``documents`` not a list of str (the bad item
                named), or ``top_n`` not an int.
            InvalidInputError: a text with a lone surrogate, ``top_n`` < 1, or more documents
                than ``max_documents``.
        """
        query, documents, top_n = self._check_call(query, documents, top_n)
        if not documents:
            return []
        return self._hits(documents, self.score([(query, d) for d in documents], priority=priority), top_n)

    async def arerank(self, query: str, documents: Sequence[str], top_n: int | None = None, *,
                      priority: int = 0) -> list[RerankHit]:
        """Async :meth:`rerank`: batched with every concurrent caller, never blocks the event loop."""
        query, documents, top_n = self._check_call(query, documents, top_n)
        if not documents:
            return []
        scores = await self.ascore([(query, d) for d in documents], priority=priority)
        return self._hits(documents, scores, top_n)

    def count_tokens(self, pairs: Sequence[tuple[str, str]]) -> int:
        """Tokens of the pairs as the model reads them (truncated to :attr:`max_length`). Loads the model."""
        checked = self._check_pairs(pairs)
        if not checked:
            return 0
        self.load()
        checked = self._bounds.bounded_pairs(checked)
        encoded = self._tokenizer([q for q, _ in checked], [d for _, d in checked], truncation="longest_first",
                                  max_length=self._max_length)
        return sum(len(ids) for ids in encoded["input_ids"])

    async def acount_tokens(self, pairs: Sequence[tuple[str, str]]) -> int:
        """Async :meth:`count_tokens`: on the loop thread only for a few short pairs, else on a worker thread."""
        checked = self._check_pairs(pairs)
        await self.aload()
        return self.count_tokens(checked) if _inline(checked) else await asyncio.to_thread(self.count_tokens, checked)

    def stats(self) -> RerankerStats:
        """The reranker's counters."""
        with self._lock:
            return RerankerStats(pairs=self._pairs, cache_hits=self._cache_hits, scored=self._scored,
                                 truncated=self._truncated, cache_entries=len(self._cache),
                                 batcher=self._batcher.stats() if self._batcher is not None else None)

    def clear_cache(self) -> None:
        """Forget every cached score."""
        with self._lock:
            self._cache.clear()

    def close(self) -> None:
        """Stop the batch queue (pending pairs get ``ClosedError``) and release the model. Safe twice."""
        with self._load_lock:
            self._closed = True
            batcher, self._batcher = self._batcher, None
            forward = self._forward
        if batcher is not None:
            batcher.close()
        if hasattr(forward, "close"):
            forward.close()


def _inline(pairs: list[tuple[str, str]]) -> bool:
    """Whether the loop thread may tokenise ``pairs`` itself (quick: few, short pairs)."""
    return quick_on_loop(len(pairs), sum(len(q) + len(d) for q, d in pairs), _ASYNC_INLINE_LIMIT)


def _activation(asked: str, config: Any, path: str | None = None) -> str:
    """``"sigmoid"`` or ``"identity"``: as asked, or the model's own, as ``CrossEncoder`` picks it:
    the ``activation_fn`` that sentence-transformers 4+ saves in ``config_sentence_transformers.json``,
    else the one in ``config.json`` (``sentence_transformers.activation_fn``, or before 4.0
    ``sbert_ce_default_activation_function``), else sigmoid for one label."""
    if asked != "auto":
        return asked
    saved = _saved_activation(path) or (getattr(config, "sentence_transformers", None) or {}).get("activation_fn") \
        or getattr(config, "sbert_ce_default_activation_function", None)
    if isinstance(saved, str):
        name = saved.rsplit(".", 1)[-1]
        if name == "Identity":
            return "identity"
        if name == "Sigmoid":
            return "sigmoid"
        logger.warning("the reranker's config names activation %r, which gpuprompt does not run; using the "
                       "default for its labels", saved)
    return "sigmoid" if int(getattr(config, "num_labels", 1)) == 1 else "identity"


def _saved_activation(path: str | None) -> str | None:
    """The ``activation_fn`` of a model folder's ``config_sentence_transformers.json``, if any."""
    if path is None:
        return None
    try:
        saved = json.loads((Path(path) / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = saved.get("activation_fn") if isinstance(saved, dict) else None
    return value if isinstance(value, str) else None


def _max_length(asked: int | None, tokenizer: Any, config: Any) -> int:
    if asked is not None:
        positions = _positions(config)
        if positions is not None and asked > positions:
            raise ConfigurationError(
                f"max_length={asked} is more than this model reads: its position embeddings hold {positions} tokens "
                f"(config.json, max_position_embeddings); pass max_length <= {positions}, or leave it unset for the "
                "model's own limit."
            )
        return asked
    limit = getattr(tokenizer, "model_max_length", None)
    if not isinstance(limit, int) or limit > _SANE_MAX_LENGTH:
        limit = getattr(config, "max_position_embeddings", None) or 512
    return int(limit)


def _positions(config: Any) -> int | None:
    """Tokens the model's position embeddings hold, or None where it has no absolute positions."""
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int) or getattr(config, "position_embedding_type", "absolute") != "absolute":
        return None
    return positions - 2 if getattr(config, "model_type", "") in _OFFSET_POSITIONS else positions
