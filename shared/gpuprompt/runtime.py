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

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache
    from gpuprompt.embed import Embedder
    from gpuprompt.llm import LLMEngine

__all__ = ["Runtime", "default_dtype", "get_runtime", "resolve_device"]

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

        unknown = sorted(set(options) - set(LLMConfig.option_names()))
        if unknown:
            raise ConfigurationError(f"unknown LLM option(s) {unknown}; valid options: {LLMConfig.option_names()}.")
        config = LLMConfig(model=model, **options)
        if config.device == "auto" and self._device_request != "auto":
            # Resolution is left to the first use: asking for a component loads nothing.
            config = config.replace(device=self._device_request)
        return self.get_or_create(("llm", config.key()), lambda: LLMEngine(config=config))

    def context_cache(
        self,
        embedder: Embedder | None = None,
        *,
        max_sessions: int = 10_000,
        ttl_seconds: float | None = 3600.0,
        max_turns_per_session: int = 1000,
    ) -> ContextCache:
        """The shared :class:`~gpuprompt.ContextCache` over ``embedder`` (default: :meth:`embedder`).

        The LangChain chat history and the LlamaIndex memory ask here by default, so one session
        id sees the same turns from both in one process (pass it as ``RAGPipeline(memory=...)`` to
        share it with a pipeline too). The same embedder and options return the same instance.
        """
        from gpuprompt.context import ContextCache

        if embedder is None:
            embedder = self.embedder()
        key = ("context", id(embedder), max_sessions, ttl_seconds, max_turns_per_session)
        return self.get_or_create(
            key,
            lambda: ContextCache(
                embedder,
                max_sessions=max_sessions,
                ttl_seconds=ttl_seconds,
                max_turns_per_session=max_turns_per_session,
            ),
        )

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


def _shutdown_default() -> None:
    with _default_lock:
        runtime = _default
    if runtime is not None:
        runtime.shutdown()
