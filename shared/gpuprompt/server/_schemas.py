"""Pydantic request and response models of the HTTP API.

The OpenAI-compatible requests ignore unknown fields (clients send ``user``, ``store``,
``presence_penalty``, ... that change nothing here); our own collection requests forbid them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "AddDocumentsRequest",
    "AddDocumentsResponse",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatMessage",
    "DeleteDocumentsRequest",
    "CollectionChatRequest",
    "CollectionChatResponse",
    "CollectionInfo",
    "CollectionList",
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

MAX_EMBEDDING_INPUTS = 2048
"""Most inputs per embeddings request (OpenAI's limit)."""


class _OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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

    input: str | list[str] | list[int] | list[list[int]]
    """A text or a list of texts (token-id input is refused: the server has no client tokenizer)."""
    model: str | None = None
    """The embedding model (see ``GET /v1/models``); None for the served one."""
    encoding_format: Literal["float", "base64"] = "float"
    """``"float"`` lists, or ``"base64"`` of little-endian float32 bytes."""
    dimensions: int | None = Field(default=None, ge=1)
    """Must equal the model's dimension when given (no truncation)."""
    user: str | None = None
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


# ---------------------------------------------------------------------- chat completions
class ChatMessage(_OpenAIRequest):
    """One chat message (``developer`` counts as ``system``)."""

    role: Literal["system", "developer", "user", "assistant"]
    """Who said it. Tool messages are not supported."""
    content: str | list[dict[str, Any]] | None = None
    """The text, or a list of ``{"type": "text", "text": ...}`` parts."""
    name: str | None = None
    """Ignored."""

    @field_validator("content")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        if isinstance(value, list):
            for index, part in enumerate(value):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(
                        f"part [{index}] must be {{'type': 'text', 'text': str}} (got type {part.get('type')!r}); "
                        "this server takes text only"
                    )
        return value

    def text(self) -> str:
        """The content as one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part["text"] for part in self.content)


class StreamOptions(_OpenAIRequest):
    """Streaming options."""

    include_usage: bool = False
    """Send a last chunk with the usage (and empty ``choices``)."""


class JSONSchemaSpec(_OpenAIRequest):
    """OpenAI's ``json_schema`` response format body."""

    name: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_OpenAIRequest):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema': {'name': ..., 'schema': {...}}")
        return self


class ChatCompletionRequest(_OpenAIRequest):
    """``POST /v1/chat/completions``."""

    model: str | None = None
    """The chat model (see ``GET /v1/models``); None for the served one."""
    messages: list[ChatMessage] = Field(min_length=1)
    """The conversation so far."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most tokens to generate (deprecated by OpenAI in favour of ``max_completion_tokens``)."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """Most tokens to generate; wins over ``max_tokens``."""
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """0 for greedy decoding."""
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)
    """Nucleus sampling mass."""
    stop: str | list[str] | None = None
    """Up to 16 strings that end generation."""
    seed: int | None = None
    """Sampling seed."""
    n: int = Field(default=1, ge=1, le=16)
    """Choices to generate (1 when streaming)."""
    stream: bool = False
    """Answer with server-sent events."""
    stream_options: StreamOptions | None = None
    """``{"include_usage": true}`` for a usage chunk at the end of a stream."""
    response_format: ResponseFormat | None = None
    """Constrain the output to JSON (guided decoding; needs the vLLM backend)."""
    tools: list[dict[str, Any]] | None = None
    """Refused when non-empty: this server does not call tools."""
    logprobs: bool | None = None
    """Refused when true."""
    priority: int = 0
    """gpuprompt extension: lower is served first when the engine is busy."""

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > 16:
            raise ValueError(f"must hold at most 16 strings (got {len(value)})")
        return value


class ChatChoiceMessage(BaseModel):
    """The generated message."""

    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    """One choice."""

    index: int
    message: ChatChoiceMessage
    finish_reason: str
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    """The answer to a non-streaming ``POST /v1/chat/completions``."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageModel
    system_fingerprint: str | None = None


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

    documents: list[str] = Field(min_length=1)
    """The texts."""
    ids: list[str] | None = None
    """One id per text (an existing id is replaced); None generates ids."""
    metadatas: list[dict[str, Any] | None] | None = None
    """One metadata object per text (JSON values), or None."""

    @field_validator("ids")
    @classmethod
    def _ids(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            for index, item in enumerate(value):
                if not item:
                    raise ValueError(f"ids[{index}] must be a non-empty str (got '')")
            if len(set(value)) != len(value):
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

    ids: list[str] = Field(min_length=1)
    """The ids to delete; unknown ids are ignored."""


class QueryRequest(_Strict):
    """``POST /v1/collections/{name}/query``: similarity search."""

    query: str = Field(min_length=1)
    """The query text."""
    k: int = Field(default=4, ge=1, le=1000)
    """Most hits."""
    filter: dict[str, Any] | None = None
    """A metadata filter in the core's language, e.g. ``{"price": {"$lt": 100}}``."""


class QueryResponse(BaseModel):
    """The answer to a query."""

    object: Literal["collection.query"] = "collection.query"
    collection: str
    hits: list[HitModel]
    """Best first."""


class CollectionChatRequest(_Strict):
    """``POST /v1/collections/{name}/chat``: one RAG turn in a session."""

    session_id: str = Field(min_length=1, max_length=256)
    """The conversation; its earlier turns are remembered by the server."""
    question: str = Field(min_length=1)
    """The user's message."""
    k: int | None = Field(default=None, ge=1, le=100)
    """Documents retrieved (default: the server's ``rag_k``)."""
    filter: dict[str, Any] | None = None
    """A metadata filter for the retrieval."""
    max_tokens: int | None = Field(default=None, ge=1)
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
    llm_backend: str
    device: str
    collections: int
    in_flight: int
    uptime_s: float
