"""gpuprompt: the acceleration core behind the LangChain and LlamaIndex drop-in classes.

Start with :func:`connect`: it returns the runtime of this process (models load here) or of a
running ``gpuprompt serve`` (``base_url=`` or ``GPUPROMPT_URL``), whose components satisfy the same
protocols (:mod:`gpuprompt.protocols`). Importing this package loads no torch, faiss or vLLM; each
public name is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprompt._lazy import lazy_exports

# The one version source is gpuprompt/_version.py: the build reads it ([tool.hatch.version] in
# pyproject.toml), and importlib.metadata.version("gpuprompt") of an installed copy equals it.
from gpuprompt._version import __version__

if TYPE_CHECKING:
    from gpuprompt.batching import BatcherStats, MicroBatcher
    from gpuprompt.context import ContextCache, ContextStats, Turn
    from gpuprompt.embed import Embedder, EmbedderConfig, EmbedderStats, EmbeddingCache
    from gpuprompt.index import Hit, IndexConfig, Record, VectorIndex
    from gpuprompt.llm import (
        GenerationRequest,
        GenerationResult,
        LLMEngine,
        StreamDelta,
        Timings,
        ToolCall,
        ToolCallDelta,
        ToolSpec,
        Usage,
    )
    from gpuprompt.rag import RAGAnswer, RAGPipeline, StageTimings
    from gpuprompt.remote import RemoteConfig, RemoteEmbedder, RemoteLLM, RemoteReranker, RemoteRuntime
    from gpuprompt.rerank import Reranker, RerankerConfig, RerankHit
    from gpuprompt.runtime import Runtime, connect, get_runtime, resolve_device

_EXPORTS: dict[str, str] = {
    "BatcherStats": "gpuprompt.batching",
    "MicroBatcher": "gpuprompt.batching",
    "Embedder": "gpuprompt.embed",
    "EmbedderConfig": "gpuprompt.embed",
    "EmbedderStats": "gpuprompt.embed",
    "EmbeddingCache": "gpuprompt.embed",
    "Hit": "gpuprompt.index",
    "IndexConfig": "gpuprompt.index",
    "Record": "gpuprompt.index",
    "VectorIndex": "gpuprompt.index",
    "IndexLike": "gpuprompt.index",
    "MilvusIndex": "gpuprompt.index",
    "GenerationRequest": "gpuprompt.llm",
    "GenerationResult": "gpuprompt.llm",
    "LLMEngine": "gpuprompt.llm",
    "StreamDelta": "gpuprompt.llm",
    "Timings": "gpuprompt.llm",
    "ToolCall": "gpuprompt.llm",
    "ToolCallDelta": "gpuprompt.llm",
    "ToolSpec": "gpuprompt.llm",
    "Usage": "gpuprompt.llm",
    "ContextCache": "gpuprompt.context",
    "ContextStats": "gpuprompt.context",
    "Turn": "gpuprompt.context",
    "RAGAnswer": "gpuprompt.rag",
    "RAGPipeline": "gpuprompt.rag",
    "StageTimings": "gpuprompt.rag",
    "RemoteConfig": "gpuprompt.remote",
    "RemoteEmbedder": "gpuprompt.remote",
    "RemoteLLM": "gpuprompt.remote",
    "RemoteReranker": "gpuprompt.remote",
    "Reranker": "gpuprompt.rerank",
    "RerankerConfig": "gpuprompt.rerank",
    "RerankHit": "gpuprompt.rerank",
    "RemoteRuntime": "gpuprompt.remote",
    "Runtime": "gpuprompt.runtime",
    "connect": "gpuprompt.runtime",
    "get_runtime": "gpuprompt.runtime",
    "resolve_device": "gpuprompt.runtime",
}

__all__ = sorted([*_EXPORTS, "__version__", "errors"])

_getattr, __dir__ = lazy_exports(__name__, _EXPORTS, extra=("__version__", "errors"))


def __getattr__(name: str) -> object:
    if name == "errors":  # the exception tree, a module
        from gpuprompt import errors

        return errors
    return _getattr(name)
