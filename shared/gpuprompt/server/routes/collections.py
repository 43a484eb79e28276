"""A collection: one resource, two input forms, one implementation (:class:`Collections`).

The server embeds (texts in):

    POST   /v1/collections/{name}/documents          upsert texts (ids optional)          -> collection.documents
    POST   /v1/collections/{name}/documents/delete   delete by id
    POST   /v1/collections/{name}/query              one text search (k, filter; mode dense | lexical | hybrid)
    POST   /v1/collections/{name}/chat               one RAG turn of a session
    DELETE /v1/collections/{name}/sessions/{id}      forget one chat session

The client embeds, or not (records, the calls of :class:`gpuprompt.remote.RemoteIndex`):

    GET    /v1/collections/{name}/records/info       dim, metric, count, embedder records
    POST   /v1/collections/{name}/records            upsert vectors; or documents without vectors (the server embeds them)
    POST   /v1/collections/{name}/records/get        records by id, in the order asked
    POST   /v1/collections/{name}/records/delete     delete by id (unknown ids ignored)
    POST   /v1/collections/{name}/records/ids        the ids matching a filter
    POST   /v1/collections/{name}/records/search     searches and MMR, many per request, by vectors or by texts;
                                                     lexical (BM25) and hybrid (fused) searches by texts
    DELETE /v1/collections/{name}/records            clear: every record, the embedder record, the sessions

plus ``GET /v1/collections`` and ``DELETE /v1/collections/{name}``. Every write takes the same
capped and (under ``--data-dir``) write-ahead-logged path; every search the index's batched one.
Vectors travel as base64 of little-endian float32 rows (:mod:`gpuprompt.wire`) or as JSON lists.
A collection that does not exist reads as an empty index (count 0, no hits); the first upsert
creates it, with the served embedder's dimension and the cosine metric.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from gpuprompt.bridge import off_loop
from gpuprompt.errors import ContextLengthError, DimensionMismatchError, InvalidInputError
from gpuprompt.rag import asearch_texts, check_retrieval
from gpuprompt.server._collection import Collection, recorded_embedder
from gpuprompt.server._http import all_or_none, json_response, until_disconnect
from gpuprompt.server.errors import ApiError, context_length_error
from gpuprompt.server.schemas.base import MAX_NAME_LENGTH, UsageModel
from gpuprompt.server.schemas.collections import (
    AddDocumentsRequest,
    AddDocumentsResponse,
    CollectionChatRequest,
    CollectionChatResponse,
    CollectionInfo,
    CollectionList,
    DeleteDocumentsRequest,
    DeleteRecordsRequest,
    GetRecordsRequest,
    HitModel,
    IdsRequest,
    QueryRequest,
    QueryResponse,
    RecordIds,
    RecordList,
    RecordModel,
    RecordsCleared,
    RecordsDeleted,
    RecordsInfo,
    RecordsUpserted,
    SearchModel,
    SearchRecordsRequest,
    SearchResults,
    StageTimingsModel,
    UpsertRecordsRequest,
    Vectors,
)
from gpuprompt.server.state import ServerState, State
from gpuprompt.wire import COLLECTION_NAME_PATTERN, COLLECTIONS, V1, decode_vectors, encode_vectors

if TYPE_CHECKING:
    from gpuprompt.index import Hit, Record

__all__ = ["router"]

router = APIRouter()

NAME = Path(pattern=COLLECTION_NAME_PATTERN, description="the collection's name")
SESSION = Path(min_length=1, max_length=MAX_NAME_LENGTH, description="the session's id")
_INLINE_BYTES = 1 << 20  # vectors decoded on the event loop up to this size; larger in a worker thread


async def _existing(server: ServerState, name: str) -> Collection | None:
    """The collection ``name``, or None (an absent collection reads as empty)."""
    collections = server.collections
    try:
        if collections.vector_uri is None:
            return collections.get(name)
        return await asyncio.to_thread(collections.get, name)  # may look the collection up in Milvus
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


async def _dim_of(server: ServerState, collection: Collection | None) -> int:
    if collection is not None:
        return collection.index.dim
    return (await server.embedder.aload()).dim  # loads the model off the loop if not preloaded


async def _queries(server: ServerState, search: SearchModel, dim: int, where: str) -> np.ndarray | Any:
    """A search's query rows: the vectors given, or its texts embedded by the served embedder (none
    for a lexical search)."""
    if search.queries is not None:
        rows = await _amatrix(search.queries, dim, f"{where}.queries")
        if search.mode == "hybrid" and search.texts is not None and rows.shape[0] != len(search.texts):
            raise InvalidInputError(f"'{where}.texts' must hold one text per query vector ({rows.shape[0]}) (got "
                                    f"{len(search.texts)}): the lexical leg of each query searches its own text.")
        return rows
    assert search.texts is not None
    if not search.texts or search.mode == "lexical":
        return np.zeros((0, dim), dtype=np.float32)
    return await server.embedder.aembed_tensor(search.texts)


# ---------------------------------------------------------------------- the collections
@router.get(V1 + COLLECTIONS, response_model=CollectionList, tags=["collections"])
async def list_collections(server: State) -> Response:
    """Every collection with its record count."""
    counts = await asyncio.to_thread(server.collections.counts)  # a Milvus count is a query: off the loop
    return json_response(CollectionList(data=[CollectionInfo(name=n, count=c) for n, c in counts]))


@router.delete(V1 + COLLECTIONS + "/{name}", tags=["collections"])
async def drop_collection(server: State, name: str = NAME) -> Response:
    """Forget a collection, its records and its sessions."""
    await asyncio.to_thread(server.collections.drop, name)
    return Response(json.dumps({"object": "collection.deleted", "name": name, "deleted": True}),
                    media_type="application/json")


# ---------------------------------------------------------------------- texts in: the server embeds
@router.post(V1 + COLLECTIONS + "/{name}/documents", response_model=AddDocumentsResponse, tags=["collections"])
async def add_documents(server: State, body: AddDocumentsRequest, name: str = NAME) -> Response:
    """Upsert texts (with optional ids and metadata); the server embeds them. Creates the
    collection on first use."""
    ids, count = await server.collections.upsert(name, body.documents, body.ids, body.metadatas)
    tokens = sum(await server.count_tokens(body.documents))
    return json_response(
        AddDocumentsResponse(collection=name, ids=ids, count=count,
                             usage=UsageModel(prompt_tokens=tokens, total_tokens=tokens))
    )


@router.post(V1 + COLLECTIONS + "/{name}/documents/delete", tags=["collections"])
async def delete_documents(server: State, body: DeleteDocumentsRequest, name: str = NAME) -> Response:
    """Delete records by id (unknown ids are ignored)."""
    deleted, count = await server.collections.delete(name, body.ids)
    return Response(
        json.dumps({"object": "collection.documents.deleted", "collection": name, "deleted": deleted, "count": count}),
        media_type="application/json",
    )


@router.post(V1 + COLLECTIONS + "/{name}/query", response_model=QueryResponse, tags=["collections"])
async def query(server: State, body: QueryRequest, name: str = NAME) -> Response:
    """Search one text with an optional metadata filter, by its embedding (``mode="dense"``), its
    words (``"lexical"``: BM25 over the stored documents) or both fused (``"hybrid"``, ``alpha``);
    batched with concurrent searches."""
    collection = server.collections.get(name)
    _check_filter(body.filter)  # a bad filter fails before any model work
    retrieval = check_retrieval(body.mode, alpha=body.alpha)
    if retrieval.mode != "dense" and not body.query.strip():
        raise InvalidInputError(f"'query' must hold words for mode {retrieval.mode!r} to match (got {body.query!r}); "
                                "a blank query matches nothing.")
    hits = (await asearch_texts(collection.index, server.embedder, [body.query], body.k, body.filter, retrieval))[0]
    return json_response(QueryResponse(collection=name, hits=[_hit(h) for h in hits]))


@router.post(V1 + COLLECTIONS + "/{name}/chat", response_model=CollectionChatResponse, tags=["collections"])
async def collection_chat(server: State, body: CollectionChatRequest, request: Request, name: str = NAME) -> Response:
    """One RAG turn: retrieve from the collection, add the session's history, generate, remember."""
    llm = server.require_llm()  # 404 naming --chat-model on a server with none
    collection = server.collections.get(name)
    _check_filter(body.filter)
    assert collection.rag is not None  # a server with a chat model gives every collection a pipeline
    try:
        outcome = await until_disconnect(
            request,
            collection.rag.aanswer(collection.session_key(body.session_id), body.question, k=body.k,
                                   filter=body.filter, max_tokens=body.max_tokens,
                                   retrieval=check_retrieval(body.mode, alpha=body.alpha)),
        )
    except ContextLengthError as exc:  # the field at fault here is the question, not 'messages'
        raise context_length_error(exc, "question") from exc
    if isinstance(outcome, Response):
        return outcome
    answer = outcome
    t = answer.timings
    for stage, seconds in (("embed", t.embed_s), ("retrieve", t.retrieve_s), ("context", t.context_s),
                           ("generate", t.generate_s), ("total", t.total_s)):
        server.metrics.stage_latency.labels(stage).observe(seconds)
    usage = answer.usage
    return json_response(
        CollectionChatResponse(
            id=f"ragchat-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=server.served_name("chat"),
            collection=name,
            session_id=body.session_id,
            answer=answer.answer,
            sources=[_hit(h) for h in answer.sources],
            history_turns=len(answer.history),
            finish_reason=answer.finish_reason,
            usage=UsageModel(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                             total_tokens=usage.total_tokens),
            timings=StageTimingsModel(embed_s=t.embed_s, retrieve_s=t.retrieve_s, context_s=t.context_s,
                                      generate_s=t.generate_s, total_s=t.total_s),
        )
    )


@router.delete(V1 + COLLECTIONS + "/{name}/sessions/{session_id}", tags=["collections"])
async def clear_session(server: State, session_id: str = SESSION, name: str = NAME) -> Response:
    """Forget one conversation's history in a collection."""
    collection = server.collections.get(name)
    server.memory.clear(collection.session_key(session_id))
    return Response(json.dumps({"object": "session.deleted", "collection": name, "session_id": session_id,
                                "deleted": True}), media_type="application/json")


# ---------------------------------------------------------------------- records: vectors in (or texts)
@router.get(V1 + COLLECTIONS + "/{name}/records/info", response_model=RecordsInfo, tags=["records"])
async def records_info(server: State, name: str = NAME) -> Response:
    """The collection's dimension, metric, count and embedder records (an absent one is empty)."""
    collection = await _existing(server, name)
    served = await off_loop(lambda: server.embedder.identity)
    if collection is None:
        return json_response(RecordsInfo(collection=name, exists=False, count=0, dim=await _dim_of(server, None),
                                         metric="cosine", embedder=None, server_embedder=served))
    index = collection.index
    return json_response(
        RecordsInfo(collection=name, exists=True, count=await server.collections.count(collection), dim=index.dim,
                    metric=index.metric, embedder=await off_loop(recorded_embedder, index),
                    server_embedder=served)
    )

@router.post(V1 + COLLECTIONS + "/{name}/records", response_model=RecordsUpserted, tags=["records"])
async def upsert_records(server: State, body: UpsertRecordsRequest, name: str = NAME) -> Response:
    """Insert or replace records with the vectors given; creates the collection on first use."""
    if body.vectors is None:  # the server embeds the documents: the /documents path
        assert body.documents is not None
        ids, count = await server.collections.upsert(name, [d or "" for d in body.documents], body.ids,
                                                     body.metadatas)
        return json_response(RecordsUpserted(collection=name, ids=ids, count=count))
    vectors = await _amatrix(body.vectors, await _dim_of(server, await _existing(server, name)), "vectors",
                             rows=len(body.ids))
    ids, count = await server.collections.upsert_vectors(
        name, body.ids, vectors, body.documents, body.metadatas,
        embedder=body.embedder, allow_other_embedder=body.allow_other_embedder,
    )
    return json_response(RecordsUpserted(collection=name, ids=ids, count=count))

@router.post(V1 + COLLECTIONS + "/{name}/records/get", response_model=RecordList, tags=["records"])
async def get_records(server: State, body: GetRecordsRequest, name: str = NAME) -> Response:
    """The records of these ids, in the order asked; unknown ids are skipped."""
    collection = await _existing(server, name)
    records = [] if collection is None or not body.ids else await collection.index.aget(body.ids)
    return json_response(RecordList(collection=name, data=[_record(r, body.encoding_format) for r in records]))

@router.post(V1 + COLLECTIONS + "/{name}/records/delete", response_model=RecordsDeleted, tags=["records"])
async def delete_records(server: State, body: DeleteRecordsRequest, name: str = NAME) -> Response:
    """Delete records by id (logged first under a data dir); unknown ids are ignored."""
    deleted = count = 0
    if body.ids and await _existing(server, name) is not None:
        try:
            deleted, count = await server.collections.delete(name, body.ids)
        except ApiError as exc:  # dropped meanwhile: nothing left to delete
            if exc.status != 404:
                raise
    return json_response(RecordsDeleted(collection=name, deleted=deleted, count=count))

@router.post(V1 + COLLECTIONS + "/{name}/records/ids", response_model=RecordIds, tags=["records"])
async def record_ids(server: State, body: IdsRequest, name: str = NAME) -> Response:
    """Every id in storage order, or those of the records ``filter`` matches."""
    _check_filter(body.filter)
    collection = await _existing(server, name)
    ids = [] if collection is None else await collection.index.aids(body.filter)
    return json_response(RecordIds(collection=name, ids=ids))

@router.post(V1 + COLLECTIONS + "/{name}/records/search", response_model=SearchResults, tags=["records"])
async def search_records(server: State, body: SearchRecordsRequest, name: str = NAME) -> Response:
    """Run every search (plain or MMR); the index batches them with all concurrent searches."""
    collection = await _existing(server, name)
    dim = await _dim_of(server, collection)
    plans = []
    for i, search in enumerate(body.searches):
        _check_filter(search.filter)
        count = len(search.texts) if search.texts is not None else None
        if search.mmr is not None and count is not None and count != 1:
            raise InvalidInputError(f"'searches[{i}].texts' must be one text for MMR (got {count}); send one "
                                    "search per query.")
        queries = await _queries(server, search, dim, f"searches[{i}]")
        if search.mmr is not None and queries.shape[0] != 1:
            raise InvalidInputError(
                f"'searches[{i}].queries' must be one vector for MMR (got {queries.shape[0]}); send one "
                "search per query."
            )
        if search.mode != "dense":
            check_retrieval(search.mode, alpha=search.alpha, fusion=search.fusion, fetch_k=search.fetch_k,
                            rrf_k=search.rrf_k)
        plans.append((queries, search))
    if collection is None:
        return json_response(SearchResults(collection=name, results=[
            [[]] if s.mmr is not None else [[] for _ in range(len(s.texts) if s.mode == "lexical" else q.shape[0])]
            for q, s in plans
        ]))
    index = collection.index

    async def run(queries: np.ndarray, search: SearchModel) -> list[list[Hit]]:
        if search.mode == "lexical":
            return await index.alexical_search(search.texts, search.k, search.filter) if search.texts else []
        if search.mode == "hybrid":
            if queries.shape[0] == 0:
                return []
            return await index.ahybrid_search(queries, search.texts, search.k, search.filter, alpha=search.alpha,
                                              fusion=search.fusion, fetch_k=search.fetch_k, rrf_k=search.rrf_k)
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

@router.delete(V1 + COLLECTIONS + "/{name}/records", response_model=RecordsCleared, tags=["records"])
async def clear_records(server: State, name: str = NAME) -> Response:
    """Delete every record and the embedder record: the collection (and its chat sessions) is
    dropped, durably under a data dir; the next upsert creates it again."""
    cleared = await _existing(server, name) is not None
    if cleared:
        try:
            await asyncio.to_thread(server.collections.drop, name)
        except ApiError as exc:  # dropped meanwhile
            if exc.status != 404:
                raise
    return json_response(RecordsCleared(collection=name, cleared=cleared))


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
