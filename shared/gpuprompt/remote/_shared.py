"""One :class:`RemoteLLM` / :class:`RemoteEmbedder` per server and settings in a process, as the
Runtime keeps one loaded engine per config: every adapter instance with the same ``base_url`` and
model shares it (and its connection pool)."""

from __future__ import annotations

import threading

from gpuprompt.remote._config import RemoteConfig
from gpuprompt.remote._embedder import RemoteEmbedder
from gpuprompt.remote._llm import DEFAULT_CONTEXT_WINDOW, RemoteLLM

__all__ = ["shared_embedder", "shared_llm"]

_lock = threading.Lock()
_llms: dict[tuple[RemoteConfig, str | None, int], RemoteLLM] = {}
_embedders: dict[tuple[RemoteConfig, str | None], RemoteEmbedder] = {}


def shared_llm(config: RemoteConfig, model: str | None = None, *,
               context_window: int = DEFAULT_CONTEXT_WINDOW) -> RemoteLLM:
    """The process's :class:`RemoteLLM` for this server, model and context window (not loaded yet)."""
    key = (config, model, context_window)
    with _lock:
        llm = _llms.get(key)
        if llm is None or llm._closed:
            llm = _llms[key] = RemoteLLM(config, model=model, context_window=context_window)
        return llm


def shared_embedder(config: RemoteConfig, model: str | None = None) -> RemoteEmbedder:
    """The process's :class:`RemoteEmbedder` for this server and model (not loaded yet)."""
    key = (config, model)
    with _lock:
        embedder = _embedders.get(key)
        if embedder is None or embedder._closed:
            embedder = _embedders[key] = RemoteEmbedder(config, model=model)
        return embedder
