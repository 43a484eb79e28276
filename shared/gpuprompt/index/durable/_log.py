"""CollectionLog: one collection's write-ahead log (log first, then the index; checkpoints rotate
and retire segments). See :mod:`gpuprompt.index.durable` for the layout and the ordering."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from gpuprompt.index.durable._records import MAGIC, SNAPSHOT, CollectionDropped, _fsync_dir, _segment_name, _write_all

if TYPE_CHECKING:

    from gpuprompt.index import VectorIndex

__all__ = ["CollectionLog", "purge"]

logger = logging.getLogger("gpuprompt.index.durable")

T = TypeVar("T")

class CollectionLog:
    """The durable side of one collection: its folder, its log segments and its checkpoints.

    Args:
        folder: ``DIR/collections/<name>``; created by the first write when ``recovered`` is False.
        index: the collection's index (checkpoints save it).
        checkpoint_every: acknowledged writes between two checkpoints.
        segments: the segment numbers found on disk by a recovery.
        recovered: whether ``folder`` already exists (a collection found at start).
    """

    def __init__(
        self,
        folder: Path,
        index: VectorIndex,
        *,
        checkpoint_every: int,
        segments: Sequence[int] = (),
        recovered: bool = False,
    ) -> None:
        self.folder = folder
        self.index = index
        self._every = checkpoint_every
        self._lock = threading.Lock()  # one write (log + index) or rotation at a time
        self._checkpoint_lock = threading.Lock()  # one checkpoint at a time; a drop waits for it
        self._fd: int | None = None
        self._size = 0
        self._segments = list(segments)
        # Segments below this may go once the next snapshot is saved (see the module docstring).
        self._keep_from = self._segments[0] if self._segments else 1
        self._writes = 0
        self._exists = recovered
        self._state: Literal["open", "dropped", "closed"] = "open"
        self._broken: OSError | None = None

    def __repr__(self) -> str:
        return f"CollectionLog({str(self.folder)!r}, segments={self._segments}, state={self._state!r})"

    def write(self, record: bytes, apply: Callable[[], T]) -> tuple[T, bool]:
        """Append ``record`` and fsync it, then ``apply()`` it to the index; undo the record if that fails.

        Returns:
            ``(apply's result, whether a checkpoint is due)``.

        Raises:
            CollectionDropped: the collection was dropped meanwhile; nothing was written.
            OSError: the log could not be written (nothing was written, the index is unchanged),
                or is unusable since an earlier failure.
            Exception: what ``apply`` raised (the record was taken back out of the log).
        """
        with self._lock:
            self._check_usable()
            if self._fd is None:
                if self._exists:
                    self._rotate()  # a recovered collection before its first checkpoint
                else:
                    self._create()
            assert self._fd is not None
            start = self._size
            try:
                _write_all(self._fd, record)
                os.fsync(self._fd)
            except OSError as exc:
                self._undo(start)
                raise OSError(exc.errno, f"could not write {self._path(self._segments[-1])}: {exc.strerror}") from exc
            self._size = start + len(record)
            try:
                result = apply()
            except BaseException:
                self._undo(start)
                raise
            self._writes += 1
            return result, self._writes >= self._every

    def _check_usable(self) -> None:
        if self._state == "dropped":
            raise CollectionDropped(self.folder.name)
        if self._state == "closed":
            raise OSError(f"the data dir of collection {self.folder.name!r} is not open: the server is not "
                          "running (it is starting, or shutting down)")
        if self._broken is not None:
            raise OSError(
                f"the log of collection {self.folder.name!r} failed and could not be rolled back "
                f"({self._broken}); restart the server (acknowledged writes are safe)"
            )

    def _path(self, number: int) -> Path:
        return self.folder / _segment_name(number)

    def _create(self) -> None:
        """Make the collection's folder and first segment, durably (lock held)."""
        self.folder.mkdir()
        self._exists = True
        _fsync_dir(self.folder.parent)
        self._rotate()

    def _rotate(self) -> None:
        """Start a new segment and write to it from now on (lock held)."""
        number = self._segments[-1] + 1 if self._segments else 1
        path = self._path(number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            _write_all(fd, MAGIC)
            os.fsync(fd)
            _fsync_dir(self.folder)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        old, self._fd, self._size = self._fd, fd, len(MAGIC)
        self._segments.append(number)
        self._writes = 0
        if old is not None:
            os.close(old)

    def _undo(self, start: int) -> None:
        """Cut the log back to ``start`` (lock held); a log that cannot be cut is marked broken."""
        try:
            assert self._fd is not None
            os.ftruncate(self._fd, start)
            os.fsync(self._fd)
            self._size = start
        except OSError as exc:
            logger.error("could not take a failed write back out of %s (%s); refusing writes to %r until a "
                         "restart", self.folder, exc, self.folder.name)
            self._broken = exc

    def checkpoint(self) -> bool:
        """Rotate the log, save a snapshot, delete the segments no snapshot needs any more.

        Returns:
            False when there was nothing to do (never written, dropped, closed or broken).

        Raises:
            OSError, InvalidInputError: the rotation or the save failed; every segment is kept.
        """
        with self._checkpoint_lock:
            with self._lock:
                if self._state != "open" or not self._exists or self._broken is not None:
                    return False
                self._rotate()
                rotated = self._segments[-1]
            self.index.save(self.folder / SNAPSHOT)
            stale = [n for n in self._segments if n < self._keep_from]
            for number in stale:
                self._path(number).unlink(missing_ok=True)
            if stale:
                _fsync_dir(self.folder)
            with self._lock:
                self._segments = [n for n in self._segments if n not in stale]
            self._keep_from = rotated
            return True

    @contextmanager
    def exclusive(self, *, blocking: bool = True) -> Iterator[bool]:
        """Hold the log against checkpoints and writes; yields False when ``blocking`` is False and it is busy."""
        if not self._checkpoint_lock.acquire(blocking):
            yield False
            return
        try:
            if not self._lock.acquire(blocking):
                yield False
                return
            try:
                yield True
            finally:
                self._lock.release()
        finally:
            self._checkpoint_lock.release()

    def remove(self) -> Path | None:
        """Drop the collection on disk: rename its folder away, durably (hold :meth:`exclusive`).

        Returns:
            The renamed folder, for :func:`purge` to delete; None when there was no folder.

        Raises:
            OSError: the rename failed; nothing changed.
        """
        trash = None
        if self._exists:
            trash = self.folder.parent / f".{self.folder.name}.gpuprompt-dropped-{uuid.uuid4().hex}"
            os.rename(self.folder, trash)
            _fsync_dir(self.folder.parent)
        self._state = "dropped"
        self._close_fd()
        return trash

    def close(self) -> None:
        """Close the segment file; later writes fail (the server is shutting down)."""
        with self.exclusive():
            if self._state == "open":
                self._state = "closed"
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def purge(trash: Path | None) -> None:
    """Delete a folder :meth:`CollectionLog.remove` renamed away (a leftover is deleted at the next start)."""
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


