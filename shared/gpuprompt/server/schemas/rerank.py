"""Pydantic models of the rerank routes: ``POST /v1/rerank`` (``/rerank``, ``/v2/rerank``) in the
Cohere / Jina shape vLLM and infinity serve, text-embeddings-inference's ``POST /rerank`` shape
(``texts`` in, a list of ``{index, score}`` out), and vLLM's ``POST /score``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from gpuprompt.server.schemas.base import ModelName, Text, _int, _OpenAIRequest
from gpuprompt.wire import MAX_RERANK_DOCUMENTS

__all__ = [
    "RerankDocument",
    "RerankRequest",
    "RerankResponse",
    "RerankResult",
    "RerankUsage",
    "ScoreData",
    "ScoreRequest",
    "ScoreResponse",
    "TeiRank",
    "TeiRerankRequest",
]

TopN = _int(1, 2**63 - 1)
"""``top_n``: at least 1; more than there are documents keeps them all (as in process)."""


class DocumentObject(BaseModel):
    """A document given as an object (Cohere and Jina accept ``{"text": ...}``). Other keys (a title,
    an id: Cohere's structured documents carry them) are accepted and not read: only ``text`` is
    ranked."""

    model_config = ConfigDict(extra="ignore")

    text: Text


class RerankRequest(_OpenAIRequest):
    """``POST /v1/rerank``: rank ``documents`` by relevance to ``query``."""

    model: ModelName | None = None
    """The rerank model (``GET /v1/models``); None for the served one."""
    query: Text
    """The query."""
    documents: list[Text | DocumentObject] = Field(max_length=MAX_RERANK_DOCUMENTS)
    """The texts to rank, as strings or ``{"text": ...}`` objects (none gives no results)."""
    top_n: TopN | None = None  # type: ignore[valid-type]
    """Keep the best ``top_n``; None (or more than there are) keeps them all."""
    return_documents: StrictBool = True
    """Echo each document in its result."""
    max_tokens_per_doc: Annotated[int, Field(ge=1)] | None = None
    """Cohere v2: accepted; documents are truncated to the model's own window (as the pair)."""

    @field_validator("documents", mode="before")
    @classmethod
    def _not_a_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("must be a list of texts, not a bare string; wrap it in a list")
        return value

    def texts(self) -> list[str]:
        """The documents as plain texts."""
        return [d.text if isinstance(d, DocumentObject) else d for d in self.documents]


class TeiRerankRequest(_OpenAIRequest):
    """``POST /rerank`` as text-embeddings-inference takes it: rank ``texts`` by relevance to ``query``."""

    query: Text
    """The query."""
    texts: list[Text] = Field(max_length=MAX_RERANK_DOCUMENTS)
    """The texts to rank (none gives an empty list)."""
    return_text: StrictBool = False
    """Echo each text in its result."""
    raw_scores: StrictBool = False
    """TEI: the logits before the model's activation. Served only where the model has none."""
    truncate: StrictBool = False
    """TEI: cut pairs longer than the model's window instead of refusing them. Pairs are always cut
    to the window here (as ``CrossEncoder`` does), so both values are accepted."""
    truncation_direction: Literal["Right", "right"] = "Right"
    """Where a long pair is cut: at its end (the only direction served)."""

    @field_validator("texts", mode="before")
    @classmethod
    def _not_a_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("must be a list of texts, not a bare string; wrap it in a list")
        return value


class TeiRank(BaseModel):
    """One ranked text in text-embeddings-inference's answer (the answer is a list of these)."""

    index: int
    score: float
    text: str | None = None


class RerankDocument(BaseModel):
    """A document echoed in a result."""

    text: str


class RerankResult(BaseModel):
    """One ranked document."""

    index: int
    """Its position in the request's ``documents``."""
    relevance_score: float
    """The cross-encoder's score (higher is more relevant)."""
    document: RerankDocument | None = None
    """The document, when ``return_documents`` (otherwise the key is left out, as Cohere does)."""


class RerankUsage(BaseModel):
    """Tokens read (each (query, document) pair as the model reads it)."""

    total_tokens: int
    prompt_tokens: int


class RerankResponse(BaseModel):
    """The answer to a rerank request: results best first."""

    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class ScoreRequest(_OpenAIRequest):
    """``POST /score`` (vLLM's score API): the relevance of ``text_1`` to each ``text_2``."""

    model: ModelName | None = None
    """The rerank model; None for the served one."""
    text_1: Text | list[Text]
    """One query (scored against every ``text_2``), or one per ``text_2``."""
    text_2: Text | list[Text]
    """The documents."""

    @model_validator(mode="after")
    def _paired(self) -> ScoreRequest:
        second = 1 if isinstance(self.text_2, str) else len(self.text_2)
        first = 1 if isinstance(self.text_1, str) else len(self.text_1)
        if first not in (1, second):
            raise ValueError(f"'text_1' must be one text or one per 'text_2' ({second}) (got {first})")
        if second > MAX_RERANK_DOCUMENTS:
            raise ValueError(f"'text_2' must hold at most {MAX_RERANK_DOCUMENTS} texts (got {second}); split it")
        return self

    def pairs(self) -> list[tuple[str, str]]:
        """The (query, document) pairs, in order."""
        second = [self.text_2] if isinstance(self.text_2, str) else list(self.text_2)
        first = [self.text_1] if isinstance(self.text_1, str) else list(self.text_1)
        if len(first) == 1:
            first = first * len(second)
        return list(zip(first, second, strict=True))


class ScoreData(BaseModel):
    """One pair's score."""

    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    """The answer to a score request, in the pairs' order."""

    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: RerankUsage
