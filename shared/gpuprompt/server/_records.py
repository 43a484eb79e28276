"""Raw-index routes over the server's collections: the :class:`~gpuprompt.index.IndexLike` calls of
:class:`gpuprompt.remote.RemoteIndex`, with vectors a client computed, so remote vector stores
behave as in process (upsert, get, delete, ids, filtered search, MMR, clear).

Routes (behind the server's API key, like every ``/v1`` route)::

    GET    /v1/collections/{name}/records/info    dim, metric, count, embedder records  -> collection.records.info
    POST   /v1/collections/{name}/records         upsert vectors with their records     -> collection.records.upserted
    POST   /v1/collections/{name}/records/get     records by id, in the order asked     -> collection.records
    POST   /v1/collections/{name}/records/delete  delete by id (unknown ids ignored)    -> collection.records.deleted
    POST   /v1/collections/{name}/records/ids     the ids matching a filter             -> collection.records.ids
    POST   /v1/collections/{name}/records/search  searches and MMR, many per request    -> collection.records.search
    DELETE /v1/collections/{name}/records         clear: every record and the embedder record

Vectors travel as base64 of little-endian float32 rows (or as JSON lists of numbers); a search
request holds several searches, which the collection's index batches with every concurrent one.
A collection that does not exist reads as an empty index (count 0, no hits), as a new in-process
index does; the first upsert creates it, with the served embedder's dimension and the cosine
metric. Upserts and deletes take :class:`~gpuprompt.server._collections.Collections`' capped and
(under ``--data-dir``) logged paths, exactly as ``/documents`` does. Clearing drops the collection
(its records, embedder record and chat sessions), durably.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from fastapi import FastAPI, Path
from fastapi.responses import Response
from pydantic import BaseModel, Field, StrictBool, StrictFloat, field_validator, model_validator

from gpuprompt.bridge import off_loop
from gpuprompt.errors import DimensionMismatchError, InvalidInputError
from gpuprompt.server._collections import COLLECTION_NAME_PATTERN, Collection, recorded_embedder
from gpuprompt.server._errors import ApiError
from gpuprompt.server._http import all_or_none, json_response
from gpuprompt.server._schemas import FilterObject, HitModel, Metadata, Text, _int, _number, _Strict
from gpuprompt.validation import INT64_MAX
from gpuprompt.wire import (
    MAX_IDS_PER_REQUEST,
    MAX_RECORD_ID_LENGTH,
    MAX_RECORDS_PER_REQUEST,
    MAX_SEARCHES_PER_REQUEST,
    decode_vectors,
    encode_vectors,
)

if TYPE_CHECKING:
    from gpuprompt.index import Hit, Record
    from gpuprompt.server._app import _Server

__all__ = [
    "MAX_IDS_PER_REQUEST",
    "MAX_RECORDS_PER_REQUEST",
    "MAX_RECORD_ID_LENGTH",
    "MAX_SEARCHES_PER_REQUEST",
    "DeleteRecordsRequest",
    "GetRecordsRequest",
    "IdsRequest",
    "RecordIds",
    "RecordList",
    "RecordsCleared",
    "RecordsDeleted",
    "RecordsInfo",
    "RecordsUpserted",
    "SearchRecordsRequest",
    "SearchResults",
    "UpsertRecordsRequest",
    "add_record_routes",
]

_MAX_EMBEDDER_LENGTH = 512  # as the core's check_embedder_name
_INLINE_BYTES = 1 << 20  # vectors decoded on the event loop up to this size; larger in a worker thread

RecordId = Annotated[Text, Field(min_length=1, max_length=MAX_RECORD_ID_LENGTH)]
"""A record id to store: non-empty, well-formed."""
AnyId = Annotated[Text, Field(max_length=MAX_RECORD_ID_LENGTH)]
"""A record id to look up (any well-formed str: one never stored is simply not found)."""
K = _int(1, INT64_MAX)
"""A number of hits (larger than the collection means all of it)."""
Weight = _number(0.0, 1.0)
"""MMR's ``lambda_mult``."""
Vectors = str | list[list[StrictFloat]]
"""Rows of float32: base64 of their little-endian bytes (``n * dim * 4`` bytes), or JSON lists of
numbers (finite; no strings or bools)."""


# ---------------------------------------------------------------------- requests
class UpsertRecordsRequest(_Strict):
    """``POST /v1/collections/{name}/records``: insert or replace records with their vectors."""

    ids: list[RecordId] = Field(min_length=1, max_length=MAX_RECORDS_PER_REQUEST)
    """One distinct id per vector (an existing id is replaced)."""
    vectors: Vectors
    """``len(ids)`` rows of the collection's dimension."""
    documents: list[Text | None] | None = None
    """One text or None per vector, or None."""
    metadatas: list[Metadata] | None = None
    """One metadata object (or None) per vector, or None."""
    embedder: Annotated[Text, Field(min_length=1, max_length=_MAX_EMBEDDER_LENGTH)] | None = None
    """The identity of the embedder that made the vectors (``Embedder.identity``), or None if unknown."""
    allow_other_embedder: StrictBool = False
    """Store vectors of another embedder than the collection's anyway (not recorded)."""

    @field_validator("ids")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("must not repeat an id within one request (the client keeps each id's last record)")
        return value

    @model_validator(mode="after")
    def _lengths(self) -> UpsertRecordsRequest:
        n = len(self.ids)
        if isinstance(self.vectors, list) and len(self.vectors) != n:
            raise ValueError(f"'vectors' must hold one vector per id ({n}) (got {len(self.vectors)})")
        if self.documents is not None and len(self.documents) != n:
            raise ValueError(f"'documents' must hold one entry per id ({n}) (got {len(self.documents)})")
        if self.metadatas is not None and len(self.metadatas) != n:
            raise ValueError(f"'metadatas' must hold one entry per id ({n}) (got {len(self.metadatas)})")
        return self


class GetRecordsRequest(_Strict):
    """``POST /v1/collections/{name}/records/get``: records by id."""

    ids: list[AnyId] = Field(max_length=MAX_IDS_PER_REQUEST)
    """The ids wanted, in the order wanted (unknown ids are skipped, repeated ones repeated)."""
    encoding_format: Literal["float", "base64"] = "base64"
    """How the vectors come back: JSON lists, or base64 of little-endian float32."""


class DeleteRecordsRequest(_Strict):
    """``POST /v1/collections/{name}/records/delete``: delete records by id."""

    ids: list[AnyId] = Field(max_length=MAX_IDS_PER_REQUEST)
    """The ids to delete; unknown ids are ignored."""


class IdsRequest(_Strict):
    """``POST /v1/collections/{name}/records/ids``: every id, or those of the records a filter matches."""

    filter: FilterObject | None = None
    """A metadata filter in the core's language (:mod:`gpuprompt.index.filters`), or None."""


class MMRModel(_Strict):
    """Maximal marginal relevance over a search's hits."""

    k: K
    """Hits to pick among the search's ``k`` candidates."""
    lambda_mult: Weight  # type: ignore[valid-type]
    """1: relevance only, 0: diversity only."""


class SearchModel(_Strict):
    """One search: its query vectors, ``k``, filter and, for MMR, the re-ranking."""

    queries: Vectors
    """Query rows of the collection's dimension (exactly one for MMR)."""
    k: K
    """Hits per query (for MMR: the candidates fetched)."""
    filter: FilterObject | None = None
    """A metadata filter in the core's language, or None."""
    mmr: MMRModel | None = None
    """Re-rank the candidates by MMR (one query), or None for a plain search."""


class SearchRecordsRequest(_Strict):
    """``POST /v1/collections/{name}/records/search``: several searches, batched by the index."""

    searches: list[SearchModel] = Field(min_length=1, max_length=MAX_SEARCHES_PER_REQUEST)
    """The searches, answered in order."""


# ---------------------------------------------------------------------- responses
class RecordsInfo(BaseModel):
    """``GET /v1/collections/{name}/records/info``."""

    object: Literal["collection.records.info"] = "collection.records.info"
    collection: str
    exists: bool
    """Whether the collection exists (a first upsert creates it)."""
    count: int
    """Records stored."""
    dim: int
    """The vectors' dimension (the served embedder's)."""
    metric: str
    """``"cosine"``."""
    embedder: str | None
    """The embedder the collection recorded at its first add naming one, or None."""
    server_embedder: str
    """The served embedder's identity: the one a new collection belongs to."""


class RecordsUpserted(BaseModel):
    """The answer to an upsert."""

    object: Literal["collection.records.upserted"] = "collection.records.upserted"
    collection: str
    ids: list[str]
    count: int
    """Records in the collection now."""


class RecordModel(BaseModel):
    """One stored record."""

    id: str
    vector: str | list[float]
    """As added (not normalised): base64 float32 or a list, by the request's ``encoding_format``."""
    document: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class RecordList(BaseModel):
    """The answer to a get."""

    object: Literal["collection.records"] = "collection.records"
    collection: str
    data: list[RecordModel]


class RecordsDeleted(BaseModel):
    """The answer to a delete."""

    object: Literal["collection.records.deleted"] = "collection.records.deleted"
    collection: str
    deleted: int
    """Records that existed and were deleted."""
    count: int


class RecordIds(BaseModel):
    """The answer to an ids request."""

    object: Literal["collection.records.ids"] = "collection.records.ids"
    collection: str
    ids: list[str]


class SearchResults(BaseModel):
    """The answer to a search request: per search, one hit list per query (one list for MMR)."""

    object: Literal["collection.records.search"] = "collection.records.search"
    collection: str
    results: list[list[list[HitModel]]]


class RecordsCleared(BaseModel):
    """The answer to a clear."""

    object: Literal["collection.records.cleared"] = "collection.records.cleared"
    collection: str
    cleared: bool
    """Whether there was a collection to clear."""


# ---------------------------------------------------------------------- helpers
def _matrix(value: Vectors, dim: int, name: str, rows: int | None = None) -> np.ndarray:
    """The float32 ``(n, dim)`` matrix a request field holds.

    Raises:
        DimensionMismatchError: rows of another dimension.
        InvalidInputError: not base64, or not ``rows`` rows.
    """
    if isinstance(value, str):
        flat = decode_vectors(value, name=name)
        width = dim
        wanted = flat.size if rows is None else rows * width
        if flat.size != wanted or flat.size % width:
            raw = flat  # counted in float32 values below
            got = flat.size // rows if rows and flat.size % rows == 0 else None
            amount = f"{rows} vectors" if rows is not None else "vectors"
            raise DimensionMismatchError(
                f"'{name}' must hold {amount} of dimension {dim}, the collection's, as float32 bytes (got {4 * raw.size} "
                f"bytes{'' if got is None else f': dimension {got}'}); embed with the server's model (GET /v1/models).",
                expected=dim,
                got=got,
            )
        return flat.reshape(-1, dim)
    widths = sorted({len(row) for row in value})
    if widths and widths != [dim]:
        other = next(w for w in widths if w != dim)
        raise DimensionMismatchError(
            f"'{name}' must hold vectors of dimension {dim}, the collection's (got one of {other}); embed with "
            "the server's model (GET /v1/models).",
            expected=dim,
            got=other,
        )
    if rows is not None and len(value) != rows:
        raise InvalidInputError(f"'{name}' must hold {rows} vectors, one per id (got {len(value)}).")
    return np.asarray(value, dtype=np.float32).reshape(len(value), dim)


async def _amatrix(value: Vectors, dim: int, name: str, rows: int | None = None) -> np.ndarray:
    """:func:`_matrix`, off the event loop for a large field."""
    if (len(value) if isinstance(value, str) else len(value) * dim * 8) > _INLINE_BYTES:
        return await asyncio.to_thread(_matrix, value, dim, name, rows)
    return _matrix(value, dim, name, rows)


def _hit(hit: Hit) -> HitModel:
    return HitModel(id=hit.id, score=float(hit.score), document=hit.document, metadata=dict(hit.metadata))


def _record(record: Record, encoding: str) -> RecordModel:
    encoded: str | list[float] = (
        encode_vectors(record.vector) if encoding == "base64" else record.vector.astype("<f4", copy=False).tolist()
    )
    return RecordModel(id=record.id, vector=encoded, document=record.document, metadata=dict(record.metadata))


def _check_filter(filter: dict[str, Any] | None) -> None:
    if filter is not None:
        from gpuprompt.index.filters import validate_filter

        validate_filter(filter)  # FilterError (400 invalid_filter), naming the path in it


# ---------------------------------------------------------------------- routes
def add_record_routes(app: FastAPI, server: _Server) -> None:
    """Register the ``/v1/collections/{name}/records`` routes over ``server.collections`` on ``app``."""
    collections = server.collections
    name_path = Path(pattern=COLLECTION_NAME_PATTERN, description="the collection's name")

    async def existing(name: str) -> Collection | None:
        try:
            if collections.vector_uri is None:
                return collections.get(name)
            return await asyncio.to_thread(collections.get, name)  # may look the collection up in Milvus
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def dim_of(collection: Collection | None) -> int:
        if collection is not None:
            return collection.index.dim
        return (await server.embedder.aload()).dim  # loads the model off the loop if not preloaded

    @app.get("/v1/collections/{name}/records/info", response_model=RecordsInfo, tags=["records"])
    async def records_info(name: str = name_path) -> Response:
        """The collection's dimension, metric, count and embedder records (an absent one is empty)."""
        collection = await existing(name)
        served = await off_loop(lambda: server.embedder.identity)
        if collection is None:
            return json_response(RecordsInfo(collection=name, exists=False, count=0, dim=await dim_of(None),
                                             metric="cosine", embedder=None, server_embedder=served))
        index = collection.index
        return json_response(
            RecordsInfo(collection=name, exists=True, count=await collections.count(collection), dim=index.dim,
                        metric=index.metric, embedder=await off_loop(recorded_embedder, index),
                        server_embedder=served)
        )

    @app.post("/v1/collections/{name}/records", response_model=RecordsUpserted, tags=["records"])
    async def upsert_records(body: UpsertRecordsRequest, name: str = name_path) -> Response:
        """Insert or replace records with the vectors given; creates the collection on first use."""
        vectors = await _amatrix(body.vectors, await dim_of(await existing(name)), "vectors", rows=len(body.ids))
        ids, count = await collections.upsert_vectors(
            name, body.ids, vectors, body.documents, body.metadatas,
            embedder=body.embedder, allow_other_embedder=body.allow_other_embedder,
        )
        return json_response(RecordsUpserted(collection=name, ids=ids, count=count))

    @app.post("/v1/collections/{name}/records/get", response_model=RecordList, tags=["records"])
    async def get_records(body: GetRecordsRequest, name: str = name_path) -> Response:
        """The records of these ids, in the order asked; unknown ids are skipped."""
        collection = await existing(name)
        records = [] if collection is None or not body.ids else await collection.index.aget(body.ids)
        return json_response(RecordList(collection=name, data=[_record(r, body.encoding_format) for r in records]))

    @app.post("/v1/collections/{name}/records/delete", response_model=RecordsDeleted, tags=["records"])
    async def delete_records(body: DeleteRecordsRequest, name: str = name_path) -> Response:
        """Delete records by id (logged first under a data dir); unknown ids are ignored."""
        deleted = count = 0
        if body.ids and await existing(name) is not None:
            try:
                deleted, count = await collections.delete(name, body.ids)
            except ApiError as exc:  # dropped meanwhile: nothing left to delete
                if exc.status != 404:
                    raise
        return json_response(RecordsDeleted(collection=name, deleted=deleted, count=count))

    @app.post("/v1/collections/{name}/records/ids", response_model=RecordIds, tags=["records"])
    async def record_ids(body: IdsRequest, name: str = name_path) -> Response:
        """Every id in storage order, or those of the records ``filter`` matches."""
        _check_filter(body.filter)
        collection = await existing(name)
        ids = [] if collection is None else await collection.index.aids(body.filter)
        return json_response(RecordIds(collection=name, ids=ids))

    @app.post("/v1/collections/{name}/records/search", response_model=SearchResults, tags=["records"])
    async def search_records(body: SearchRecordsRequest, name: str = name_path) -> Response:
        """Run every search (plain or MMR); the index batches them with all concurrent searches."""
        collection = await existing(name)
        dim = await dim_of(collection)
        plans = []
        for i, search in enumerate(body.searches):
            queries = await _amatrix(search.queries, dim, f"searches[{i}].queries")
            _check_filter(search.filter)
            if search.mmr is not None and queries.shape[0] != 1:
                raise InvalidInputError(
                    f"'searches[{i}].queries' must be one vector for MMR (got {queries.shape[0]}); send one "
                    "search per query."
                )
            plans.append((queries, search))
        if collection is None:
            return json_response(SearchResults(collection=name, results=[
                [[]] if s.mmr is not None else [[] for _ in range(q.shape[0])] for q, s in plans
            ]))
        index = collection.index

        async def run(queries: np.ndarray, search: SearchModel) -> list[list[Hit]]:
            if search.mmr is not None:
                return [await index.ammr(queries, k=search.mmr.k, fetch_k=search.k,
                                         lambda_mult=search.mmr.lambda_mult, filter=search.filter)]
            if queries.shape[0] == 0:
                return []
            return await index.asearch(queries, search.k, filter=search.filter)

        answers = await all_or_none([run(q, s) for q, s in plans])
        return json_response(SearchResults(
            collection=name, results=[[[_hit(h) for h in hits] for hits in answer] for answer in answers]
        ))

    @app.delete("/v1/collections/{name}/records", response_model=RecordsCleared, tags=["records"])
    async def clear_records(name: str = name_path) -> Response:
        """Delete every record and the embedder record: the collection (and its chat sessions) is
        dropped, durably under a data dir; the next upsert creates it again."""
        cleared = await existing(name) is not None
        if cleared:
            try:
                await asyncio.to_thread(collections.drop, name)
            except ApiError as exc:  # dropped meanwhile
                if exc.status != 404:
                    raise
        return json_response(RecordsCleared(collection=name, cleared=cleared))
