"""The pydantic models of the HTTP API, one module per area: :mod:`.base` (bounded field types,
the request bases), :mod:`.service` (health, models, embeddings), :mod:`.chat` (the generating
OpenAI routes), :mod:`.collections` (documents, records, query and chat of a collection)."""

from __future__ import annotations

from gpuprompt.server.schemas.chat import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatUsage,
    CompletionRequest,
    CompletionResponse,
)
from gpuprompt.server.schemas.collections import (
    AddDocumentsRequest,
    AddDocumentsResponse,
    CollectionChatRequest,
    CollectionChatResponse,
    CollectionInfo,
    CollectionList,
    DeleteDocumentsRequest,
    HitModel,
    QueryRequest,
    QueryResponse,
    StageTimingsModel,
)
from gpuprompt.server.schemas.service import (
    EmbeddingItem,
    EmbeddingRequest,
    EmbeddingResponse,
    HealthResponse,
    ModelCard,
    ModelList,
)

__all__ = [
    "AddDocumentsRequest",
    "AddDocumentsResponse",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatMessage",
    "ChatUsage",
    "CollectionChatRequest",
    "CollectionChatResponse",
    "CollectionInfo",
    "CollectionList",
    "CompletionRequest",
    "CompletionResponse",
    "DeleteDocumentsRequest",
    "EmbeddingItem",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "HealthResponse",
    "HitModel",
    "ModelCard",
    "ModelList",
    "QueryRequest",
    "QueryResponse",
    "StageTimingsModel",
]
