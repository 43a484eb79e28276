"""Remote mode: the core's embedder and LLM interfaces served by a running ``gpuprompt serve``.

Many worker processes (``uvicorn --workers 4``) then share one server's models and batch queues,
and none of them imports torch or loads a model. The adapter classes pick these objects when
given ``base_url=`` (or ``GPUPROMPT_URL``)::

    RemoteConfig     the server, its API key, timeouts, retries, pool size
    RemoteClient     one pooled httpx.Client + httpx.AsyncClient per server and process; retries
                     idempotent calls only; closing a stream aborts the request on the server
    RemoteAnswerCache  /v1/cache: the AnswerCache calls of the semantic LLM cache, one cache for every worker
    RemoteEmbedder   POST /v1/embeddings (base64 float32), the Embedder calls the adapters make
    RemoteContextCache  /v1/sessions: the ContextCache calls of the chat history and memory block
    RemoteIndex      /v1/collections/{name}/records: the IndexLike of the vector stores and RAGPipeline
    RemoteLLM        POST /v1/chat/completions and /v1/completions, the LLMEngine calls the
                     adapters make, with the core's request / result / stream types

Errors are the core's typed errors (the table in :mod:`gpuprompt.wire`). Importing this
package loads nothing heavy; httpx is imported on the first request.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuprompt.remote._answer_cache import RemoteAnswerCache
    from gpuprompt.remote._client import RemoteClient, shared_client
    from gpuprompt.remote._config import ENV_API_KEY, ENV_URL, RemoteConfig, resolve_remote
    from gpuprompt.remote._embedder import RemoteEmbedder
    from gpuprompt.remote._index import RemoteIndex
    from gpuprompt.remote._llm import RemoteLLM
    from gpuprompt.remote._sessions import RemoteContextCache
    from gpuprompt.remote._shared import shared_embedder, shared_llm
    from gpuprompt.wire import api_root, error_from_status, redact

_EXPORTS: dict[str, str] = {
    "ENV_API_KEY": "gpuprompt.remote._config",
    "ENV_URL": "gpuprompt.remote._config",
    "RemoteAnswerCache": "gpuprompt.remote._answer_cache",
    "RemoteClient": "gpuprompt.remote._client",
    "RemoteConfig": "gpuprompt.remote._config",
    "RemoteContextCache": "gpuprompt.remote._sessions",
    "RemoteEmbedder": "gpuprompt.remote._embedder",
    "RemoteIndex": "gpuprompt.remote._index",
    "RemoteLLM": "gpuprompt.remote._llm",
    "api_root": "gpuprompt.wire",
    "error_from_status": "gpuprompt.wire",
    "redact": "gpuprompt.wire",
    "resolve_remote": "gpuprompt.remote._config",
    "shared_client": "gpuprompt.remote._client",
    "shared_embedder": "gpuprompt.remote._shared",
    "shared_llm": "gpuprompt.remote._shared",
}

__all__ = [
    "ENV_API_KEY",
    "ENV_URL",
    "RemoteAnswerCache",
    "RemoteClient",
    "RemoteConfig",
    "RemoteContextCache",
    "RemoteEmbedder",
    "RemoteIndex",
    "RemoteLLM",
    "api_root",
    "error_from_status",
    "redact",
    "resolve_remote",
    "shared_client",
    "shared_embedder",
    "shared_llm",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuprompt.remote' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
