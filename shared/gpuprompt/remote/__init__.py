"""Remote mode: the core's interfaces served by a running ``gpuprompt serve``.

Many worker processes (``uvicorn --workers 4``) then share one server's models and batch queues,
and none of them imports torch or loads a model. :func:`gpuprompt.connect` returns a
:class:`RemoteRuntime` when given a server (``base_url=`` or ``GPUPROMPT_URL``); its components
satisfy the same protocols as the in-process ones (:mod:`gpuprompt.protocols`)::

    RemoteConfig        the server, its API key, timeouts, retries, pool size
    RemoteRuntime       embedder / llm / reranker / context_cache / answer_cache / index of one server
    RemoteClient        one pooled httpx.Client + httpx.AsyncClient per server and process; retries
                        idempotent calls only; closing a stream aborts the request on the server;
                        takes an httpx transport (``httpx.ASGITransport(app)``) instead of the network
    RemoteEmbedder      POST /v1/embeddings (base64 float32): EmbedderLike
    RemoteReranker      POST /v1/rerank: RerankerLike
    RemoteLLM           POST /v1/chat/completions and /v1/completions: EngineLike
    RemoteContextCache  /v1/sessions: ContextLike
    RemoteAnswerCache   /v1/cache: AnswerCacheLike
    RemoteIndex         /v1/collections/{name}/records: IndexLike, and TextSearchLike (a text search is
                        one request: the server embeds and searches)

Errors are the core's typed errors (the table in :mod:`gpuprompt.wire`). Importing this package
loads nothing heavy; httpx is imported on the first request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprompt._lazy import lazy_exports

if TYPE_CHECKING:
    from gpuprompt.remote._answer_cache import RemoteAnswerCache
    from gpuprompt.remote._client import RemoteClient, client_for, shared_client
    from gpuprompt.remote._config import ENV_API_KEY, ENV_TIMEOUT, ENV_URL, RemoteConfig, resolve_remote
    from gpuprompt.remote._embedder import RemoteEmbedder
    from gpuprompt.remote._index import RemoteIndex
    from gpuprompt.remote._llm import RemoteLLM
    from gpuprompt.remote._reranker import RemoteReranker
    from gpuprompt.remote._runtime import RemoteRuntime, mount, remote_runtime, unmount
    from gpuprompt.remote._sessions import RemoteContextCache

_EXPORTS: dict[str, str] = {
    "ENV_API_KEY": "gpuprompt.remote._config",
    "ENV_TIMEOUT": "gpuprompt.remote._config",
    "ENV_URL": "gpuprompt.remote._config",
    "RemoteAnswerCache": "gpuprompt.remote._answer_cache",
    "RemoteClient": "gpuprompt.remote._client",
    "RemoteConfig": "gpuprompt.remote._config",
    "RemoteContextCache": "gpuprompt.remote._sessions",
    "RemoteEmbedder": "gpuprompt.remote._embedder",
    "RemoteIndex": "gpuprompt.remote._index",
    "RemoteLLM": "gpuprompt.remote._llm",
    "RemoteReranker": "gpuprompt.remote._reranker",
    "RemoteRuntime": "gpuprompt.remote._runtime",
    "client_for": "gpuprompt.remote._client",
    "mount": "gpuprompt.remote._runtime",
    "unmount": "gpuprompt.remote._runtime",
    "remote_runtime": "gpuprompt.remote._runtime",
    "resolve_remote": "gpuprompt.remote._config",
    "shared_client": "gpuprompt.remote._client",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
