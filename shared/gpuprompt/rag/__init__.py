"""Retrieval-augmented generation over the core: :class:`RAGPipeline` (retrieve -> rerank ->
assemble context -> generate, with per-stage timings), its answer and timing types.
"""

from __future__ import annotations

from gpuprompt.rag._pipeline import DEFAULT_SYSTEM_PROMPT, RAGAnswer, RAGPipeline, StageTimings

__all__ = ["DEFAULT_SYSTEM_PROMPT", "RAGAnswer", "RAGPipeline", "StageTimings"]
