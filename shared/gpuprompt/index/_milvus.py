"""MilvusIndex: the VectorIndex API over a Milvus collection (Milvus Lite file, server or cluster).

Checks, filters, MMR and batching are the core's own (``_checks``, ``filters``, ``_mmr``,
``MicroBatcher``); this module adds only the Milvus calls.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt.batching import BatcherStats, MicroBatcher
from gpuprompt.errors import ClosedError, ConfigurationError, SnapshotError
from gpuprompt.index._async import AsyncIndexMixin, off_loop
from gpuprompt.index._checks import check_filter, check_id_list, check_upsert
from gpuprompt.index._config import IndexConfig, check_embedder_args, record_embedder
from gpuprompt.index._groups import GroupSearchMixin
from gpuprompt.index._hybrid import HybridSearchMixin
from gpuprompt.index._milvus_lexical import AVGDL_PROPERTY, FIELD, LexicalCounts, document_vector, first_avgdl
from gpuprompt.index._milvus_filters import compile_milvus, ids_expression
from gpuprompt.index._milvus_schema import (
    MilvusOptions,
    check_rows,
    create_collection,
    existing_layout,
    has_lexical,
    open_client,
    resolve_options,
)
from gpuprompt.index._mmr import check_mmr, check_one_query
from gpuprompt.index._search import SearchRequest, make_request, request_cost
from gpuprompt.index._store import RWLock
from gpuprompt.index._types import Hit, IndexStats, Record
from gpuprompt.index.filters import compile_filter
from gpuprompt.validation import check_path

__all__ = ["MilvusIndex"]

_LIMIT_CAP = 16_384  # Milvus's largest topk / query window
_WRITE_CHUNK = 512
_GET_CHUNK = 1_000
_POINTER = "milvus.json"
_EMBEDDER_PROPERTY = "gpuprompt.embed"


class MilvusIndex(AsyncIndexMixin, GroupSearchMixin, HybridSearchMixin):
    """:class:`~gpuprompt.VectorIndex`'s API over a Milvus collection, through pymilvus's ``MilvusClient``.

    For vectors past one machine, several writers, or data that must outlive a server: ``uri`` is
    a local Milvus Lite file (``"kb.db"``: development and tests, one process per file) or a Milvus
    server / cluster (``"http://host:19530"``). ``add`` is an upsert; ``delete``, ``get``, ``ids``,
    ``search``, ``mmr``, ``search_groups``, ``count`` / ``len``, ``clear`` and ``close`` behave as
    on VectorIndex, with the same checks and typed errors, and every operation has its async twin.

    Scores are VectorIndex's: cosine similarity for ``"cosine"``, the inner product for ``"ip"``,
    ``1 / (1 + squared L2 distance)`` for ``"l2"``. Filters are the core's language
    (:mod:`gpuprompt.index.filters`), translated into Milvus expressions
    (:mod:`gpuprompt.index._milvus_filters`) with the same meaning: where Milvus's meaning differs
    (missing fields under ``$ne`` / ``$nin`` / ``$not``, bools equal to 1, ``$icontains``) the
    expression selects a superset and each returned record is re-checked, fetching more until
    ``min(k, matches)`` hits remain. Concurrent ``search`` / ``asearch`` / ``mmr`` calls are
    coalesced by one :class:`~gpuprompt.batching.MicroBatcher` into multi-query Milvus searches.

    Metadata is stored whole in a JSON field; keys named in ``scalar_fields`` are also typed
    columns (exact, indexable filters; a ``str`` field gets a case-folded shadow column for
    ``$icontains``). A record whose declared field holds another kind is refused at ``add``.

    Persistence: Milvus persists every write itself. :meth:`save` flushes the collection and
    writes a small pointer folder (``milvus.json``: uri, collection, dim, metric, options), and
    :meth:`load` reopens the collection it names (or a ``uri`` directly): unlike a VectorIndex
    snapshot, it is not a copy, so later writes are visible to it.

    Differences from VectorIndex: :meth:`ids` returns Milvus's order (not insertion order);
    ``close`` releases the client, after which every call raises ``ClosedError``; an ``add`` larger
    than 512 records is written in chunks (a server failure midway leaves the earlier chunks).

    Args:
        dim: vector dimension (1 to 32,768).
        metric: ``"cosine"`` (default), ``"ip"`` or ``"l2"``.
        uri: a Milvus Lite file ending in ``.db`` (default ``gpuprompt_milvus.db``) or a server URL.
        token: credentials for a server (``"user:password"`` or an API key).
        collection: the collection name (created if missing; an existing one must agree on dim and metric).
        index_type: ``"HNSW"`` (default), ``"FLAT"``, ``"IVF_FLAT"``, ``"IVF_SQ8"``, ``"IVF_PQ"``,
            ``"AUTOINDEX"``, or for a GPU Milvus deployment ``"GPU_CAGRA"``, ``"GPU_IVF_FLAT"``,
            ``"GPU_IVF_PQ"``, ``"GPU_BRUTE_FORCE"``.
        index_params: index build parameters over the defaults (HNSW ``M=16, efConstruction=200``).
        search_params: search parameters (HNSW ``ef``, IVF ``nprobe``, CAGRA ``itopk_size``).
        scalar_fields: metadata keys stored as typed columns, ``{"price": "float", "lang": "str"}``
            (kinds ``"str"``, ``"int"``, ``"float"``, ``"bool"``). Fixed when the collection is
            created: a handle on an existing collection that names fewer (or none) adopts the
            collection's, so every writer fills its columns; one naming a field the collection
            does not type (or types otherwise) is refused.
        max_batch_size, max_wait_ms, max_queue: the search batcher's options (as VectorIndex's).

    Raises:
        ConfigurationError: an unknown option or a bad value (named); at first use, a collection
            of another dimension or metric.
        DependencyError: pymilvus is not installed (at first use).
    """

    def __init__(self, dim: int, **options: Any) -> None:
        self._options = resolve_options(dim, options)
        self._client: Any = None
        self._setup_lock = threading.Lock()
        self._lock = RWLock()  # writers: clear (drops the collection); readers: everything else
        self._batcher: MicroBatcher[SearchRequest, Any] | None = None
        self._closed = False
        self._lexical_on = True  # the collection has the sparse field (one made before it has not)
        self._avgdl: float | None = None  # the BM25 length norm of the collection (its first write's)
        self._counts: LexicalCounts | None = None  # N and df, counted at the first lexical search
        self._write_lock = threading.Lock()  # writes, while the counts follow them

    @classmethod
    def check_options(cls, **options: Any) -> None:
        """Validate constructor options without connecting (``dim`` optional)."""
        resolve_options(options.pop("dim", 1), options)

    # ------------------------------------------------------------------ properties
    @property
    def options(self) -> MilvusOptions:
        """The checked options."""
        return self._options

    @property
    def dim(self) -> int:
        """Vector dimension."""
        return self._options.dim

    @property
    def metric(self) -> str:
        """``"cosine"``, ``"ip"`` or ``"l2"``."""
        return self._options.metric

    @property
    def backend_name(self) -> str:
        """``"milvus:<index_type>:<uri>"``."""
        return f"milvus:{self._options.index_type}:{self._options.uri}"

    @property
    def count(self) -> int:
        """Live records (a ``count(*)`` query)."""
        client = self._ensure()
        with self._lock.read():
            rows = client.query(self._options.collection, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"]) if rows else 0

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        o = self._options
        return f"<MilvusIndex dim={o.dim} metric={o.metric!r} uri={o.uri!r} collection={o.collection!r}>"

    def stats(self) -> IndexStats:
        """A snapshot of the counters (no tombstones: Milvus compacts itself)."""
        batcher = self._batcher
        empty = BatcherStats(0, 0, 0.0, 0, 0.0, 0.0, 0, 0, 0, 0)
        return IndexStats(self.count, 0, self.backend_name, batcher.stats() if batcher is not None else empty)

    # ------------------------------------------------------------------ connection
    def _ensure(self) -> Any:
        client = self._client
        if client is not None:
            return client
        with self._setup_lock:
            if self._closed:
                raise ClosedError("this MilvusIndex was closed; create or load a new one.")
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _connect(self) -> Any:
        o = self._options
        client = open_client(o.uri, o.token)
        if not client.has_collection(o.collection):
            create_collection(client, o)
            return client
        dim, metric, _, scalars = existing_layout(client, o.collection)
        self._lexical_on = has_lexical(client, o.collection)
        missing = {k: v for k, v in o.scalar_fields.items() if scalars.get(k) != v}
        if dim != o.dim or metric != o.metric or missing:
            client.close()
            raise ConfigurationError(
                f"the Milvus collection {o.collection!r} at {o.uri!r} holds dim={dim}, metric={metric!r}, "
                f"scalar_fields={scalars} (asked: dim={o.dim}, metric={o.metric!r}, scalar_fields={o.scalar_fields}); "
                "pass another collection= name, or MilvusIndex.load(uri, collection=...) to open it as it is."
            )
        if scalars != o.scalar_fields:
            # The collection types more keys than this handle named: adopt its columns, so that every
            # handle fills them (a NULL column would hide the record from the typed filters).
            self._options = replace(o, scalar_fields=dict(scalars))
        client.load_collection(o.collection)
        return client

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

        Also refused (InvalidInputError, nothing written): an id over 4,096 bytes or holding a control
        character (a Milvus expression cannot spell it), a document over 65,535 bytes, metadata over
        64 KiB of JSON, a declared scalar field of another kind.
        ``embedder`` is recorded in the collection's properties (``gpuprompt.embed``) by the
        first add naming one; a later add from another embedder raises ``EmbedderMismatchError``
        unless ``allow_other_embedder``.

        Returns:
            The ids, in the order given (generated ones filled in).
        """
        check_embedder_args(embedder, allow_other_embedder)
        upsert = check_upsert(ids, vectors, documents, metadatas, dim=self.dim, metric=self.metric)
        if not upsert.ids:
            return []
        client = self._ensure()  # first: the columns to fill are the collection's (see _connect)
        rows = check_rows(upsert.unique_ids, upsert.vectors, upsert.documents, upsert.metadatas, self._options)
        with self._lock.read(), self._write_lock:
            self._record_embedder(client, embedder, allow_other_embedder)
            if self._lexical_on:
                avgdl = self._length_norm(client, upsert.documents)
                for row, document in zip(rows, upsert.documents):
                    row[FIELD] = document_vector(document, avgdl)
            counts = self._counts
            if counts is not None:  # the counts follow this handle's writes: uncount what is replaced
                counts.remove(row.get("document") for row in self._fetch(client, upsert.unique_ids, ["document"]))
            for start in range(0, len(rows), _WRITE_CHUNK):
                client.upsert(self._options.collection, rows[start : start + _WRITE_CHUNK])
            if counts is not None:
                counts.add(upsert.documents)
        return upsert.ids

    def _length_norm(self, client: Any, documents: list[str | None]) -> float:
        """The collection's BM25 average document length: recorded by its first write with words."""
        if self._avgdl is not None:
            return self._avgdl
        properties = client.describe_collection(self._options.collection).get("properties") or {}
        recorded = properties.get(AVGDL_PROPERTY)
        if recorded:
            self._avgdl = float(recorded)
            return self._avgdl
        average = first_avgdl(documents)
        if average is None:
            return 1.0  # no words yet: every vector is NO_TERMS, the norm is not used
        client.alter_collection_properties(self._options.collection, properties={AVGDL_PROPERTY: repr(average)})
        self._avgdl = average
        return average

    @property
    def embedder(self) -> str | None:
        """The identity of the embedder that made the stored vectors, if an add named one."""
        client = self._ensure()
        properties = client.describe_collection(self._options.collection).get("properties") or {}
        return properties.get(_EMBEDDER_PROPERTY) or None

    def _record_embedder(self, client: Any, embedder: str | None, allow_other: bool) -> None:
        if embedder is None:
            return
        recorded = self.embedder
        config = record_embedder(IndexConfig(dim=self.dim, embedder=recorded), embedder, allow_other)
        if config.embedder != recorded:
            client.alter_collection_properties(self._options.collection, properties={_EMBEDDER_PROPERTY: embedder})

    def delete(self, ids: Sequence[str]) -> int:
        """Delete records by id; missing ids are ignored. Returns how many existed and were deleted."""
        id_list = list(dict.fromkeys(check_id_list(ids)))
        if not id_list:
            return 0
        client = self._ensure()
        with self._lock.read(), self._write_lock:
            counts = self._counts
            found = self._fetch(client, id_list, ["id", "document"] if counts is not None else ["id"])
            present = [row["id"] for row in found]
            if present:
                for expr in _id_expressions(present):
                    client.delete(self._options.collection, filter=expr)
                if counts is not None:
                    counts.remove(row.get("document") for row in found)
        return len(present)

    def clear(self) -> None:
        """Delete every record and the embedder record (the collection is dropped and created again)."""
        client = self._ensure()
        with self._lock.write():
            client.drop_collection(self._options.collection)
            create_collection(client, self._options)
            self._lexical_on, self._avgdl = True, None
            if self._counts is not None:
                self._counts.clear()

    def drop(self) -> None:
        """Delete the Milvus collection and everything in it, then close this index.

        The index equivalent of dropping a table: use it when the data itself is to go (a
        server's ``DELETE /v1/collections/{name}``); :meth:`close` only lets go of the client.
        """
        client = self._ensure()
        with self._lock.write():
            client.drop_collection(self._options.collection)
        self.close()

    # ------------------------------------------------------------------ reads
    def _fetch(self, client: Any, ids: list[str], fields: list[str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for expr in _id_expressions(ids):
            out.extend(client.query(self._options.collection, filter=expr, output_fields=fields))
        return out

    def get(self, ids: Sequence[str]) -> list[Record]:
        """The records for ``ids``, in the order asked; missing ids are skipped."""
        id_list = check_id_list(ids)
        if not id_list:
            return []
        client = self._ensure()
        with self._lock.read():
            rows = self._fetch(client, list(dict.fromkeys(id_list)), ["id", "vector", "document", "metadata"])
        found = {row["id"]: row for row in rows}
        return [
            Record(key, np.asarray(found[key]["vector"], dtype=np.float32), found[key]["document"], _meta(found[key]))
            for key in id_list
            if key in found
        ]

    def ids(self, filter: Mapping[str, Any] | None = None) -> list[str]:
        """Every id (Milvus's order); with ``filter``, only those of the matching records.

        Raises:
            FilterError: a malformed filter (the message names the path in it).
        """
        key = check_filter(filter)
        client = self._ensure()
        with self._lock.read():
            return self._matching_ids(client, filter if key else None)

    def _matching_ids(self, client: Any, filter: Mapping[str, Any] | None) -> list[str]:
        expr = self._expression(filter)
        predicate = compile_filter(filter) if filter else None
        fields = ["id", "metadata"] if predicate is not None else ["id"]
        out: list[str] = []
        if self._options.is_lite:  # Milvus Lite answers an unbounded query; a server pages
            rows = client.query(self._options.collection, filter=expr or 'id != ""', output_fields=fields)
            return [row["id"] for row in rows if predicate is None or predicate(_meta(row))]
        iterator = client.query_iterator(self._options.collection, batch_size=1000, filter=expr, output_fields=fields)
        try:
            while batch := iterator.next():
                out.extend(row["id"] for row in batch if predicate is None or predicate(_meta(row)))
        finally:
            iterator.close()
        return out

    def _expression(self, filter: Mapping[str, Any] | None) -> str:
        return compile_milvus(filter, scalar_fields=self._options.scalar_fields, json_field="metadata")

    # ------------------------------------------------------------------ search
    def search(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]:
        """The ``k`` best records for each query, best first (always ``min(k, matches)`` hits).

        Arguments, result and errors as :meth:`VectorIndex.search`. Concurrent calls are batched
        into one multi-query Milvus search per distinct filter.
        """
        request = make_request(queries, k, filter, dim=self.dim, metric=self.metric)
        if request.queries.shape[0] == 0:
            return []
        return self._submit(request).result()

    async def asearch(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]:
        """Async :meth:`search`: batched with other callers; the loop never waits on Milvus."""
        request = make_request(queries, k, filter, dim=self.dim, metric=self.metric)
        if request.queries.shape[0] == 0:
            return []
        return await asyncio.wrap_future(self._submit(request))

    def mmr(
        self, query: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, filter: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """Maximal marginal relevance over the ``fetch_k`` best matches (as :meth:`VectorIndex.mmr`)."""
        return self._submit(self._mmr_request(query, k, fetch_k, lambda_mult, filter)).result()[0]

    async def ammr(
        self, query: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, filter: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """Async :meth:`mmr` (batched with other searches)."""
        request = self._mmr_request(query, k, fetch_k, lambda_mult, filter)
        return (await asyncio.wrap_future(self._submit(request)))[0]

    def _mmr_request(self, query: Any, k: Any, fetch_k: Any, lambda_mult: Any, filter: Any) -> SearchRequest:
        k, fetch, lambda_mult = check_mmr(k, fetch_k, lambda_mult)
        request = make_request(query, fetch, filter, dim=self.dim, metric=self.metric, mmr=(k, lambda_mult))
        check_one_query(request.queries, self.dim)
        return request

    def _submit(self, request: SearchRequest) -> Any:
        from gpuprompt.index._milvus_search import check_server_k

        check_server_k(self, request.k, "fetch_k" if request.mmr is not None else "k")
        if request.fusion is not None:
            check_server_k(self, request.fusion.fetch_k, "fetch_k")
        batcher = self._batcher
        if batcher is None:
            with self._setup_lock:
                if self._closed:
                    raise ClosedError("this MilvusIndex was closed; create or load a new one.")
                if self._batcher is None:
                    self._batcher = _batcher(self)
                batcher = self._batcher
        return batcher.submit(request)

    def _run_batch(self, requests: list[SearchRequest]) -> list[Any]:
        from gpuprompt.index._milvus_search import run_milvus_batch

        client = self._ensure()
        with self._lock.read():
            return run_milvus_batch(self, client, requests)

    # ------------------------------------------------------------------ the lexical leg
    def _ensure_lexical(self) -> None:
        """Count N and df from the stored documents, once (this handle's writes keep them in step)."""
        if self._counts is None:
            client = self._ensure()
            if not self._lexical_on:
                raise ConfigurationError(
                    f"the Milvus collection {self._options.collection!r} was made before MilvusIndex had a lexical "
                    "leg (no 'lexical' sparse field): lexical and hybrid search need one. Copy its records into a "
                    "new collection (MilvusIndex(..., collection='new').add(...)), or search it with mode='dense'."
                )
            with self._lock.read(), self._write_lock:
                if self._counts is None:
                    counts = LexicalCounts()
                    counts.add(self._documents(client))
                    self._counts = counts

    async def _aensure_lexical(self) -> None:
        if self._counts is None:
            await asyncio.to_thread(self._ensure_lexical)

    def _lexical_counts(self) -> LexicalCounts:
        counts = self._counts
        assert counts is not None, "the lexical leg is counted before a lexical search is queued"
        return counts

    def refresh_lexical(self) -> None:
        """Count N and df anew from the stored documents (after other processes wrote to the collection)."""
        with self._setup_lock:
            self._counts = None
        self._ensure_lexical()

    def _documents(self, client: Any) -> list[str | None]:
        o = self._options
        if o.is_lite:
            rows = client.query(o.collection, filter='id != ""', output_fields=["document"])
            return [row.get("document") for row in rows]
        out: list[str | None] = []
        iterator = client.query_iterator(o.collection, batch_size=1000, filter="", output_fields=["document"])
        try:
            while batch := iterator.next():
                out.extend(row.get("document") for row in batch)
        finally:
            iterator.close()
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Flush the collection and write a pointer to it at folder ``path`` (``milvus.json``).

        Milvus keeps the data; the pointer lets :meth:`load` (and the adapters' ``load_local``)
        reopen the same collection. Not a copy: later writes to the collection are seen by it.
        """
        folder = Path(check_path(path, "path"))
        client = self._ensure()
        client.flush(self._options.collection)
        o = self._options
        uri = o.uri if not o.is_lite else str(Path(o.uri).resolve())
        pointer = {
            "format": "gpuprompt-milvus/1",
            "uri": uri,
            "collection": o.collection,
            "dim": o.dim,
            "metric": o.metric,
            "index_type": o.index_type,
            "scalar_fields": o.scalar_fields,
        }
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{_POINTER}.tmp"
        tmp.write_text(json.dumps(pointer, indent=1), encoding="utf-8")
        tmp.replace(folder / _POINTER)

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", *, collection: str | None = None, **options: Any) -> MilvusIndex:
        """Open an existing collection: from a folder :meth:`save` wrote, or a ``uri`` directly.

        The dimension, metric, index type and scalar fields are read from the collection.
        ``device`` is accepted for VectorIndex's signature and ignored (Milvus places its indexes).

        Raises:
            SnapshotError: a pointer folder that is unreadable, or no such collection.
        """
        text = str(path)
        pointer = Path(text) / _POINTER if not text.startswith(("http://", "https://", "tcp://", "grpc://")) else None
        if pointer is not None and pointer.is_file():
            try:
                saved = json.loads(pointer.read_text(encoding="utf-8"))
                uri, name = str(saved["uri"]), str(saved["collection"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise SnapshotError(f"{pointer} is not a MilvusIndex pointer written by save(): {exc}") from exc
        else:
            uri, name = text, collection or "gpuprompt"
        token = options.get("token", "")
        probe = open_client(uri, token)
        try:
            if not probe.has_collection(name):
                raise SnapshotError(f"no Milvus collection {name!r} at {uri!r}; save() one, or create it with MilvusIndex(...).")
            dim, metric, index_type, scalars = existing_layout(probe, name)
        finally:
            probe.close()
        return cls(dim, uri=uri, collection=name, metric=metric, index_type=index_type, scalar_fields=scalars, **options)

    @classmethod
    async def aload(cls, path: str | Path, device: str = "auto", **options: Any) -> MilvusIndex:  # type: ignore[override]
        """Async :meth:`load`, in a worker thread."""
        return await off_loop(cls.load, path, device, **options)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the search queue and release the client; later calls raise ``ClosedError``."""
        with self._setup_lock:
            self._closed = True
            batcher, self._batcher = self._batcher, None
            client, self._client = self._client, None
        if batcher is not None:
            batcher.close()
        if client is not None:
            client.close()

    def __enter__(self) -> MilvusIndex:  # noqa: PYI034 - as VectorIndex.__enter__
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _id_expressions(ids: Sequence[str]) -> Iterator[str]:
    """:func:`ids_expression` of ``ids`` in chunks of at most ``_GET_CHUNK``."""
    for start in range(0, len(ids), _GET_CHUNK):
        expression = ids_expression(ids[start : start + _GET_CHUNK])
        if expression is not None:
            yield expression


def _meta(row: Mapping[str, Any]) -> dict[str, Any]:
    value = row.get("metadata")
    if isinstance(value, str):  # some servers hand JSON fields back as text
        value = json.loads(value)
    return dict(value) if isinstance(value, Mapping) else {}


def _batcher(index: MilvusIndex) -> MicroBatcher[SearchRequest, Any]:
    ref = weakref.ref(index)

    def run(requests: list[SearchRequest]) -> list[Any]:
        target = ref()
        if target is None:
            raise ClosedError("the MilvusIndex behind this search was garbage-collected.")
        return target._run_batch(requests)

    o = index.options
    batcher: MicroBatcher[SearchRequest, Any] = MicroBatcher(
        run,
        name="milvus-search",
        cost=request_cost,
        max_batch_cost=4096,
        max_batch_size=o.max_batch_size,
        max_wait_ms=o.max_wait_ms,
        max_queue=o.max_queue,
    )
    weakref.finalize(index, batcher.close, timeout=0)
    return batcher
