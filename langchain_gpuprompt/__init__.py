"""langchain_gpuprompt: drop-in LangChain classes over gpuprompt's batched acceleration core.

Change the imports of a working LangChain app and keep the chain::

    from langchain_gpuprompt import ChatGPUPrompt, GPUPromptEmbeddings, GPUPromptReranker, GPUPromptVectorStore

Importing this package loads no torch, faiss or vLLM, and constructing a class loads no model:
each public name is imported on first use and each model on first call.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_gpuprompt._cache import GPUPromptSemanticCache
    from langchain_gpuprompt._chat_history import GPUPromptChatMessageHistory
    from langchain_gpuprompt._chat_models import ChatGPUPrompt
    from langchain_gpuprompt._embeddings import GPUPromptEmbeddings
    from langchain_gpuprompt._rerank import GPUPromptReranker
    from langchain_gpuprompt._store import GPUPromptStore
    from langchain_gpuprompt._vectorstore_hybrid import GPUPromptRetriever
    from langchain_gpuprompt._vectorstores import GPUPromptVectorStore

_EXPORTS: dict[str, str] = {
    "ChatGPUPrompt": "langchain_gpuprompt._chat_models",
    "GPUPromptChatMessageHistory": "langchain_gpuprompt._chat_history",
    "GPUPromptEmbeddings": "langchain_gpuprompt._embeddings",
    "GPUPromptReranker": "langchain_gpuprompt._rerank",
    "GPUPromptRetriever": "langchain_gpuprompt._vectorstore_hybrid",
    "GPUPromptSemanticCache": "langchain_gpuprompt._cache",
    "GPUPromptStore": "langchain_gpuprompt._store",
    "GPUPromptVectorStore": "langchain_gpuprompt._vectorstores",
}

__all__ = [
    "ChatGPUPrompt",
    "GPUPromptChatMessageHistory",
    "GPUPromptEmbeddings",
    "GPUPromptReranker",
    "GPUPromptRetriever",
    "GPUPromptSemanticCache",
    "GPUPromptStore",
    "GPUPromptVectorStore",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'langchain_gpuprompt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
