"""Search execution for VectorIndex: requests, the batch runner, the filter cache, exact search and ANN top-up.

A batch of queued requests is grouped by filter; each group is one backend search under the read lock.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt.batching import MicroBatcher
from gpuprompt.errors import ClosedError, InvalidInputError
from gpuprompt.index._checks import check_filter, check_k, check_matrix
from gpuprompt.index._fusion import Fusion, fuse
from gpuprompt.index._mmr import mmr_rerank
from gpuprompt.index._store import Allowed, Store, copy_json
from gpuprompt.index._types import Hit
from gpuprompt.index.filters import compile_filter

if TYPE_CHECKING:
    from gpuprompt.index._lexical import LexicalIndex

__all__ = ["FilterCache", "SearchRequest", "embed_deferred", "make_request", "request_cost", "run_batch",
           "search_batcher"]

_EXACT_SUBSET = 4096  # filters selecting at most this many rows are searched exactly over those rows
_FILTER_CACHE = 32


@dataclass
class SearchRequest:
    """One queued search (or MMR) call, validated.

    Attributes:
        queries: ``(q, dim)`` float32, a numpy array or a torch tensor.
        k: hits per query (for MMR: the candidates fetched).
        filter: the metadata filter, or None.
        key: the filter's canonical key (requests with equal keys share one filter evaluation).
        mmr: ``(k, lambda_mult)`` to return an MMR selection of the candidates, or None.
        texts: the query texts of a lexical or hybrid search (one per query row for hybrid).
        mode: ``"dense"``, ``"lexical"`` (``queries`` then has no rows) or ``"hybrid"``.
        fusion: how a hybrid search fuses its legs.
        embed: for a hybrid search whose texts the batch embeds (:func:`embed_deferred`), the
            function that embeds them; ``queries`` is filled in (and this cleared) before the search.
    """

    queries: Any
    k: int
    filter: Mapping[str, Any] | None
    key: str | None
    mmr: tuple[int, float] | None = None
    texts: list[str] | None = None
    mode: str = "dense"
    fusion: Fusion | None = None
    embed: Callable[[list[str]], Any] | None = None

    @property
    def dense_k(self) -> int:
        """Candidates the dense leg fetches for this request."""
        return self.fusion.fetch_k if self.fusion is not None else self.k


def make_request(
    queries: Any, k: Any, filter: Any, *, dim: int, metric: str, mmr: tuple[int, float] | None = None
) -> SearchRequest:
    """Check a search's arguments (see :meth:`VectorIndex.search`) and build its request."""
    k = check_k(k)
    matrix = check_matrix(queries, "queries", dim=dim, metric=metric, allow_1d=True)
    key = check_filter(filter)
    return SearchRequest(matrix, k, filter if key else None, key, mmr)


def request_cost(request: SearchRequest) -> int:
    """A request's share of a batch: its number of queries."""
    if request.texts is not None and (request.mode == "lexical" or request.embed is not None):
        return len(request.texts)
    return int(request.queries.shape[0])


def embed_deferred(requests: list[SearchRequest], *, dim: int, metric: str) -> list[BaseException | None]:
    """Embed the texts of the batch's hybrid searches that came with an embedding function instead of
    vectors: one call per distinct function, with the texts of all its searches (so concurrent hybrid
    searches are embedded in one batch, in the same queue as their search). Run before the read lock.

    Returns:
        Per request, None, or the error that fails it alone (the function raised, or returned a
        matrix of the wrong shape or values).
    """
    groups: dict[Any, list[int]] = {}
    for i, request in enumerate(requests):
        if request.embed is not None:
            try:
                key: Any = request.embed
                hash(key)
            except TypeError:
                key = id(request.embed)
            groups.setdefault(key, []).append(i)
    errors: list[BaseException | None] = [None] * len(requests)
    for members in groups.values():
        embed = requests[members[0]].embed
        assert embed is not None
        texts = [text for i in members for text in requests[i].texts or ()]
        try:
            matrix = check_matrix(embed(texts), "the embedded query texts", dim=dim, metric=metric, allow_1d=False)
            if int(matrix.shape[0]) != len(texts):
                raise InvalidInputError(
                    f"the embedding function of a hybrid search returned {int(matrix.shape[0])} vectors for "
                    f"{len(texts)} texts; it must return one row per text, in order."
                )
        except Exception as exc:  # noqa: BLE001 - it fails these searches, never the batch
            for i in members:
                errors[i] = exc
            continue
        start = 0
        for i in members:
            request = requests[i]
            stop = start + len(request.texts or ())
            request.queries, request.embed = matrix[start:stop], None
            start = stop
    return errors


def search_batcher(index: Any) -> MicroBatcher[SearchRequest, Any]:
    """The search queue of ``index``: its batches run :meth:`VectorIndex._run_batch`.

    The worker thread holds the index only weakly, so an index dropped without ``close()`` is
    still collected, and its worker stops with it.
    """
    ref = weakref.ref(index)

    def run(requests: list[SearchRequest]) -> list[Any]:
        target = ref()
        if target is None:
            raise ClosedError("the VectorIndex behind this search was garbage-collected.")
        return target._run_batch(requests)

    batcher: MicroBatcher[SearchRequest, Any] = MicroBatcher(
        run, name="index-search", cost=request_cost, max_batch_cost=4096, **index.config.batch_options
    )
    weakref.finalize(index, batcher.close, timeout=0)
    return batcher


class FilterCache:
    """The rows each filter selects, per store version (least recently used dropped past 32)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, Allowed] = OrderedDict()
        self._version = -1
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every entry (after a change the store's version does not show, such as a clear)."""
        with self._lock:
            self._entries.clear()

    def allowed(self, store: Store, key: str | None, filter: Mapping[str, Any] | None) -> Allowed | None:
        """The rows matching ``filter`` at the store's current version; None for no filter.

        The caller holds the index's read lock, so the store does not change meanwhile.
        """
        if key is None:
            return None
        with self._lock:
            if self._version != store.version:
                self._entries.clear()
                self._version = store.version
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                return cached
        predicate = compile_filter(filter)
        mask = np.fromiter((predicate(metadata) for metadata in store.metadatas), dtype=bool, count=store.size)
        allowed = Allowed(mask, np.flatnonzero(mask))
        with self._lock:
            if self._version == store.version:
                self._entries[key] = allowed
                while len(self._entries) > _FILTER_CACHE:
                    self._entries.popitem(last=False)
        return allowed


def run_batch(
    requests: list[SearchRequest], *, store: Store, backend: Any, filters: FilterCache, metric: str,
    lexical: LexicalIndex | None = None,
) -> list[list[list[Hit]]]:
    """Answer a batch: one backend search per distinct filter (the caller holds the read lock); the
    lexical leg of lexical and hybrid requests under the same filter rows, then their fusion.

    Returns:
        Per request, one list of hits per query (an MMR request: one list, its selection).
    """
    results: list[Any] = [None] * len(requests)
    groups: dict[str | None, list[int]] = {}
    for i, request in enumerate(requests):
        groups.setdefault(request.key, []).append(i)
    for key, members in groups.items():
        allowed = filters.allowed(store, key, requests[members[0]].filter)
        dense = [i for i in members if requests[i].mode != "lexical"]
        scores = rows = None
        if dense:
            queries = _stack([requests[i].queries for i in dense], backend)
            scores, rows = search_rows(queries, max(requests[i].dense_k for i in dense), allowed, store=store,
                                       backend=backend, metric=metric)
        start = 0
        for i in members:
            request = requests[i]
            if request.mode == "lexical":
                assert lexical is not None and request.texts is not None
                results[i] = [hits(store, *lexical.search(text, request.k, allowed, store.size))
                              for text in request.texts]
                continue
            assert scores is not None and rows is not None
            stop = start + request.queries.shape[0]
            if request.mode == "hybrid":
                results[i] = _hybrid(request, scores[start:stop], rows[start:stop], allowed, store, lexical)
            elif request.mmr is not None:
                # only this request's own fetch_k candidates: the batch's k may be another caller's
                picked = mmr_rerank(
                    request.queries[0],
                    scores[start, : request.k],
                    rows[start, : request.k],
                    store=store,
                    backend=backend,
                    k=request.mmr[0],
                    lambda_mult=request.mmr[1],
                )
                results[i] = [hits(store, *picked)]
            else:
                results[i] = [hits(store, scores[q, : request.k], rows[q, : request.k]) for q in range(start, stop)]
            start = stop
    return results


def _hybrid(request: SearchRequest, scores: np.ndarray, rows: np.ndarray, allowed: Allowed | None, store: Store,
            lexical: LexicalIndex | None) -> list[list[Hit]]:
    assert lexical is not None and request.texts is not None and request.fusion is not None
    fusion = request.fusion
    out = []
    for q, text in enumerate(request.texts):
        dense = None if fusion.alpha == 0.0 else (scores[q, : fusion.fetch_k], rows[q, : fusion.fetch_k])
        words = None if fusion.alpha == 1.0 else lexical.search(text, fusion.fetch_k, allowed, store.size)
        out.append(hits(store, *fuse(dense, words, fusion, request.k)))
    return out


def hits(store: Store, scores: np.ndarray, rows: np.ndarray) -> list[Hit]:
    """The :class:`Hit` of each found row (-1 rows skipped), metadata copied."""
    return [
        Hit(store.ids[row], float(score), store.documents[row], copy_json(store.metadatas[row]))
        for score, row in zip(scores.tolist(), rows.tolist())
        if row >= 0
    ]


def search_rows(
    queries: Any, k: int, allowed: Allowed | None, *, store: Store, backend: Any, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """Exactly ``min(k, allowed)`` results per query, as ``(scores, rows)`` (caller holds the read lock).

    Selective filters and untrained faiss indexes are searched exactly over the stored vectors; a
    query an ANN index answers short (graph or lists not reached) is topped up exactly.
    """
    from gpuprompt.index._faiss import FaissBackend

    q = queries.shape[0]
    want = min(k, store.size if allowed is None else allowed.count)
    if want == 0:
        return np.empty((q, 0), dtype=np.float32), np.empty((q, 0), dtype=np.int64)
    if not isinstance(backend, FaissBackend):
        return backend.search(queries, want, allowed)
    x = _numpy(queries)
    if not backend.is_trained or (allowed is not None and allowed.count <= max(_EXACT_SUBSET, want)):
        return exact(x, want, allowed, store=store, metric=metric)
    scores, rows = backend.search(x, want, allowed, store)
    short = np.flatnonzero((rows < 0).any(axis=1))
    if short.size:
        exact_scores, exact_rows = exact(x[short], want, allowed, store=store, metric=metric)
        scores[short], rows[short] = exact_scores, exact_rows
    return scores, rows


def exact(
    queries: np.ndarray, k: int, allowed: Allowed | None, *, store: Store, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """Exact search over the store's float32 master copy (all rows, or the allowed ones)."""
    import torch

    from gpuprompt.index._torch import exact_topk, l2_scores_from_keys, normalize_rows

    subset = store.vectors if allowed is None else store.vectors[allowed.rows]
    matrix = torch.from_numpy(np.ascontiguousarray(subset))
    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    norms = None
    with torch.inference_mode():
        if metric == "cosine":
            matrix = normalize_rows(matrix)
            q = normalize_rows(q)
        elif metric == "l2":
            norms = matrix.pow(2).sum(dim=1)
        keys, rows = exact_topk(q, matrix, k, l2_norms=norms)
        if metric == "l2":
            keys = l2_scores_from_keys(keys, q)
    rows_np = rows.numpy()
    if allowed is not None and rows_np.size:
        rows_np = np.where(rows_np >= 0, allowed.rows[np.maximum(rows_np, 0)], -1)
    return keys.numpy(), rows_np


def _numpy(queries: Any) -> np.ndarray:
    if isinstance(queries, np.ndarray):
        return queries
    return queries.detach().float().cpu().numpy()


def _stack(parts: list[Any], backend: Any) -> Any:
    """One query matrix of a group: numpy, or a tensor on the torch backend's device."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(part, np.ndarray) for part in parts):
        return np.concatenate(parts, axis=0)
    from gpuprompt.index._torch import TorchBackend

    if isinstance(backend, TorchBackend):
        import torch

        return torch.cat(
            [backend.queries(part) if isinstance(part, np.ndarray) else part.to(backend.device) for part in parts]
        )
    return np.concatenate([_numpy(part) for part in parts], axis=0)
