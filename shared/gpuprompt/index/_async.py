"""The async twins of VectorIndex's writes, locked reads, saves and loads, run off the event loop.

:func:`off_loop` runs each in a worker thread, settled on cancel; ``asearch`` / ``ammr`` queue on the batch worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gpuprompt.index._config import BackendName
    from gpuprompt.protocols import IndexLike
    from gpuprompt.index._types import Record

from gpuprompt.bridge import off_loop

__all__ = ["AsyncIndexMixin", "off_loop"]

T = TypeVar("T")


class AsyncIndexMixin:
    """The async twins of :class:`~gpuprompt.VectorIndex`'s blocking operations (mixed into it).

    Each returns what its sync twin returns and raises what it raises. Writes (``aadd``,
    ``adelete``, ``aclear``), locked reads (``aget``, ``aids``), ``asave`` and ``aload`` run in a
    worker thread through :func:`off_loop`: cancelling one leaves it done or not started, never
    half done. (``asearch`` and ``ammr`` are on the class itself: they queue on its batch worker.)
    """

    async def aadd(
        self: IndexLike,
        ids: Sequence[str | None] | None,
        vectors: Any,
        documents: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        embedder: str | None = None,
        allow_other_embedder: bool = False,
    ) -> list[str]:
        """Async :meth:`add`: checks and the write run in a worker thread; the loop keeps running.

        The write is atomic: if the awaiting task is cancelled, the add either never starts or,
        already running, completes before ``CancelledError`` is raised -- never half of it.
        """
        return await off_loop(
            self.add, ids, vectors, documents, metadatas, embedder=embedder, allow_other_embedder=allow_other_embedder
        )

    async def adelete(self: IndexLike, ids: Sequence[str]) -> int:
        """Async :meth:`delete`, in a worker thread (cancellation as for :meth:`aadd`)."""
        return await off_loop(self.delete, ids)

    async def aclear(self: IndexLike) -> None:
        """Async :meth:`clear`, in a worker thread (cancellation as for :meth:`aadd`)."""
        await off_loop(self.clear)

    async def aget(self: IndexLike, ids: Sequence[str]) -> list[Record]:
        """Async :meth:`get`, in a worker thread (it may wait for a writer's lock)."""
        return await off_loop(self.get, ids)

    async def aids(self: IndexLike, filter: Mapping[str, Any] | None = None) -> list[str]:
        """Async :meth:`ids`, in a worker thread (it may wait for a lock and evaluate a filter)."""
        return await off_loop(self.ids, filter)

    async def asave(self: IndexLike, path: str | Path) -> None:
        """Async :meth:`save`, in a worker thread; a cancelled save has finished or never started."""
        await off_loop(self.save, path)

    @classmethod
    async def aload(
        cls: type[Any],
        path: str | Path,
        device: str = "auto",
        *,
        backend: BackendName | None = None,
        **options: Any,
    ) -> Any:
        """Async :meth:`load`: reading, verifying and building the backend run in a worker thread."""
        return await off_loop(cls.load, path, device, backend=backend, **options)
