"""Reranking: :class:`Reranker`, a cross-encoder behind the one MicroBatcher (pairs of concurrent
callers share batches, sorted by length inside them), with a score cache and an int8 CPU backend
guarded on ranking agreement; its :class:`RerankerConfig` and :class:`RerankHit`.

Importing this package loads no torch; the model loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprompt._lazy import lazy_exports

if TYPE_CHECKING:
    from gpuprompt.rerank._config import ACTIVATIONS, QUANTIZE_CHOICES, RankingThresholds, RerankerConfig
    from gpuprompt.rerank._reranker import Reranker, check_documents, check_top_n
    from gpuprompt.rerank._types import RerankerStats, RerankHit

_EXPORTS = {
    "ACTIVATIONS": "gpuprompt.rerank._config",
    "QUANTIZE_CHOICES": "gpuprompt.rerank._config",
    "RankingThresholds": "gpuprompt.rerank._config",
    "RerankHit": "gpuprompt.rerank._types",
    "Reranker": "gpuprompt.rerank._reranker",
    "RerankerConfig": "gpuprompt.rerank._config",
    "RerankerStats": "gpuprompt.rerank._types",
    "check_documents": "gpuprompt.rerank._reranker",
    "check_top_n": "gpuprompt.rerank._reranker",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
