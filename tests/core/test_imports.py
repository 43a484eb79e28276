"""The public surface is pinned, and importing it loads no heavy library."""

from __future__ import annotations

import subprocess
import sys

import gpuprompt

EXPECTED_ALL = [
    "BatcherStats",
    "ContextCache",
    "ContextStats",
    "Embedder",
    "EmbedderConfig",
    "EmbedderStats",
    "EmbeddingCache",
    "GenerationRequest",
    "GenerationResult",
    "Hit",
    "IndexConfig",
    "IndexLike",
    "LLMEngine",
    "MicroBatcher",
    "MilvusIndex",
    "RAGAnswer",
    "RAGPipeline",
    "Record",
    "RemoteConfig",
    "RemoteEmbedder",
    "RemoteLLM",
    "RemoteReranker",
    "RemoteRuntime",
    "RerankHit",
    "Reranker",
    "RerankerConfig",
    "Runtime",
    "StageTimings",
    "StreamDelta",
    "Timings",
    "ToolCall",
    "ToolCallDelta",
    "ToolSpec",
    "Turn",
    "Usage",
    "VectorIndex",
    "__version__",
    "connect",
    "errors",
    "get_runtime",
    "resolve_device",
]


def test_all_is_pinned() -> None:
    assert sorted(gpuprompt.__all__) == sorted(EXPECTED_ALL)
    for name in gpuprompt.__all__:
        assert getattr(gpuprompt, name) is not None


def test_import_and_construction_load_no_heavy_library() -> None:
    code = (
        "import sys, gpuprompt\n"
        "from gpuprompt import Embedder, ContextCache, LLMEngine, MicroBatcher, MilvusIndex, Runtime, VectorIndex\n"
        "Embedder(); LLMEngine(); VectorIndex(384); MilvusIndex(4); ContextCache(Embedder()); Runtime().embedder(batch_size=4); gpuprompt.Reranker(); gpuprompt.connect().reranker()\n"
        "Runtime().llm(backend='transformers')\n"
        "heavy = [m for m in ('torch', 'faiss', 'vllm', 'transformers', 'sentence_transformers', 'pymilvus', 'ray', 'redis', 'onnxruntime', 'xgrammar') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
