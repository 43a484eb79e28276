"""RemoteRuntime: the runtime of remote mode. It answers the same calls as the in-process
:class:`~gpuprompt.Runtime` (``embedder``, ``llm``, ``reranker``, ``context_cache``,
``answer_cache``, ``index``) with clients of one running ``gpuprompt serve``, all over one pooled
:class:`RemoteClient`. :func:`gpuprompt.connect` picks it when given a server."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from gpuprompt.errors import ClosedError, ConfigurationError
from gpuprompt.remote._client import RemoteClient, shared_client
from gpuprompt.remote._config import RemoteConfig
from gpuprompt.wire import api_root, redact

if TYPE_CHECKING:
    from gpuprompt.remote._answer_cache import RemoteAnswerCache
    from gpuprompt.remote._embedder import RemoteEmbedder
    from gpuprompt.remote._index import RemoteIndex
    from gpuprompt.remote._llm import RemoteLLM
    from gpuprompt.remote._reranker import RemoteReranker
    from gpuprompt.remote._sessions import RemoteContextCache

__all__ = ["RemoteRuntime", "mount", "remote_runtime", "unmount"]

T = TypeVar("T")


class RemoteRuntime:
    """The components of one running ``gpuprompt serve``, behind the in-process runtime's calls.

    The same arguments return the same client object (as the in-process runtime returns the same
    loaded model), and every one of them shares one connection pool. Options that only configure
    a local model (``device``, ``backend``, ``quantize``, batching) are refused when set to other
    than their defaults: the server's own flags set them.

    Example:
        >>> from gpuprompt import connect
        >>> rt = connect("http://127.0.0.1:8000", timeout=30)
        >>> rt.remote
        True
        >>> rt.embedder().embed(["red dress"]).shape
        (1, 384)

    Args:
        config: the server and how to talk to it.
        transport: an ``httpx`` transport instead of the network (``httpx.ASGITransport(app)``).
    """

    remote = True
    """Remote mode (the in-process :class:`~gpuprompt.Runtime` says False)."""

    def __init__(self, config: RemoteConfig, *, transport: Any = None) -> None:
        if not isinstance(config, RemoteConfig):
            raise ConfigurationError(f"'config' must be a RemoteConfig (got a {type(config).__name__}).")
        self.config = config
        self.client: RemoteClient = shared_client(config, transport=transport)
        self._lock = threading.Lock()
        self._items: dict[Hashable, Any] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"<RemoteRuntime {redact(self.config.base_url)!r} loaded={len(self._items)}>"

    def _get(self, key: Hashable, factory: Callable[[], T]) -> T:
        with self._lock:
            if self._closed:
                raise ClosedError("this RemoteRuntime was shut down; call gpuprompt.connect(...) again.")
            item = self._items.get(key)
            if item is None or getattr(item, "_closed", False):
                item = self._items[key] = factory()
            return item

    # ------------------------------------------------------------------ components
    def embedder(self, model: str | None = None, **options: Any) -> RemoteEmbedder:
        """The server's embedder (``POST /v1/embeddings``), checked to be ``model`` on first use.

        Raises:
            ConfigurationError: an :class:`~gpuprompt.EmbedderConfig` option set to other than its
                default (it would configure a local model).
        """
        from gpuprompt.embed import EmbedderConfig
        from gpuprompt.remote._embedder import RemoteEmbedder

        _refuse_local("embedder", options, EmbedderConfig(), ignore=("show_progress",))
        return self._get(("embedder", model), lambda: RemoteEmbedder(model=model, client=self.client))

    def llm(self, model: str | None = None, *, max_model_len: int | None = None, **options: Any) -> RemoteLLM:
        """The server's chat engine (``POST /v1/chat/completions``, ``/v1/completions``).

        Args:
            model: the chat model to ask for (checked against the served one on load).
            max_model_len: the most context window reported (None: the served model's; the server
                enforces its own).
            **options: :class:`~gpuprompt.llm.LLMConfig` options, refused unless at their defaults.
        """
        from gpuprompt.llm import LLMConfig
        from gpuprompt.remote._llm import RemoteLLM

        _refuse_local("llm", options, LLMConfig())
        return self._get(("llm", model, max_model_len),
                         lambda: RemoteLLM(model=model, context_window=max_model_len, client=self.client))

    def reranker(self, model: str | None = None, **options: Any) -> RemoteReranker:
        """The server's reranker (``POST /v1/rerank``: ``gpuprompt serve --rerank-model``)."""
        from gpuprompt.remote._reranker import RemoteReranker
        from gpuprompt.rerank import RerankerConfig

        _refuse_local("reranker", options, RerankerConfig())
        return self._get(("reranker", model), lambda: RemoteReranker(model=model, client=self.client))

    def context_cache(self, embedder: Any = None, **options: Any) -> RemoteContextCache:
        """The server's conversation memory (``/v1/sessions``); its sessions are every worker's.

        ``embedder`` and the in-process cache's bounds (``max_sessions``, ``ttl_seconds``, ...)
        belong to the server and are refused here.
        """
        from gpuprompt.remote._sessions import RemoteContextCache

        if embedder is not None or options:
            given = sorted([*(["embedder"] if embedder is not None else []), *options])
            raise ConfigurationError(
                f"context_cache option(s) {given} configure an in-process ContextCache; in remote mode the "
                "server's memory serves every worker (its own flags bound it). Drop them."
            )
        return self._get(("context",), lambda: RemoteContextCache(client=self.client))

    def answer_cache(self, embedder: Any = None, *, score_threshold: float = 0.95,
                     **options: Any) -> RemoteAnswerCache:
        """The server's semantic answer cache (``/v1/cache``), shared by every worker."""
        from gpuprompt.remote._answer_cache import RemoteAnswerCache

        if embedder is not None or options:
            given = sorted([*(["embedder"] if embedder is not None else []), *options])
            raise ConfigurationError(
                f"answer_cache option(s) {given} configure an in-process AnswerCache; in remote mode the server's "
                "cache serves every worker (gpuprompt serve bounds it). Drop them."
            )
        return self._get(("answer_cache", score_threshold),
                         lambda: RemoteAnswerCache(score_threshold=score_threshold, client=self.client))

    def index(self, dim: int | None = None, *, collection: str | None = None, metric: str = "cosine",
              **options: Any) -> RemoteIndex:
        """The server collection ``collection`` as an :class:`~gpuprompt.index.IndexLike`.

        Raises:
            ConfigurationError: no ``collection`` (a server collection is shared and outlives the
                process, so it is always named), or an in-process index option.
        """
        from gpuprompt.remote._index import RemoteIndex

        if collection is None:
            raise ConfigurationError(
                f"in remote mode an index is a collection of the server ({redact(self.config.base_url)}): pass "
                "collection='name' (its first add creates it; GET /v1/collections lists them)."
            )
        if options:
            raise ConfigurationError(
                f"index option(s) {sorted(options)} configure an in-process VectorIndex; the server builds its "
                "collections itself. Drop them."
            )
        return RemoteIndex(collection=collection, dim=dim, metric=metric, client=self.client)

    def loaded(self) -> list[Hashable]:
        """The keys of the components asked for so far."""
        with self._lock:
            return list(self._items)

    def shutdown(self) -> None:
        """Close every component asked for here (the shared connection pool stays open for other
        runtimes of the same server). Safe to call twice."""
        with self._lock:
            self._closed = True
            items = list(self._items.values())
            self._items.clear()
        for item in items:
            close = getattr(item, "close", None)
            if callable(close):
                close()


def _refuse_local(what: str, options: Mapping[str, Any], defaults: Any, *, ignore: tuple[str, ...] = ()) -> None:
    fields = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(defaults)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ConfigurationError(f"unknown {what} option(s) {unknown}; valid options: {sorted(fields)}.")
    changed = sorted(name for name, value in options.items() if name not in ignore and value != fields[name])
    if changed:
        raise ConfigurationError(
            f"{what} option(s) {changed} configure a local model and mean nothing in remote mode: the server's own "
            "flags choose its device, precision and batching. Drop them, or connect() without a server to run in "
            "process."
        )


_runtimes: dict[tuple[RemoteConfig, Any], RemoteRuntime] = {}
_runtimes_lock = threading.Lock()
_mounted: dict[str, Any] = {}


def mount(base_url: str, transport: Any) -> None:
    """Serve ``base_url`` through ``transport`` (an ``httpx`` transport such as
    ``httpx.ASGITransport(create_app(...))``) for every remote class of this process: a
    ``gpuprompt serve`` app embedded in the same process, reached without a socket.

    Raises:
        ConfigurationError: ``transport`` is not an httpx transport.
    """
    if not (hasattr(transport, "handle_async_request") or hasattr(transport, "handle_request")):
        raise ConfigurationError(f"'transport' must be an httpx transport (got a {type(transport).__name__}).")
    with _runtimes_lock:
        _mounted[api_root(base_url)] = transport


def unmount(base_url: str) -> None:
    """Stop serving ``base_url`` through a mounted transport (unknown URLs are ignored)."""
    with _runtimes_lock:
        _mounted.pop(api_root(base_url), None)


def remote_runtime(config: RemoteConfig, *, transport: Any = None) -> RemoteRuntime:
    """The process's one :class:`RemoteRuntime` for ``config`` (and ``transport``, by default the one
    :func:`mount` put at its URL)."""
    if transport is None:
        with _runtimes_lock:
            transport = _mounted.get(api_root(config.base_url))
    key = (config, transport)
    with _runtimes_lock:
        runtime = _runtimes.get(key)
        if runtime is None or runtime._closed:
            runtime = _runtimes[key] = RemoteRuntime(config, transport=transport)
        return runtime
