"""Pydantic models of the service and embeddings routes: ``/health``, ``/v1/models``, ``/v1/embeddings``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, field_validator

from gpuprompt.errors import describe
from gpuprompt.server.schemas.base import Dimensions, ModelName, Text, UsageModel, _OpenAIRequest
from gpuprompt.validation import check_text
from gpuprompt.wire import MAX_EMBEDDING_INPUTS

__all__ = ["EmbeddingItem", "EmbeddingRequest", "EmbeddingResponse", "HealthResponse", "ModelCard", "ModelList"]


class ModelCard(BaseModel):
    """One served model, as ``GET /v1/models`` lists it."""

    id: str
    """The name to pass as ``model``."""
    object: Literal["model"] = "model"
    created: int
    """When the server started (Unix seconds)."""
    owned_by: str = "gpuprompt"
    """Who serves it."""
    max_model_len: int | None = None
    """Most tokens the model reads (the chat model's context window, the embedding and rerank
    models' input length), as vLLM's model cards carry it; None while the models load."""


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
    """The served models: the chat model (none with ``--chat-model none``), the embedding model, then
    the rerank model (when one is served)."""


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

    @field_validator("input", mode="before")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        """Name the first item that breaks the list's kind (texts, token ids, lists of token ids),
        instead of one failure per union member; bools are not token ids."""
        if not isinstance(value, list) or not value:
            return value
        kinds = (("a string", lambda x: isinstance(x, str)),
                 ("a token id (an int)", _token_id),
                 ("a list of token ids (ints)", lambda x: isinstance(x, list) and all(_token_id(t) for t in x)))
        expected, matches = next(((name, test) for name, test in kinds if test(value[0])), kinds[0])
        for i, item in enumerate(value):
            if not matches(item):
                like = " like the first item" if i else ""
                raise ValueError(f"'$[{i}]' must be {expected}{like}: input is a string, a list of strings or of "
                                 f"token ids (got {describe(item)}).")
            if isinstance(item, str):
                check_text(item, f"$[{i}]", error=ValueError)
        return value

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


class HealthResponse(BaseModel):
    """``GET /health``."""

    status: Literal["ok"] = "ok"
    chat_model: str | None
    """The served chat model, or None for a server started with ``--chat-model none`` (no LLM engine)."""
    embedding_model: str
    embedder_identity: str | None = None
    """The identity an index records for this server's vectors (model, ``;int8`` when quantised);
    None until the embedder has loaded."""
    rerank_model: str | None = None
    """The served rerank model (``--rerank-model``), or None when the server reranks nothing."""
    embed_backend: str = "torch"
    """What runs the embedder's forward pass: ``torch`` or ``onnx`` (``--embed-backend``; int8 runs
    on onnx); the configured one until the embedder has loaded."""
    rerank_backend: str | None = None
    """The same for the reranker (``--rerank-backend``), None when the server reranks nothing."""
    llm_backend: str | None
    """The chat engine's backend (``vllm``, ``transformers``, ``remote``); None without a chat model."""
    device: str
    collections: int
    in_flight: int
    uptime_s: float


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
