"""The value types of reranking: one reranked document (:class:`RerankHit`) and the reranker's counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RerankHit", "RerankerStats"]


@dataclass(frozen=True)
class RerankHit:
    """One document of a rerank call, as the cross-encoder ranks it.

    Attributes:
        index: the document's position in the call's ``documents``.
        score: the cross-encoder's relevance score (higher is more relevant), with the model's own
            activation, as sentence-transformers ``CrossEncoder.predict`` returns it.
        document: the document itself.
    """

    index: int
    score: float
    document: str

    def __repr__(self) -> str:
        text = self.document if len(self.document) <= 40 else self.document[:37] + "..."
        return f"RerankHit(index={self.index}, score={self.score:.4f}, document={text!r})"


@dataclass(frozen=True)
class RerankerStats:
    """Counters of a reranker.

    Attributes:
        pairs: (query, document) pairs asked for, all calls together.
        cache_hits: pairs served from the score cache.
        scored: pairs the model scored.
        truncated: scored pairs longer than the model's max length (cut to it, as CrossEncoder does).
        cache_entries: scores in the cache now.
        batcher: the batch queue's counters (a ``BatcherStats``), or None before the first call.
    """

    pairs: int
    cache_hits: int
    scored: int
    truncated: int
    cache_entries: int
    batcher: Any = None
