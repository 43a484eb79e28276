"""RemoteIndex: the :class:`~gpuprompt.index.IndexLike` protocol over a collection of a running
``gpuprompt serve`` (its ``/v1/collections/{name}/records`` routes), so the vector stores and
RAGPipeline run unchanged against the server's index. No torch, no model in this process.

Checks, filters and MMR arguments are the core's own (``index._checks``, ``filters``, ``_mmr``),
run here before any request; concurrent searches are coalesced by one
:class:`~gpuprompt.batching.MicroBatcher` into one HTTP request, which the server's index batches
again with every other client's.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt.batching import BatcherStats, MicroBatcher
from gpuprompt.bridge import off_loop
from gpuprompt.embed import validate_texts
from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    EmbedderMismatchError,
    EngineError,
    InvalidInputError,
)
from gpuprompt.index._checks import check_filter, check_id_list, check_k, check_upsert
from gpuprompt.index._config import MAX_DIM, check_embedder_args
from gpuprompt.index._fusion import DEFAULT_RRF_K
from gpuprompt.index._groups import GroupSearchMixin
from gpuprompt.index._hybrid import HybridSearchMixin
from gpuprompt.index._mmr import check_mmr, check_one_query
from gpuprompt.index._search import SearchRequest, make_request
from gpuprompt.index._types import Hit, IndexStats, Record
from gpuprompt.remote._client import SERVICE, RemoteClient, client_for
from gpuprompt.remote._config import RemoteConfig
from gpuprompt.remote._index_wire import (
    BODY_BUDGET,
    TextSearch,
    _batcher,
    _chunks,
    _hit,
    _ids,
    _object,
    _records,
    _search_body,
    _size,
    _upsert_bodies,
)
from gpuprompt.validation import check_choice, check_int, check_number, check_str, fail
from gpuprompt.wire import COLLECTION_NAME_PATTERN, MAX_IDS_PER_REQUEST, collection_path, redact

__all__ = ["COLLECTION_NAME_PATTERN", "RemoteIndex"]

METRICS = ("cosine", "ip", "l2")
_GET_CHUNK = 1024  # ids per get request: an answer carries every vector (about 2 KiB each at 384 dims)
_ASYNC_INLINE = 1 << 16  # numbers validated on the loop thread; more are checked in a worker thread
_EMPTY_STATS = BatcherStats(0, 0, 0.0, 0, 0.0, 0.0, 0, 0, 0, 0)


@dataclass(frozen=True)
class _Served:
    """What the server said about the collection at first use."""

    dim: int
    metric: str
    expected_embedder: str
    """The collection's recorded embedder, else the served one (that a new collection belongs to)."""


class RemoteIndex(GroupSearchMixin, HybridSearchMixin):
    """:class:`~gpuprompt.VectorIndex`'s API over a collection of a running ``gpuprompt serve``.

    ``add`` is an upsert; ``delete``, ``get``, ``ids``, ``search`` (many queries per call),
    ``mmr``, ``search_groups``, ``count`` / ``len``, ``clear`` and ``close`` behave as on
    VectorIndex, with the same checks and typed errors raised here before any request, and every
    operation has its async twin (``aadd``, ``adelete``, ``aget``, ``aids``, ``asearch``,
    ``ammr``, ``asearch_groups``, ``aclear``, ``acount``, ``asave``) that never blocks the event
    loop. Concurrent searches and MMR calls of this process are coalesced into one HTTP request.

    The collection lives on the server: a first ``add`` creates it (within the server's
    ``max_collections``), with the dimension of the server's embedder and the cosine metric, and
    its records count against ``max_collection_records`` (409, raised as ``InvalidInputError``).
    Under ``gpuprompt serve --data-dir`` every acknowledged write is durable. An absent
    collection reads as empty. A collection belongs to the server's embedder: vectors that an
    ``add`` says another embedder made are refused (``EmbedderMismatchError``) unless
    ``allow_other_embedder=True``, as an in-process index refuses them once it recorded one.

    Differences from VectorIndex: ``clear`` drops the server collection (its records, embedder
    record and collection chat sessions; the next ``add`` creates it again); ``save`` writes a
    local VectorIndex snapshot of the records (a copy, which ``load_index`` reopens in process);
    an ``add`` too large for one request is sent in several (a failure midway leaves the earlier
    ones stored, and retrying it is safe: ids are fixed before sending); ``close`` stops this
    object only (the shared connection pool stays open).

    Example:
        >>> import numpy as np
        >>> from gpuprompt.remote import RemoteIndex
        >>> index = RemoteIndex("http://127.0.0.1:8000", collection="kb")
        >>> index.add(["a"], np.ones((1, 384)), documents=["apple"], metadatas=[{"kind": "fruit"}])
        ['a']
        >>> index.search(np.ones((1, 384)), k=1, filter={"kind": "fruit"})
        [[Hit(id='a', score=1.0000, document='apple')]]

    Args:
        base_url: the server (``http://host:port``), or a :class:`RemoteConfig`; None reads
            ``GPUPROMPT_URL`` (and ``GPUPROMPT_API_KEY``).
        api_key: the server's API key (``gpuprompt serve --api-key``).
        collection: the server collection (1-64 letters, digits, ``.``, ``_`` or ``-``).
        dim: the dimension expected (None: the server's); another than the collection's raises
            ``ConfigurationError`` at first use.
        metric: the metric expected; another than the collection's (``"cosine"``) raises
            ``ConfigurationError`` at first use.
        client: a :class:`RemoteClient` to use instead of the process's shared one.
        max_batch_size: most searches coalesced into one request.
        max_wait_ms: longest a search waits for others to join its request while one is in flight.
        max_queue: most searches waiting; more raise ``QueueFullError``.
        **options: other :class:`RemoteConfig` fields (``connect_timeout``, ``read_timeout``,
            ``max_retries``, ...).

    Raises:
        ConfigurationError: a malformed option, or no server (no ``base_url``, no ``GPUPROMPT_URL``).
    """

    def __init__(
        self,
        base_url: str | RemoteConfig | None = None,
        api_key: str | None = None,
        *,
        collection: str,
        dim: int | None = None,
        metric: str = "cosine",
        client: RemoteClient | None = None,
        max_batch_size: int = 64,
        max_wait_ms: float = 2.0,
        max_queue: int = 10_000,
        **options: Any,
    ) -> None:
        check_str(collection, "collection", error=ConfigurationError)
        if not re.match(COLLECTION_NAME_PATTERN, collection):
            raise fail("collection", "a collection name of 1-64 letters, digits, '.', '_' or '-', starting with a "
                       "letter or digit", collection, error=ConfigurationError)
        self._dim = check_int(dim, "dim", min=1, max=MAX_DIM, allow_none=True, error=ConfigurationError)
        check_choice(metric, "metric", METRICS, error=ConfigurationError)
        self._batch_options = {
            "max_batch_size": check_int(max_batch_size, "max_batch_size", min=1, max=1024, error=ConfigurationError),
            "max_wait_ms": check_number(max_wait_ms, "max_wait_ms", min=0, max=10_000, error=ConfigurationError),
            "max_queue": check_int(max_queue, "max_queue", min=1, error=ConfigurationError),
        }
        self.client = client_for(base_url, api_key, client, options, owner="RemoteIndex")
        self.collection = collection
        self._metric = metric
        self._path = collection_path(collection, "records")
        self._served: _Served | None = None
        self._setup_lock = threading.Lock()
        self._batcher: MicroBatcher[SearchRequest, Any] | None = None
        self._closed = False

    # ------------------------------------------------------------------ properties
    @property
    def dim(self) -> int:
        """Vector dimension: the one asked for, else the server's (asked once)."""
        return self._dim if self._dim is not None else self._ready().dim

    @property
    def metric(self) -> str:
        """``"cosine"``, ``"ip"`` or ``"l2"`` (the one asked for; checked against the server at first use)."""
        return self._metric

    @property
    def count(self) -> int:
        """Live records (one request)."""
        return int(self._info()["count"])

    async def acount(self) -> int:
        """Async :attr:`count`."""
        return int((await self._ainfo())["count"])

    def __len__(self) -> int:
        return self.count

    @property
    def embedder(self) -> str | None:
        """The identity of the embedder the collection recorded at its first add naming one (one request)."""
        recorded = self._info().get("embedder")
        return recorded if isinstance(recorded, str) else None

    @property
    def backend_name(self) -> str:
        """``"remote:<server>/<collection>"``."""
        return f"remote:{self.client.config.shown_url}/{self.collection}"

    def __repr__(self) -> str:
        return (f"<RemoteIndex {self.client.config.shown_url!r} collection={self.collection!r} "
                f"metric={self._metric!r}{' closed' if self._closed else ''}>")

    def stats(self) -> IndexStats:
        """A snapshot of the counters: the count (one request) and this process's search queue."""
        batcher = self._batcher
        return IndexStats(self.count, 0, self.backend_name, batcher.stats() if batcher is not None else _EMPTY_STATS)

    # ------------------------------------------------------------------ the server's collection
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this RemoteIndex was closed; create a new one.")

    def _info(self) -> dict[str, Any]:
        self._check_open()
        return _object(self.client.request("GET", self._path + "/info"), self._where)

    async def _ainfo(self) -> dict[str, Any]:
        self._check_open()
        return _object(await self.client.arequest("GET", self._path + "/info"), self._where)

    @property
    def _where(self) -> str:
        return f"{SERVICE} at {redact(self.client.root)}"

    def _ready(self) -> _Served:
        """The collection's dimension, metric and embedder, asked once and checked against this index's."""
        served = self._served
        if served is None:
            served = self._accept(self._info())
        self._check_open()
        return served

    async def _aready(self) -> _Served:
        served = self._served
        if served is None:
            served = self._accept(await self._ainfo())
        self._check_open()
        return served

    def _accept(self, info: Mapping[str, Any]) -> _Served:
        try:
            served = _Served(int(info["dim"]), str(info["metric"]), str(info.get("embedder") or info["server_embedder"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{self._where} sent a malformed collection info ({exc!r}); is base_url a gpuprompt "
                              "server?") from exc
        asked_dim = self._dim if self._dim is not None else served.dim
        if asked_dim != served.dim or self._metric != served.metric:
            raise ConfigurationError(
                f"collection {self.collection!r} of {self._where} holds vectors of dim={served.dim}, "
                f"metric={served.metric!r} (the server's embedder's); this RemoteIndex asked for dim={asked_dim}, "
                f"metric={self._metric!r}. Pass dim=None and metric={served.metric!r}, and embed with the server's "
                "model (GET /v1/models), or use an in-process VectorIndex for other vectors."
            )
        with self._setup_lock:
            self._served = served
        return served

    def _check_embedder(self, served: _Served, embedder: str | None, allow_other: bool) -> None:
        if embedder is None or allow_other or embedder == served.expected_embedder:
            return
        raise EmbedderMismatchError(
            f"collection {self.collection!r} of {self._where} holds vectors from embedder "
            f"{served.expected_embedder!r}; vectors from {embedder!r} are in another space and would rank wrongly. "
            "Embed with the server's model, or pass allow_other_embedder=True if mixing is intended.",
            expected=served.expected_embedder,
            got=embedder,
        )

    def _refused(self, exc: InvalidInputError, embedder: str | None, allow_other: bool) -> None:
        """Re-raise a server's refusal of an add as the typed error it was there, when it can be told:
        an embedder the collection (re-created meanwhile) no longer takes."""
        with self._setup_lock:
            self._served = None
        try:
            served = self._accept(self._info())
        except Exception:  # noqa: BLE001 - the original refusal is the error to report
            return
        try:
            self._check_embedder(served, embedder, allow_other)
        except EmbedderMismatchError as mismatch:
            raise mismatch from exc

    # ------------------------------------------------------------------ writes
    def add(
        self,
        ids: Sequence[str | None] | None,
        vectors: Any,
        documents: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        embedder: str | None = None,
        allow_other_embedder: bool = False,
    ) -> list[str]:
        """Insert or replace records (upsert), checked as :meth:`VectorIndex.add` checks them.

        Returns:
            The ids, in the order given (generated ones filled in).

        Raises:
            DimensionMismatchError, InvalidInputError, InputTypeError: as VectorIndex; nothing is sent.
            EmbedderMismatchError: ``embedder`` is not the collection's (see the class docstring).
            InvalidInputError: the server refused the records (409 past ``max_collection_records`` or
                ``max_collections``); nothing of that request was stored.
            QueueFullError, EngineDeadError, RequestTimeoutError: the server was busy or unreachable
                through every retry.
        """
        check_embedder_args(embedder, allow_other_embedder)
        served = self._ready()
        upsert = check_upsert(ids, vectors, documents, metadatas, dim=served.dim, metric=self._metric)
        if not upsert.ids:
            return []
        self._check_embedder(served, embedder, allow_other_embedder)
        try:
            for body in _upsert_bodies(upsert, embedder, allow_other_embedder):
                self.client.request("POST", self._path, body, idempotent=True)
        except InvalidInputError as exc:
            self._refused(exc, embedder, allow_other_embedder)
            raise
        return upsert.ids

    async def aadd(
        self,
        ids: Sequence[str | None] | None,
        vectors: Any,
        documents: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        embedder: str | None = None,
        allow_other_embedder: bool = False,
    ) -> list[str]:
        """Async :meth:`add` (large inputs are checked in a worker thread; the loop keeps running)."""
        check_embedder_args(embedder, allow_other_embedder)
        served = await self._aready()
        if _size(vectors) > _ASYNC_INLINE:
            upsert = await off_loop(check_upsert, ids, vectors, documents, metadatas, dim=served.dim,
                                    metric=self._metric)
        else:
            upsert = check_upsert(ids, vectors, documents, metadatas, dim=served.dim, metric=self._metric)
        if not upsert.ids:
            return []
        self._check_embedder(served, embedder, allow_other_embedder)
        try:
            for body in _upsert_bodies(upsert, embedder, allow_other_embedder):
                await self.client.arequest("POST", self._path, body, idempotent=True)
        except InvalidInputError as exc:
            await off_loop(self._refused, exc, embedder, allow_other_embedder)
            raise
        return upsert.ids

    def delete(self, ids: Sequence[str]) -> int:
        """Delete records by id; missing ids are ignored. Returns how many existed and were deleted."""
        self._check_open()
        id_list = list(dict.fromkeys(check_id_list(ids)))
        deleted = 0
        for chunk in _chunks(id_list, MAX_IDS_PER_REQUEST):
            answer = self.client.request("POST", self._path + "/delete", {"ids": chunk}, idempotent=True)
            deleted += int(_object(answer, self._where)["deleted"])
        return deleted

    async def adelete(self, ids: Sequence[str]) -> int:
        """Async :meth:`delete`."""
        self._check_open()
        id_list = list(dict.fromkeys(check_id_list(ids)))
        deleted = 0
        for chunk in _chunks(id_list, MAX_IDS_PER_REQUEST):
            answer = await self.client.arequest("POST", self._path + "/delete", {"ids": chunk}, idempotent=True)
            deleted += int(_object(answer, self._where)["deleted"])
        return deleted

    def clear(self) -> None:
        """Delete every record and the embedder record (the server drops the collection)."""
        self._check_open()
        self.client.request("DELETE", self._path, idempotent=True)
        with self._setup_lock:
            self._served = None  # a re-created collection may record another embedder

    async def aclear(self) -> None:
        """Async :meth:`clear`."""
        self._check_open()
        await self.client.arequest("DELETE", self._path, idempotent=True)
        with self._setup_lock:
            self._served = None

    # ------------------------------------------------------------------ reads
    def get(self, ids: Sequence[str]) -> list[Record]:
        """The records for ``ids``, in the order asked; missing ids are skipped."""
        self._check_open()
        id_list = check_id_list(ids)
        out: list[Record] = []
        for chunk in _chunks(id_list, _GET_CHUNK):
            answer = self.client.request("POST", self._path + "/get", {"ids": chunk}, idempotent=True)
            out.extend(_records(answer, self._where))
        return out

    async def aget(self, ids: Sequence[str]) -> list[Record]:
        """Async :meth:`get`."""
        self._check_open()
        id_list = check_id_list(ids)
        out: list[Record] = []
        for chunk in _chunks(id_list, _GET_CHUNK):
            answer = await self.client.arequest("POST", self._path + "/get", {"ids": chunk}, idempotent=True)
            out.extend(_records(answer, self._where))
        return out

    def ids(self, filter: Mapping[str, Any] | None = None) -> list[str]:
        """Every id, in storage order; with ``filter``, only the ids of the matching records.

        Raises:
            FilterError: a malformed filter (the message names the path in it); nothing is sent.
        """
        self._check_open()
        key = check_filter(filter)
        answer = self.client.request("POST", self._path + "/ids", {"filter": filter if key else None}, idempotent=True)
        return _ids(answer, self._where)

    async def aids(self, filter: Mapping[str, Any] | None = None) -> list[str]:
        """Async :meth:`ids`."""
        self._check_open()
        key = check_filter(filter)
        body = {"filter": filter if key else None}
        return _ids(await self.client.arequest("POST", self._path + "/ids", body, idempotent=True), self._where)

    # ------------------------------------------------------------------ search
    def search(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]:
        """The ``k`` best records for each query, best first (always ``min(k, matches)`` hits).

        Arguments, result and errors as :meth:`VectorIndex.search`; checked here, then sent with
        the other searches of this process that are waiting.
        """
        served = self._ready()
        request = make_request(queries, k, filter, dim=served.dim, metric=self._metric)
        return [hits for future in self._submit_all(request) for hits in future.result()]

    async def asearch(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]:
        """Async :meth:`search`: batched with other callers; the loop never waits on the network."""
        served = await self._aready()
        if _size(queries) > _ASYNC_INLINE:
            request = await off_loop(make_request, queries, k, filter, dim=served.dim, metric=self._metric)
        else:
            request = make_request(queries, k, filter, dim=served.dim, metric=self._metric)
        futures = self._submit_all(request)
        answers = await asyncio.gather(*(asyncio.wrap_future(future) for future in futures))
        return [hits for answer in answers for hits in answer]

    def search_text(self, queries: Sequence[str], k: int, filter: Mapping[str, Any] | None = None, *,
                    mode: str = "dense", alpha: float | None = None, fusion: str | None = None,
                    fetch_k: int | None = None, rrf_k: int = DEFAULT_RRF_K) -> list[list[Hit]]:
        """The ``k`` best records for each query text, searched by the server in one request
        (:class:`~gpuprompt.protocols.TextSearchLike`: the text travels once, its vector never):
        embedded with the server's embedder (``mode="dense"``, the same hits as embedding and
        calling :meth:`search`), ranked by BM25 over the documents (``"lexical"``), or both fused
        (``"hybrid"``, with ``alpha``/``fusion``/``fetch_k``/``rrf_k`` as :meth:`hybrid_search`).

        Raises:
            InputTypeError, InvalidInputError: a bad text list, ``k``, filter, mode or fusion (nothing is sent).
        """
        request = self._text_request(queries, k, filter, mode, alpha, fusion, fetch_k, rrf_k)
        return [] if not request.texts else self._submit(request).result()

    async def asearch_text(self, queries: Sequence[str], k: int, filter: Mapping[str, Any] | None = None, *,
                           mode: str = "dense", alpha: float | None = None, fusion: str | None = None,
                           fetch_k: int | None = None, rrf_k: int = DEFAULT_RRF_K) -> list[list[Hit]]:
        """Async :meth:`search_text` (batched with other searches of this process)."""
        await self._aready()
        request = self._text_request(queries, k, filter, mode, alpha, fusion, fetch_k, rrf_k)
        return [] if not request.texts else await asyncio.wrap_future(self._submit(request))

    def _text_request(self, queries: Any, k: Any, filter: Any, mode: Any = "dense", alpha: Any = None,
                      fusion: Any = None, fetch_k: Any = None, rrf_k: Any = DEFAULT_RRF_K) -> TextSearch:
        mode = check_choice(mode, "mode", ("dense", "lexical", "hybrid"))
        if mode == "dense":
            texts = validate_texts(queries, name="queries")
            if any(v is not None for v in (alpha, fusion, fetch_k)) or rrf_k != DEFAULT_RRF_K:
                raise InvalidInputError("'alpha', 'fusion', 'fetch_k' and 'rrf_k' fuse the legs of mode 'hybrid' "
                                        "(got mode 'dense'): drop them, or pass mode='hybrid'.")
            return TextSearch(texts, check_k(k), filter, check_filter(filter))
        if mode == "lexical":
            request = self._lexical_request(queries, k, filter)
            return TextSearch(request.texts or [], request.k, request.filter, request.key, mode="lexical")
        texts, k, plan = self._hybrid_plan(queries, k, filter, alpha, fusion, fetch_k, rrf_k)
        return TextSearch(texts, k, filter, check_filter(filter), mode="hybrid", fusion=plan)

    def _ensure_lexical(self) -> None:
        self._ready()

    async def _aensure_lexical(self) -> None:
        await self._aready()

    def mmr(
        self, query: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, filter: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """Maximal marginal relevance over the ``fetch_k`` best matches (as :meth:`VectorIndex.mmr`;
        the server re-ranks on its index's device)."""
        request = self._mmr_request(self._ready(), query, k, fetch_k, lambda_mult, filter)
        return self._submit(request).result()[0]

    async def ammr(
        self, query: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, filter: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """Async :meth:`mmr` (batched with other searches)."""
        request = self._mmr_request(await self._aready(), query, k, fetch_k, lambda_mult, filter)
        return (await asyncio.wrap_future(self._submit(request)))[0]

    def _mmr_request(self, served: _Served, query: Any, k: Any, fetch_k: Any, lambda_mult: Any,
                     filter: Any) -> SearchRequest:
        k, fetch, lambda_mult = check_mmr(k, fetch_k, lambda_mult)
        request = make_request(query, fetch, filter, dim=served.dim, metric=self._metric, mmr=(k, lambda_mult))
        check_one_query(request.queries, served.dim)
        return request

    async def asearch_groups(
        self, query: Any, k: int, *, group_by: str | Sequence[str], filter: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """Async :meth:`search_groups` (its over-fetching searches run in a worker thread)."""
        await self._aready()
        return await off_loop(self.search_groups, query, k, group_by=group_by, filter=filter)

    # ------------------------------------------------------------------ the batch
    def _submit_all(self, request: SearchRequest) -> list[Any]:
        """Queue a search, split into parts that fit one request body each."""
        rows = int(request.queries.shape[0])
        if rows == 0:
            return []
        step = self._queries_per_request()
        if rows <= step:
            return [self._submit(request)]
        parts = [SearchRequest(request.queries[start:start + step], request.k, request.filter, request.key)
                 for start in range(0, rows, step)]
        return [self._submit(part) for part in parts]

    def _queries_per_request(self) -> int:
        dim = self._served.dim if self._served is not None else 1
        return max(1, min(4096, BODY_BUDGET // (dim * 6)))  # base64 float32: 16/3 bytes per number, and room

    def _submit(self, request: SearchRequest) -> Any:
        batcher = self._batcher
        if batcher is None:
            with self._setup_lock:
                self._check_open()
                if self._batcher is None:
                    self._batcher = _batcher(self, self._queries_per_request())
                batcher = self._batcher
        return batcher.submit(request)

    def _run_batch(self, requests: list[SearchRequest]) -> list[Any]:
        """One HTTP request for a batch of searches; one result (a list of hit lists) per search."""
        body = {"searches": [_search_body(request) for request in requests]}
        answer = _object(self.client.request("POST", self._path + "/search", body, idempotent=True), self._where)
        try:
            results = answer["results"]
            out = [[[_hit(item) for item in hits] for hits in result] for result in results]
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{self._where} sent a malformed search answer ({exc!r}).") from exc
        if len(out) != len(requests):
            raise EngineError(f"{self._where} answered {len(out)} searches for {len(requests)}.")
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write the collection's records as a local VectorIndex snapshot at ``path`` (a copy).

        :func:`~gpuprompt.index.load_index` (and the vector stores' ``load_local`` /
        ``from_persist_path``) reopen it in process; the server keeps its own collection (durable
        under ``gpuprompt serve --data-dir``). Records written by others while it is read may or
        may not be in the copy. Nothing is pickled; the write is the core's atomic snapshot.

        Raises:
            InputTypeError, InvalidInputError: a bad ``path`` (as :meth:`VectorIndex.save`).
            OSError: the file system refused a write.
        """
        from gpuprompt.index import IndexConfig
        from gpuprompt.index._persist import snapshot_names
        from gpuprompt.index._snapshot import write_state
        from gpuprompt.index._store import Store

        snapshot_names(path)  # a bad path fails before any request
        served = self._ready()
        recorded = self.embedder
        records = self.get(self.ids())
        store = Store(served.dim)
        vectors = (np.stack([r.vector for r in records]) if records
                   else np.empty((0, served.dim), dtype=np.float32))
        n = len(records)
        store.load(vectors, np.arange(n, dtype=np.int64), [r.id for r in records], [r.document for r in records],
                   [r.metadata for r in records], n)
        config = IndexConfig(dim=served.dim, metric=self._metric, embedder=recorded)
        write_state(path, config, store, None)

    async def asave(self, path: str | Path) -> None:
        """Async :meth:`save`, in a worker thread."""
        await off_loop(self.save, path)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the search queue (queued searches fail with ``ClosedError``); later calls raise
        ``ClosedError``. The server's collection and the shared connection pool are untouched."""
        with self._setup_lock:
            self._closed = True
            batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.close()

    def __enter__(self) -> RemoteIndex:  # noqa: PYI034 - as VectorIndex.__enter__
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------- helpers
