"""Retrieval-augmented generation over the core: :class:`RAGPipeline` (retrieve -> rerank ->
assemble context -> generate, with per-stage timings), its answer and timing types, and retrieval
by text in three modes (dense, lexical, hybrid: :func:`asearch_texts`).
"""

from __future__ import annotations

from gpuprompt.rag._pipeline import DEFAULT_SYSTEM_PROMPT, RAGAnswer, RAGPipeline, StageTimings
from gpuprompt.rag._retrieve import MODES, Retrieval, asearch_texts, check_retrieval

__all__ = ["DEFAULT_SYSTEM_PROMPT", "MODES", "RAGAnswer", "RAGPipeline", "Retrieval", "StageTimings", "asearch_texts",
           "check_retrieval"]
