"""Pydantic models of a collection, one resource with two input forms: texts the server embeds
(``/documents``, ``/query``, ``/chat``, and ``records`` upserts without vectors, searches by
``texts``) and vectors a client computed (``records``: upsert, get, delete, ids, search, MMR)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictFloat, field_validator, model_validator

from gpuprompt.server.schemas.base import (
    ChatK,
    FilterObject,
    Metadata,
    Name,
    QueryK,
    Text,
    TokenCount,
    UsageModel,
    _int,
    _number,
    _Strict,
)
from gpuprompt.validation import INT64_MAX
from gpuprompt.wire import (
    MAX_DOCUMENTS_PER_REQUEST,
    MAX_IDS_PER_REQUEST,
    MAX_RECORD_ID_LENGTH,
    MAX_RECORDS_PER_REQUEST,
    MAX_SEARCHES_PER_REQUEST,
)

__all__ = [
    "AddDocumentsRequest",
    "AddDocumentsResponse",
    "CollectionChatRequest",
    "CollectionChatResponse",
    "CollectionInfo",
    "CollectionList",
    "DeleteDocumentsRequest",
    "DeleteRecordsRequest",
    "GetRecordsRequest",
    "HitModel",
    "IdsRequest",
    "QueryRequest",
    "QueryResponse",
    "RecordIds",
    "RecordList",
    "RecordModel",
    "RecordsCleared",
    "RecordsDeleted",
    "RecordsInfo",
    "RecordsUpserted",
    "SearchModel",
    "SearchRecordsRequest",
    "SearchResults",
    "StageTimingsModel",
    "UpsertRecordsRequest",
    "Vectors",
]

_MAX_EMBEDDER_LENGTH = 512  # as the core's check_embedder_name

class HitModel(BaseModel):
    """One retrieved record."""

    id: str
    """The record's id."""
    score: float
    """Cosine similarity (higher is better)."""
    document: str | None = None
    """The record's text."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """The record's metadata."""


class AddDocumentsRequest(_Strict):
    """``POST /v1/collections/{name}/documents``: upsert texts (embedded by the server)."""

    documents: list[Text] = Field(min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST)
    """The texts (at most ``MAX_DOCUMENTS_PER_REQUEST`` per request)."""
    ids: list[Name] | None = None
    """One id per text (an existing id is replaced); None generates ids."""
    metadatas: list[Metadata] | None = None
    """One metadata object per text (JSON values, nested at most ``MAX_DEPTH`` deep), or None."""

    @field_validator("ids")
    @classmethod
    def _ids(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("must not repeat an id within one request")
        return value

    @model_validator(mode="after")
    def _lengths(self) -> AddDocumentsRequest:
        n = len(self.documents)
        if self.ids is not None and len(self.ids) != n:
            raise ValueError(f"'ids' must hold one id per document ({n}) (got {len(self.ids)})")
        if self.metadatas is not None and len(self.metadatas) != n:
            raise ValueError(f"'metadatas' must hold one entry per document ({n}) (got {len(self.metadatas)})")
        return self


class AddDocumentsResponse(BaseModel):
    """The answer to an upsert."""

    object: Literal["collection.documents"] = "collection.documents"
    collection: str
    ids: list[str]
    """The ids of the upserted records, in request order."""
    count: int
    """Records in the collection now."""
    usage: UsageModel


class DeleteDocumentsRequest(_Strict):
    """``POST /v1/collections/{name}/documents/delete``: delete records by id."""

    ids: list[Name] = Field(min_length=1)
    """The ids to delete; unknown ids are ignored."""


Mode = Literal["dense", "lexical", "hybrid"]
"""How a text is searched: by its embedding, by its words (BM25), or both, fused."""
Alpha = _number(0.0, 1.0)
"""The dense leg's weight of a weighted fusion: 1 dense only, 0 lexical only."""


class _Retrieval(_Strict):
    """The retrieval fields of a text search (query, chat)."""

    mode: Mode = "dense"
    """``dense`` (embedding), ``lexical`` (BM25 over the stored documents) or ``hybrid`` (both, fused)."""
    alpha: Alpha | None = None  # type: ignore[valid-type]
    """Hybrid: weighted fusion with this dense weight; None: reciprocal rank fusion."""

    @model_validator(mode="after")
    def _alpha_is_hybrid(self) -> _Retrieval:
        if self.alpha is not None and self.mode != "hybrid":
            raise ValueError("'alpha' weighs the legs of mode 'hybrid' (got mode "
                             f"{self.mode!r}); drop alpha or search with mode='hybrid'")
        return self


class QueryRequest(_Retrieval):
    """``POST /v1/collections/{name}/query``: a text search (dense, lexical or hybrid)."""

    query: Annotated[Text, Field(min_length=1)]
    """The query text."""
    k: QueryK = 4
    """Most hits."""
    filter: FilterObject | None = None
    """A metadata filter in the core's language, e.g. ``{"price": {"$lt": 100}}`` (both legs)."""


class QueryResponse(BaseModel):
    """The answer to a query."""

    object: Literal["collection.query"] = "collection.query"
    collection: str
    hits: list[HitModel]
    """Best first."""


class CollectionChatRequest(_Retrieval):
    """``POST /v1/collections/{name}/chat``: one RAG turn in a session."""

    session_id: Name
    """The conversation; its earlier turns are remembered by the server."""
    question: Annotated[Text, Field(min_length=1)]
    """The user's message."""
    k: ChatK | None = None
    """Documents retrieved (default: the server's ``rag_k``)."""
    filter: FilterObject | None = None
    """A metadata filter for the retrieval."""
    max_tokens: TokenCount | None = None
    """Most tokens in the answer."""


class StageTimingsModel(BaseModel):
    """Seconds per stage."""

    embed_s: float
    retrieve_s: float
    context_s: float
    generate_s: float
    total_s: float


class CollectionChatResponse(BaseModel):
    """The answer to one RAG turn."""

    id: str
    object: Literal["collection.chat"] = "collection.chat"
    created: int
    model: str
    collection: str
    session_id: str
    answer: str
    sources: list[HitModel]
    """The documents given to the model, best first."""
    history_turns: int
    """Earlier turns of the session given to the model."""
    finish_reason: str
    usage: UsageModel
    timings: StageTimingsModel


class CollectionInfo(BaseModel):
    """One collection."""

    name: str
    count: int
    """Records stored."""


class CollectionList(BaseModel):
    """``GET /v1/collections``."""

    object: Literal["list"] = "list"
    data: list[CollectionInfo]


# ---------------------------------------------------------------------- records
RecordId = Annotated[Text, Field(min_length=1, max_length=MAX_RECORD_ID_LENGTH)]
"""A record id to store: non-empty, well-formed."""
AnyId = Annotated[Text, Field(max_length=MAX_RECORD_ID_LENGTH)]
"""A record id to look up (any well-formed str: one never stored is simply not found)."""
K = _int(1, INT64_MAX)
RrfK = _int(1, 2**31 - 1)
"""A number of hits (larger than the collection means all of it)."""
Weight = _number(0.0, 1.0)
"""MMR's ``lambda_mult``."""
Vectors = str | list[list[StrictFloat]]
"""Rows of float32: base64 of their little-endian bytes (``n * dim * 4`` bytes), or JSON lists of
numbers (finite; no strings or bools)."""


# ---------------------------------------------------------------------- requests
class UpsertRecordsRequest(_Strict):
    """``POST /v1/collections/{name}/records``: insert or replace records, with the vectors a
    client computed, or without vectors: then the server embeds the documents (as ``/documents``)."""

    ids: list[RecordId] = Field(min_length=1, max_length=MAX_RECORDS_PER_REQUEST)
    """One distinct id per record (an existing id is replaced)."""
    vectors: Vectors | None = None
    """``len(ids)`` rows of the collection's dimension; None: the server embeds ``documents``."""
    documents: list[Text | None] | None = None
    """One text or None per record, or None (required, and without None, when ``vectors`` is None)."""
    metadatas: list[Metadata] | None = None
    """One metadata object (or None) per record, or None."""
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
        if self.vectors is None:
            if self.documents is None or any(d is None for d in self.documents):
                raise ValueError("without 'vectors' the server embeds 'documents': give one text per id (no null)")
            if self.embedder is not None or self.allow_other_embedder:
                raise ValueError("'embedder' and 'allow_other_embedder' describe given vectors: without 'vectors' "
                                 "the server embeds the documents with its own embedder")
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
    """One search: query vectors and / or query texts, ``k``, filter, and for MMR the re-ranking, for
    hybrid the fusion."""

    queries: Vectors | None = None
    """Query rows of the collection's dimension (exactly one for MMR); None: ``texts`` are embedded by
    the server (dense, hybrid) or searched by their words (lexical)."""
    texts: list[Text] | None = Field(default=None, max_length=MAX_RECORDS_PER_REQUEST)
    """Query texts: embedded by the server (dense without ``queries``), or the lexical leg's queries
    (lexical, hybrid: one per query vector when both are given)."""
    k: K
    """Hits per query (for MMR: the candidates fetched)."""
    filter: FilterObject | None = None
    """A metadata filter in the core's language, or None (a pre-filter of both legs)."""
    mmr: MMRModel | None = None
    """Re-rank the candidates by MMR (one query, dense), or None for a plain search."""
    mode: Mode = "dense"
    """``dense``, ``lexical`` (BM25 over the documents) or ``hybrid`` (both legs, fused)."""
    alpha: Alpha | None = None  # type: ignore[valid-type]
    """Hybrid: the dense leg's weight of a weighted fusion (1 dense only, 0 lexical only); None: RRF."""
    fusion: Literal["rrf", "weighted"] | None = None
    """Hybrid: ``rrf`` or ``weighted`` (None: weighted with ``alpha``, else rrf)."""
    fetch_k: K | None = None
    """Hybrid: candidates each leg fetches (default ``max(20, 4 * k)``)."""
    rrf_k: RrfK = 60
    """Hybrid: the reciprocal rank fusion constant."""

    @model_validator(mode="after")
    def _one_form(self) -> SearchModel:
        if self.mode == "dense" and (self.queries is None) == (self.texts is None):
            raise ValueError("give either 'queries' (vectors) or 'texts' (embedded by the server), not both or neither")
        if self.mode != "dense":
            if self.texts is None:
                raise ValueError(f"mode {self.mode!r} searches 'texts' by their words: give them")
            if self.mode == "lexical" and self.queries is not None:
                raise ValueError("mode 'lexical' takes no 'queries' vectors: drop them, or use mode 'hybrid'")
            if self.mmr is not None:
                raise ValueError(f"'mmr' re-ranks a dense search; mode {self.mode!r} takes none")
        elif any(v is not None for v in (self.alpha, self.fusion, self.fetch_k)) or self.rrf_k != 60:
            raise ValueError("'alpha', 'fusion' and 'fetch_k' fuse the legs of mode 'hybrid'")
        return self


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
