"""Runtime: the per-process registry of loaded models and engines.

The device helpers live in the leaf module :mod:`gpuprompt.device` (re-exported here), so that
components import them without importing the registry that builds the components.

The same configuration always returns the same loaded instance, so a LangChain chain and a
LlamaIndex query engine in one process share one model and one batch queue.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

from gpuprompt.device import check_device, default_dtype, resolve_device
from gpuprompt.errors import ClosedError, ConfigurationError
from gpuprompt.validation import check_options

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpuprompt.answer_cache import AnswerCache
    from gpuprompt.context import ContextCache
    from gpuprompt.context.stores import SessionStore
    from gpuprompt.embed import Embedder
    from gpuprompt.index import VectorIndex
    from gpuprompt.llm import LLMEngine
    from gpuprompt.protocols import IndexLike
    from gpuprompt.remote import RemoteConfig, RemoteRuntime
    from gpuprompt.rerank import Reranker

__all__ = ["Runtime", "connect", "connect_index", "default_dtype", "get_runtime", "resolve_device"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

class Runtime:
    """A per-process registry of loaded components, keyed by their configuration.

    Example:
        >>> from gpuprompt import get_runtime
        >>> rt = get_runtime()
        >>> emb = rt.embedder()          # loads nothing until first use
        >>> emb is rt.embedder()         # same config, same instance (same batch queue)
        True

    Args:
        device: the default device for components that do not name one (``"auto"`` picks
            cuda > mps > cpu).
    """

    remote = False
    """In process (a :class:`~gpuprompt.remote.RemoteRuntime` says True)."""

    def __init__(self, device: str = "auto") -> None:
        check_device(device)
        self._device_request = device
        self._device: str | None = None
        self._lock = threading.Lock()
        self._key_locks: dict[Hashable, threading.Lock] = {}
        self._items: dict[Hashable, Any] = {}
        self._closed = False

    def __repr__(self) -> str:
        device = self._device or self._device_request
        return f"<Runtime device={device!r} loaded={len(self._items)}>"

    @property
    def device(self) -> str:
        """The resolved default device (resolving imports torch once)."""
        if self._device is None:
            self._device = resolve_device(self._device_request)
        return self._device

    def resolve(self, device: str | None) -> str:
        """Resolve a component's device request, falling back to the runtime's default."""
        return self.device if device is None else resolve_device(device)

    def get_or_create(self, key: Hashable, factory: Callable[[], T]) -> T:
        """Return the instance registered under ``key``, building it once with ``factory``.

        Concurrent callers asking for the same key wait for one build; different keys build in
        parallel.

        Raises:
            ClosedError: the runtime was shut down.
        """
        with self._lock:
            if self._closed:
                raise ClosedError("this Runtime was shut down; create a new one or call get_runtime().")
            if key in self._items:
                return self._items[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._items:
                    return self._items[key]
            item = factory()
            with self._lock:
                if self._closed:
                    _close(item)
                    raise ClosedError("this Runtime was shut down while a component was being built.")
                self._items[key] = item
            return item

    def loaded(self) -> list[Hashable]:
        """The keys of the registered components."""
        with self._lock:
            return list(self._items)

    def embedder(self, model: str | None = None, **options: Any) -> Embedder:
        """The shared :class:`~gpuprompt.Embedder` for this configuration.

        Args:
            model: a local path, a hub id, or None for the bundled all-MiniLM-L6-v2.
            **options: the other :class:`~gpuprompt.embed.EmbedderConfig` fields.
        """
        from gpuprompt.embed import Embedder, EmbedderConfig

        config = EmbedderConfig(model=model, **options)
        if config.device == "auto" and self._device_request != "auto":
            # Resolution is left to the first use: asking for a component loads nothing.
            config = config.replace(device=self._device_request)
        return self.get_or_create(("embedder", config.key()), lambda: Embedder(config=config))

    def llm(self, model: str | None = None, **options: Any) -> LLMEngine:
        """The shared :class:`~gpuprompt.LLMEngine` for this configuration.

        Args:
            model: a local folder, a ``.gguf`` file, a hub id, or None for the bundled
                SmolLM2-135M-Instruct.
            **options: the other :class:`~gpuprompt.llm.LLMConfig` fields (``backend``, ...).
        """
        from gpuprompt.llm import LLMConfig, LLMEngine

        check_options("LLM", options, LLMConfig.option_names())
        config = LLMConfig(model=model, **options)
        if config.device == "auto" and self._device_request != "auto":
            # Resolution is left to the first use: asking for a component loads nothing.
            config = config.replace(device=self._device_request)
        return self.get_or_create(("llm", config.key()), lambda: LLMEngine(config=config))

    def reranker(self, model: str | None = None, **options: Any) -> Reranker:
        """The shared :class:`~gpuprompt.Reranker` for this configuration.

        Args:
            model: a local cross-encoder folder or hub id; None for the default
                (:data:`gpuprompt.models.DEFAULT_RERANK_MODEL`).
            **options: the other :class:`~gpuprompt.rerank.RerankerConfig` fields.
        """
        from gpuprompt.rerank import Reranker, RerankerConfig

        config = RerankerConfig(model=model, **options)
        if config.device == "auto" and self._device_request != "auto":
            config = config.replace(device=self._device_request)
        return self.get_or_create(("reranker", config.key()), lambda: Reranker(config=config))

    def context_cache(
        self,
        embedder: Embedder | None = None,
        *,
        store: SessionStore | None = None,
        max_sessions: int = 10_000,
        ttl_seconds: float | None = 3600.0,
        max_turns_per_session: int = 1000,
    ) -> ContextCache:
        """The shared :class:`~gpuprompt.ContextCache` over ``embedder`` (default: :meth:`embedder`).

        The LangChain chat history and the LlamaIndex memory ask here by default, so one session
        id sees the same turns from both in one process (pass it as ``RAGPipeline(memory=...)`` to
        share it with a pipeline too). The same embedder, store and options return the same instance.
        """
        from gpuprompt.context import ContextCache

        if embedder is None:
            embedder = self.embedder()
        key = ("context", id(embedder), id(store), max_sessions, ttl_seconds, max_turns_per_session)
        return self.get_or_create(
            key,
            lambda: ContextCache(
                embedder,
                store=store,
                max_sessions=max_sessions,
                ttl_seconds=ttl_seconds,
                max_turns_per_session=max_turns_per_session,
            ),
        )

    def answer_cache(self, embedder: Embedder | None = None, **options: Any) -> AnswerCache:
        """A new :class:`~gpuprompt.answer_cache.AnswerCache` over ``embedder`` (default: :meth:`embedder`).

        Each call builds its own cache (entries are the caller's); the embedder, and so its batch
        queue and device cache, is the shared one.
        """
        from gpuprompt.answer_cache import AnswerCache

        return AnswerCache(self.embedder() if embedder is None else embedder, **options)

    def index(self, dim: int, *, collection: str | None = None, **options: Any) -> VectorIndex:
        """A new in-process :class:`~gpuprompt.VectorIndex` of ``dim`` (``collection`` is remote mode's;
        it must be None here).

        Raises:
            ConfigurationError: a ``collection`` without a server, or an invalid index option.
        """
        from gpuprompt.index import VectorIndex

        if collection is not None:
            raise ConfigurationError(
                f"collection={collection!r} names a collection of a running `gpuprompt serve`, but this runtime "
                "is in process: connect(base_url='http://host:port') (or set GPUPROMPT_URL), or drop collection."
            )
        return VectorIndex(dim, **options)

    def shutdown(self) -> None:
        """Close every registered component and refuse new ones. Safe to call twice."""
        with self._lock:
            self._closed = True
            items = list(self._items.values())
            self._items.clear()
        for item in reversed(items):
            _close(item)


def _close(item: Any) -> None:
    for name in ("close", "shutdown"):
        method = getattr(item, name, None)
        if callable(method):
            try:
                method()
            except Exception:  # shutdown must reach every component
                logger.exception("error while closing %r", item)
            return


_default: Runtime | None = None
_default_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The process-wide default :class:`Runtime` (created on first call, shut down at exit)."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = Runtime()
            if not getattr(get_runtime, "_atexit", False):
                atexit.register(_shutdown_default)
                get_runtime._atexit = True  # type: ignore[attr-defined]
        return _default


def _shutdown_default(keep: Runtime | None = None) -> None:
    """Shut the default runtime down, unless it is ``keep`` (one its caller did not create)."""
    with _default_lock:
        runtime = _default
    if runtime is not None and runtime is not keep:
        runtime.shutdown()


def _live_default() -> Runtime | None:
    """The default runtime if one is running now (None before the first :func:`get_runtime`)."""
    with _default_lock:
        return _default if _default is not None and not _default._closed else None


def connect(
    base_url: str | RemoteConfig | None = None,
    *,
    api_key: Any = None,
    timeout: float | None = None,
    transport: Any = None,
    owner: str = "connect()",
    local_options: Mapping[str, tuple[Any, Any]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Runtime | RemoteRuntime:
    """The runtime to work against: in process, or a running ``gpuprompt serve``. Decided once, here.

    ``base_url`` wins; without it ``GPUPROMPT_URL`` (with ``GPUPROMPT_API_KEY`` and
    ``GPUPROMPT_TIMEOUT``) names the server; with neither, the process's own :class:`Runtime`
    (:func:`get_runtime`) is returned. Both runtimes answer the same calls with objects of the same
    protocols (:mod:`gpuprompt.protocols`); equal settings return the same runtime.

    Example:
        >>> from gpuprompt import connect
        >>> rt = connect()                                   # in process: models load here
        >>> rt = connect("http://127.0.0.1:8000", timeout=30)  # a server's models, no torch here
        >>> vectors = rt.embedder().embed(["red dress"])

    Args:
        base_url: the server (``http://host:port`` or its ``/v1`` root), a :class:`RemoteConfig`
            (then no ``api_key`` / ``timeout``), or None.
        api_key: the server's key (a str or a pydantic ``SecretStr``); with no server it is refused.
        timeout: seconds every request to the server may wait for an answer (the model-list
            probe, embeddings, records, sessions, the cache and each piece of a generation); None
            reads ``GPUPROMPT_TIMEOUT``, else 60 s outside generation and 600 s between the
            pieces of a streamed one (:class:`RemoteConfig` holds the finer settings).
        transport: an ``httpx`` transport to reach the server through instead of the network, such
            as ``httpx.ASGITransport(create_app(...))`` for a server app in this process.
        owner: the class asking, named in error messages (adapters pass their class name).
        local_options: ``name -> (value, default)`` of the caller's options that only configure a
            local model (device, backend, quantize, ...): any not at its default is refused with a
            server, naming it.
        environ: the environment to read (default ``os.environ``).

    Raises:
        ConfigurationError: an in-process-only option with a server, an ``api_key`` or
            ``transport`` without one, or a malformed URL, key or timeout.
    """
    from gpuprompt.remote._config import RemoteConfig, resolve_remote

    if isinstance(base_url, RemoteConfig):
        if api_key is not None or timeout is not None:
            raise ConfigurationError("a RemoteConfig carries its own api_key and timeouts: pass them in it.")
        config: RemoteConfig | None = base_url
    else:
        config = resolve_remote(base_url, api_key, owner=owner, local_options=local_options or {}, timeout=timeout,
                                environ=environ)
    if config is None:
        if transport is not None:
            raise ConfigurationError(f"{owner} got a 'transport' but no server: pass base_url= as well.")
        return get_runtime()
    from gpuprompt.remote._runtime import remote_runtime

    return remote_runtime(config, transport=transport)


def connect_index(
    base_url: str | None,
    api_key: Any,
    collection: str | None,
    *,
    owner: str,
    index: Any = None,
    dim: int | None = None,
    metric: str | None = None,
    timeout: float | None = None,
    local_options: Mapping[str, tuple[Any, Any]] | None = None,
) -> IndexLike | None:
    """The server collection a vector store's arguments name, or None to keep its index in process.

    A store is remote when it names a server collection (``collection=``) or a server
    (``base_url=`` / ``api_key=``); the server is ``base_url``, else ``GPUPROMPT_URL`` (with
    ``GPUPROMPT_API_KEY``). ``GPUPROMPT_URL`` alone keeps the index in process (remote embeddings
    may still feed it): a server collection is shared and outlives the process, so it is never
    chosen implicitly. The LangChain and LlamaIndex vector stores and the LangGraph store decide here.

    Args:
        base_url: the store's ``base_url`` argument, or None.
        api_key: its ``api_key`` (a str, a pydantic ``SecretStr``, or None).
        collection: its ``collection`` argument, or None.
        owner: the store class's name, for messages.
        index: its ``index`` argument (an index given is never combined with a server, and is used as
            it is: a ``dim`` or ``metric`` other than its own, or a local option, is refused with it).
        dim: the dimension expected, or None for the server's (or the given index's).
        metric: the metric expected, or None for ``"cosine"`` (or the given index's).
        timeout: seconds a request may wait for the server's answer (None: ``GPUPROMPT_TIMEOUT``, else 60).
        local_options: ``name -> (value, default)`` of the options that only configure an
            in-process index: any not at its default is refused with a server, or with ``index``.

    Raises:
        ConfigurationError: a server without a collection, a collection without a server, a
            server together with ``index``, an in-process option with a server or with ``index``,
            a ``dim`` or ``metric`` that is not the given index's, or a malformed URL / key / name.
    """
    if base_url is None and api_key is None and collection is None:
        if index is not None:
            _check_given_index(index, owner, dim, metric, local_options or {})
        return None
    if index is not None:
        raise ConfigurationError(
            f"{owner} got index= together with a server collection (base_url, api_key or collection): pass one of "
            "them; a RemoteIndex can be passed as index= itself."
        )
    runtime = connect(base_url, api_key=api_key, timeout=timeout, owner=owner, local_options=local_options)
    if not runtime.remote:
        raise ConfigurationError(
            f"{owner} got collection={collection!r}, a collection of a running `gpuprompt serve`, but no server: "
            "pass base_url='http://host:port' (or set GPUPROMPT_URL), or drop collection to keep the index in process."
        )
    if collection is None:
        raise ConfigurationError(
            f"{owner} got a server ({runtime.config.shown_url!r}) but no collection: pass collection='name', the "
            "server collection to use (its first add creates it; GET /v1/collections lists them)."
        )
    return runtime.index(dim, collection=collection, metric=metric or "cosine")


def _check_given_index(index: Any, owner: str, dim: int | None, metric: str | None,
                       local_options: Mapping[str, tuple[Any, Any]]) -> None:
    """Refuse what would configure a new index next to one that is used as it is (it would be
    ignored silently): a dimension or metric other than the index's, or a local option."""
    for name, given, own in (("dim", dim, index.dim), ("metric", metric, index.metric)):
        if given is not None and given != own:
            raise ConfigurationError(
                f"{owner}: '{name}' is {given!r} but the given index uses {own!r}; drop '{name}' (the index's own "
                f"is used) or build the index with the {name} you want."
            )
    ignored = [name for name, (value, default) in local_options.items() if value != default]
    if ignored:
        raise ConfigurationError(
            f"{owner}: {', '.join(repr(name) for name in ignored)} configure a new index, but an index was given "
            "(it is used as it is); drop them, or set them on the index itself."
        )
