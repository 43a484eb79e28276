"""Pydantic request and response models of the HTTP API.

The OpenAI-compatible requests ignore unknown fields (builders send vendor extras); every known
field that changes the output reaches the core or is refused (see ``_schemas_chat.py`` for the
generating routes). Our own collection requests forbid unknown fields.

Every request field is bounded here, at the boundary (rule 10): ints and floats have ranges the
core and every backend accept (no NaN or infinity), every string must be well-formed Unicode (a
JSON escape such as ``"\\ud800"`` decodes to a lone surrogate that no UTF-8 writer accepts), and
free-form JSON (metadata, filters, schemas) goes through :func:`gpuprompt.validation.check_json`,
which bounds its nesting and size. A request that passes these models cannot make the core fail
with anything but its own typed errors.

In the OpenAI-compatible requests (and their nested objects) an explicit JSON ``null`` in an
optional field means exactly what leaving the field out means: the field takes its default (OpenAI's
spec marks these fields nullable, and some SDKs and hand-written clients send ``null`` for "the
default"), so no code past these models sees None where the default is not None. A required field
(``messages``, ``prompt``, ``input``) still refuses ``null`` with a 400.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from gpuprompt.batching import PRIORITY_MAX, PRIORITY_MIN, check_priority
from gpuprompt.validation import (
    INT64_MAX,
    INT64_MIN,
    MAX_DEPTH,
    check_int,
    check_json,
    check_metadata,
    check_number,
    check_text,
)
from gpuprompt.wire import MAX_DOCUMENTS_PER_REQUEST, MAX_EMBEDDING_INPUTS, MAX_TOKENS_LIMIT

__all__ = [
    "AddDocumentsRequest",
    "AddDocumentsResponse",
    "CollectionChatRequest",
    "CollectionChatResponse",
    "CollectionInfo",
    "CollectionList",
    "DeleteDocumentsRequest",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "HealthResponse",
    "HitModel",
    "ModelCard",
    "ModelList",
    "QueryRequest",
    "QueryResponse",
    "UsageModel",
]

MAX_NAME_LENGTH = 256
"""Longest session id or record id."""
MAX_MODEL_NAME_LENGTH = 4096
"""Longest ``model`` (a served model may be named by its local path)."""
MAX_STOP = 16
"""Most stop strings (OpenAI allows 4; vLLM more)."""


def _run(check: Callable[..., Any], **options: Any) -> Callable[[Any], Any]:
    """Wrap one of the core's checks for pydantic (the rule lives once, in the core).

    The check's message names the argument ``'$'`` (``'$' must be ...``); the server's error
    renderer replaces that name with the request field's path.
    """

    def run(value: Any) -> Any:
        return check(value, "$", **options)

    run.__name__ = check.__name__
    return run


def _core(check: Callable[..., Any], **options: Any) -> AfterValidator:
    """A validator running a core check on the value pydantic parsed."""
    return AfterValidator(_run(check, **options))


def _int(low: int, high: int, check: Callable[..., Any] = check_int) -> Any:
    """An int field in ``[low, high]``, checked by the core before pydantic's lax parsing: bools,
    floats and numeric strings are refused (OpenAI refuses them too); the range shows in the
    OpenAPI schema."""
    options = {"min": low, "max": high} if check is check_int else {}
    return Annotated[int, Field(ge=low, le=high), BeforeValidator(_run(check, **options))]


def _number(low: float, high: float) -> Any:
    """A finite float field in ``[low, high]`` (ints accepted; NaN, infinity, bools and strings refused)."""
    return Annotated[float, Field(ge=low, le=high), BeforeValidator(_run(check_number, min=low, max=high))]


def _json_object(value: dict[str, Any] | None) -> dict[str, Any] | None:
    # A detached copy with bounded nesting and size, int64 ints, finite floats, clean strings.
    return None if value is None else check_json(value, "$", max_depth=MAX_DEPTH)


Text = Annotated[str, _core(check_text)]
"""A well-formed Unicode string (no lone surrogates)."""
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH), _core(check_text)]
"""A non-empty, bounded, well-formed name."""
ModelName = Annotated[str, Field(max_length=MAX_MODEL_NAME_LENGTH), _core(check_text)]
"""The ``model`` field: a served model's id, last path segment or (non-strict) any name."""
JSONObject = Annotated[dict[str, Any], AfterValidator(_json_object)]
"""A JSON object (str keys) nested at most ``MAX_DEPTH`` deep, with int64 ints and finite floats."""


def _filter_object(value: dict[str, Any] | None) -> dict[str, Any] | None:
    # As a JSON object, but ints of any size: the core compares filter operands exactly, so a
    # filter the index takes in process is taken here too (``{"n": {"$lt": 2**70}}``).
    return None if value is None else check_json(value, "$", max_depth=MAX_DEPTH, int64=False)


FilterObject = Annotated[dict[str, Any], AfterValidator(_filter_object)]
"""A metadata filter in the core's language: a JSON object as :data:`JSONObject`, any int size."""
Metadata = Annotated[dict[str, Any] | None, _core(check_metadata)]
"""A record's metadata: a JSON object (``None`` becomes ``{}``)."""
TokenCount = _int(1, MAX_TOKENS_LIMIT)
"""A number of tokens to generate."""
Seed = _int(INT64_MIN, INT64_MAX)
"""A sampling seed: any int64 (OpenAI's range; torch and vLLM take it)."""
Priority = _int(PRIORITY_MIN, PRIORITY_MAX, check_priority)
"""A scheduling priority, lower first: the core's :data:`~gpuprompt.batching.PRIORITY_MIN` to
:data:`~gpuprompt.batching.PRIORITY_MAX` (checked by :func:`~gpuprompt.batching.check_priority`)."""
Choices = _int(1, 16)
"""``n``: choices per completion."""
QueryK = _int(1, 1000)
"""Hits per collection query."""
ChatK = _int(1, 100)
"""Documents retrieved per collection chat turn."""
Dimensions = _int(1, 2**16)
"""An embedding dimension."""
Temperature = _number(0.0, 2.0)
"""OpenAI's sampling temperature range."""
TopP = _number(0.0, 1.0)
"""Nucleus sampling mass."""


class _Request(BaseModel):
    # NaN and infinity (JSON's NaN / Infinity / 1e999) are refused in every float field.
    model_config = ConfigDict(allow_inf_nan=False)


@cache
def _optional_keys(model: type[BaseModel]) -> frozenset[str]:
    """The JSON keys of ``model``'s optional fields (those with a default), by alias where one is set.

    Args:
        model: A request model class.

    Returns:
        The keys an explicit ``null`` may be dropped from.
    """
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        if not info.is_required():
            alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
            keys.add(alias or name)
    return frozenset(keys)


class _OpenAIRequest(_Request):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """Drop the optional fields sent as ``null``, so they take their defaults as if omitted.

        OpenAI's spec marks its optional request fields nullable and clients send ``null`` for "the
        default"; a field whose default is not None (``temperature``, ``n``, ``stream``, ...) must
        then get that default, never None, and its non-null values keep their checks. Required
        fields are left alone, so a ``null`` there is still refused.

        Args:
            data: The raw input of the model (a JSON object, or anything a client sent instead).

        Returns:
            ``data`` without its optional ``null`` entries (``data`` itself when it has none, or
            when it is not an object: the model's own checks refuse that).
        """
        if not isinstance(data, dict):
            return data
        optional = _optional_keys(cls)
        if not any(value is None and key in optional for key, value in data.items()):
            return data
        return {key: value for key, value in data.items() if not (value is None and key in optional)}


class _Strict(_Request):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---------------------------------------------------------------------- shared
class UsageModel(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    """Tokens read (the rendered prompt, or the embedded texts)."""
    completion_tokens: int = 0
    """Tokens generated."""
    total_tokens: int
    """Their sum."""


class ModelCard(BaseModel):
    """One served model, as ``GET /v1/models`` lists it."""

    id: str
    """The name to pass as ``model``."""
    object: Literal["model"] = "model"
    created: int
    """When the server started (Unix seconds)."""
    owned_by: str = "gpuprompt"
    """Who serves it."""


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
    """The served models: the chat model, then the embedding model."""


# ---------------------------------------------------------------------- embeddings
class EmbeddingRequest(_OpenAIRequest):
    """``POST /v1/embeddings``."""

    input: Text | list[Text] | list[int] | list[list[int]]
    """A text or a list of texts; token ids (tiktoken ``cl100k_base``) are read back to text when exact."""
    model: ModelName | None = None
    """The embedding model (see ``GET /v1/models``); None for the served one."""
    encoding_format: Literal["float", "base64"] = "float"
    """``"float"`` lists, or ``"base64"`` of little-endian float32 bytes."""
    dimensions: Dimensions | None = None
    """Must equal the model's dimension when given (no truncation)."""
    user: Text | None = None
    """Ignored."""

    @field_validator("input")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("must hold at least one text (got an empty list)")
            if len(value) > MAX_EMBEDDING_INPUTS:
                raise ValueError(f"must hold at most {MAX_EMBEDDING_INPUTS} texts (got {len(value)}); split the request")
        return value


class EmbeddingItem(BaseModel):
    """One embedding."""

    object: Literal["embedding"] = "embedding"
    index: int
    """The input's position."""
    embedding: list[float] | str
    """The vector (float list, or base64 float32)."""


class EmbeddingResponse(BaseModel):
    """The answer to ``POST /v1/embeddings``."""

    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: UsageModel


# ---------------------------------------------------------------------- collections
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


class QueryRequest(_Strict):
    """``POST /v1/collections/{name}/query``: similarity search."""

    query: Annotated[Text, Field(min_length=1)]
    """The query text."""
    k: QueryK = 4
    """Most hits."""
    filter: FilterObject | None = None
    """A metadata filter in the core's language, e.g. ``{"price": {"$lt": 100}}``."""


class QueryResponse(BaseModel):
    """The answer to a query."""

    object: Literal["collection.query"] = "collection.query"
    collection: str
    hits: list[HitModel]
    """Best first."""


class CollectionChatRequest(_Strict):
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


class HealthResponse(BaseModel):
    """``GET /health``."""

    status: Literal["ok"] = "ok"
    chat_model: str
    embedding_model: str
    embedder_identity: str | None = None
    """The identity an index records for this server's vectors (model, ``;int8`` when quantised);
    None until the embedder has loaded."""
    llm_backend: str
    device: str
    collections: int
    in_flight: int
    uptime_s: float
