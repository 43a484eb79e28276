"""llamaindex_gpuprompt: drop-in LlamaIndex classes (Embedding, VectorStore, LLM, memory) over gpuprompt.

Importing this package loads nothing heavy (no torch, faiss, vLLM, not even llama_index): each
public name is imported on first use. Swap the stock classes for these and keep the query engine::

    from llama_index.core import Settings, StorageContext, VectorStoreIndex
    from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptLLM, GPUPromptVectorStore

    Settings.embed_model = GPUPromptEmbedding()
    Settings.llm = GPUPromptLLM()
    storage = StorageContext.from_defaults(vector_store=GPUPromptVectorStore())
    index = VectorStoreIndex.from_documents(documents, storage_context=storage)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llamaindex_gpuprompt._embedding import GPUPromptEmbedding
    from llamaindex_gpuprompt._filters import to_core_filter
    from llamaindex_gpuprompt._llm import GPUPromptLLM
    from llamaindex_gpuprompt._memory import GPUPromptContextMemoryBlock
    from llamaindex_gpuprompt._rerank import GPUPromptRerank
    from llamaindex_gpuprompt._vector_store import GPUPromptVectorStore

_EXPORTS: dict[str, str] = {
    "GPUPromptContextMemoryBlock": "llamaindex_gpuprompt._memory",
    "GPUPromptEmbedding": "llamaindex_gpuprompt._embedding",
    "GPUPromptLLM": "llamaindex_gpuprompt._llm",
    "GPUPromptRerank": "llamaindex_gpuprompt._rerank",
    "GPUPromptVectorStore": "llamaindex_gpuprompt._vector_store",
    "to_core_filter": "llamaindex_gpuprompt._filters",
}

__all__ = [
    "GPUPromptContextMemoryBlock",
    "GPUPromptEmbedding",
    "GPUPromptLLM",
    "GPUPromptRerank",
    "GPUPromptVectorStore",
    "to_core_filter",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llamaindex_gpuprompt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
