"""The async twins of VectorIndex's writes, locked reads, saves and loads, run off the event loop.

:func:`off_loop` runs each in a worker thread, settled on cancel; ``asearch`` / ``ammr`` queue on the batch worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gpuprompt.index._config import BackendName
    from gpuprompt.index._index import VectorIndex
    from gpuprompt.index._types import Record

__all__ = ["AsyncIndexMixin", "off_loop"]

T = TypeVar("T")


class _Gate:
    """Decides, once, whether a queued call runs or was cancelled before it started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = False
        self.cancelled = False

    def start(self) -> bool:
        with self._lock:
            self.started = not self.cancelled
            return self.started

    def cancel(self) -> bool:
        """Mark the call cancelled; True if it had not started (then it never will)."""
        with self._lock:
            self.cancelled = True
            return not self.started


async def off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` in the event loop's default thread pool and return its result.

    The loop keeps running while ``fn`` does (it may wait on the index's locks and do CPU work);
    context variables travel with the call, as with :func:`asyncio.to_thread`.

    Cancellation never leaves ``fn`` half-done behind the caller's back: a call that has not
    started yet is dropped and never runs; one that is running cannot be interrupted, so the
    cancellation waits (without blocking the loop) until it has finished. When ``CancelledError``
    reaches the caller, the call's effects are therefore complete, or absent.
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    gate = _Gate()

    def call() -> Any:
        if not gate.start():
            return None  # cancelled while queued: never run
        return context.run(fn, *args, **kwargs)

    future = loop.run_in_executor(None, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if not gate.cancel():
            while not future.done():
                try:
                    await asyncio.wait({future})
                except asyncio.CancelledError:
                    continue  # cancelled again: still wait, the call is running
        future.add_done_callback(_consume)
        raise


def _consume(future: asyncio.Future[Any]) -> None:
    """Mark the result of an abandoned call as seen (its caller was cancelled)."""
    if not future.cancelled():
        future.exception()


class AsyncIndexMixin:
    """The async twins of :class:`~gpuprompt.VectorIndex`'s blocking operations (mixed into it).

    Each returns what its sync twin returns and raises what it raises. Writes (``aadd``,
    ``adelete``, ``aclear``), locked reads (``aget``, ``aids``), ``asave`` and ``aload`` run in a
    worker thread through :func:`off_loop`: cancelling one leaves it done or not started, never
    half done. (``asearch`` and ``ammr`` are on the class itself: they queue on its batch worker.)
    """

    async def aadd(
        self: VectorIndex,
        ids: Sequence[str | None] | None,
        vectors: Any,
        documents: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> list[str]:
        """Async :meth:`add`: checks and the write run in a worker thread; the loop keeps running.

        The write is atomic: if the awaiting task is cancelled, the add either never starts or,
        already running, completes before ``CancelledError`` is raised -- never half of it.
        """
        return await off_loop(self.add, ids, vectors, documents, metadatas)

    async def adelete(self: VectorIndex, ids: Sequence[str]) -> int:
        """Async :meth:`delete`, in a worker thread (cancellation as for :meth:`aadd`)."""
        return await off_loop(self.delete, ids)

    async def aclear(self: VectorIndex) -> None:
        """Async :meth:`clear`, in a worker thread (cancellation as for :meth:`aadd`)."""
        await off_loop(self.clear)

    async def aget(self: VectorIndex, ids: Sequence[str]) -> list[Record]:
        """Async :meth:`get`, in a worker thread (it may wait for a writer's lock)."""
        return await off_loop(self.get, ids)

    async def aids(self: VectorIndex, filter: Mapping[str, Any] | None = None) -> list[str]:
        """Async :meth:`ids`, in a worker thread (it may wait for a lock and evaluate a filter)."""
        return await off_loop(self.ids, filter)

    async def asave(self: VectorIndex, path: str | Path) -> None:
        """Async :meth:`save`, in a worker thread; a cancelled save has finished or never started."""
        await off_loop(self.save, path)

    @classmethod
    async def aload(
        cls: type[VectorIndex],
        path: str | Path,
        device: str = "auto",
        *,
        backend: BackendName | None = None,
        **options: Any,
    ) -> VectorIndex:
        """Async :meth:`load`: reading, verifying and building the backend run in a worker thread."""
        return await off_loop(cls.load, path, device, backend=backend, **options)
