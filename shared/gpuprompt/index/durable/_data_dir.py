"""DataDir: the folder of one server's durable collections: its lock, the recovery of every
collection (snapshot + log replay) and the checkpoint thread."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from gpuprompt.errors import ConfigurationError, SnapshotError
from gpuprompt.index.durable._log import CollectionLog, purge
from gpuprompt.index.durable._records import (
    _DROPPED,
    _NAME,
    _SEGMENT,
    COLLECTIONS,
    LOCK_NAME,
    SNAPSHOT,
    LogRecord,
    _fsync_dir,
    _segment_name,
    _segments,
    replay_segment,
)

if TYPE_CHECKING:
    from filelock import BaseFileLock

    from gpuprompt.index import VectorIndex

__all__ = ["DataDir"]

logger = logging.getLogger("gpuprompt.index.durable")

# ---------------------------------------------------------------------------------------- the data dir
class DataDir:
    """The data dir of one server: its lock, its collections' logs and the checkpoint thread.

    Args:
        path: the folder (created if missing).
        checkpoint_every: acknowledged writes of one collection between two checkpoints.
    """

    def __init__(self, path: str | os.PathLike[str], *, checkpoint_every: int) -> None:
        self.path = Path(path)
        self.checkpoint_every = checkpoint_every
        self._root = self.path / COLLECTIONS
        self._file_lock: BaseFileLock | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._guard = threading.Lock()
        self._scheduled: set[CollectionLog] = set()
        self._idle = threading.Condition(self._guard)
        self._closed = False

    def __repr__(self) -> str:
        return f"DataDir({str(self.path)!r}, locked={self._file_lock is not None})"

    def acquire(self) -> None:
        """Create the folder if needed and take its lock, so no other server uses it.

        Raises:
            ConfigurationError: another live server holds the folder, or it cannot be created or locked.
        """
        from filelock import FileLock, Timeout

        lock_path = self.path / LOCK_NAME
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            lock = FileLock(lock_path, timeout=0, thread_local=False)
            lock.acquire()
        except Timeout:
            raise ConfigurationError(
                f"'data_dir' {str(self.path)!r} is in use by another gpuprompt server (it holds "
                f"{str(lock_path)!r}); stop that server first, or give this one another --data-dir."
            ) from None
        except OSError as exc:
            raise ConfigurationError(
                f"'data_dir' must be a folder this server can create and write (got {str(self.path)!r}: {exc})."
            ) from exc
        self._file_lock = lock
        try:
            self._root.mkdir(exist_ok=True)
            _fsync_dir(self.path)
        except OSError as exc:
            self.release()
            raise ConfigurationError(
                f"'data_dir' must be a folder this server can write (could not create {str(self._root)!r}: {exc})."
            ) from exc

    def release(self) -> None:
        """Release the folder's lock (idempotent)."""
        lock, self._file_lock = self._file_lock, None
        if lock is not None:
            lock.release()

    def new_log(self, name: str, index: VectorIndex) -> CollectionLog:
        """The log of a new collection (its folder is made by its first write)."""
        log = CollectionLog(self._root / name, index, checkpoint_every=self.checkpoint_every)
        if self._closed or self._file_lock is None:
            log._state = "closed"
        return log

    def recover(self, new_index: Callable[[], VectorIndex], device: str) -> dict[str, CollectionLog]:
        """Load every collection's snapshot and replay its log (no checkpoint yet: see :meth:`checkpoint_all`).

        Args:
            new_index: builds the empty index of a collection that has no snapshot yet.
            device: where loaded indexes run.

        Returns:
            ``{name: log}``, sorted by name; each log's ``index`` holds the collection.

        Raises:
            SnapshotError: a snapshot or a log record that is damaged (not a torn last write).
        """
        found: dict[str, CollectionLog] = {}
        for entry in sorted(os.listdir(self._root)):
            path = self._root / entry
            if _DROPPED.fullmatch(entry):
                purge(path)  # a drop that a crash interrupted after its rename
            elif _NAME.fullmatch(entry) and path.is_dir() and not path.is_symlink():
                log = self._recover_one(path, new_index, device)
                if log is not None:
                    found[entry] = log
        return found

    def _recover_one(self, folder: Path, new_index: Callable[[], VectorIndex], device: str) -> CollectionLog | None:
        from gpuprompt.index import VectorIndex
        from gpuprompt.index._persist import snapshot_names

        names = snapshot_names(folder / SNAPSHOT)
        has_snapshot = os.path.lexists(names["main"]) or os.path.lexists(names["prev"])
        index = VectorIndex.load(folder / SNAPSHOT, device=device) if has_snapshot else new_index()
        segments = _segments(folder)
        applied = 0

        def apply(record: LogRecord, path: Path) -> None:
            nonlocal applied
            try:
                if record.kind == "upsert":
                    index.add(record.ids, record.vectors, record.documents, record.metadatas,
                              embedder=record.embedder)
                else:
                    index.delete(record.ids)
            except Exception as exc:  # any refusal: a record this index cannot take
                raise SnapshotError(
                    f"data dir log {str(path)!r}: the record at byte offset {record.offset} could not be "
                    f"replayed ({type(exc).__name__}: {exc}); start with the embedding model that wrote it, or "
                    f"move {str(folder)!r} out of the data dir."
                ) from exc
            applied += 1

        try:
            for number in segments:
                path = folder / _segment_name(number)
                valid = replay_segment(path, lambda record, path=path: apply(record, path))
                if valid < path.stat().st_size:
                    with open(path, "r+b") as file:  # cut the torn tail, so later replays agree
                        file.truncate(valid)
                        os.fsync(file.fileno())
        except BaseException:
            index.close()
            raise
        if not has_snapshot and applied == 0:
            # No write of this collection was ever acknowledged (a crash during its first one).
            index.close()
            if all(_SEGMENT.fullmatch(entry) for entry in os.listdir(folder)):
                shutil.rmtree(folder, ignore_errors=True)
                _fsync_dir(self._root)
            else:
                logger.warning("data dir: %s holds neither a snapshot nor a logged write; not serving it", folder)
            return None
        logger.info("data dir: collection %r: %d records (%d logged writes replayed)", folder.name, index.count,
                    applied)
        return CollectionLog(folder, index, checkpoint_every=self.checkpoint_every, segments=segments,
                             recovered=True)

    def checkpoint_all(self, logs: Sequence[CollectionLog]) -> None:
        """Checkpoint each log now, in this thread.

        Raises:
            OSError: a checkpoint failed (the logs keep every segment).
        """
        for log in logs:
            log.checkpoint()

    def schedule_checkpoint(self, log: CollectionLog) -> None:
        """Checkpoint ``log`` soon in the background thread (once, however often it is asked meanwhile)."""
        with self._guard:
            if self._closed or log in self._scheduled:
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuprompt-checkpoint")
            self._scheduled.add(log)
            self._executor.submit(self._run_checkpoint, log)

    def _run_checkpoint(self, log: CollectionLog) -> None:
        try:
            log.checkpoint()
        except Exception as exc:  # noqa: BLE001 - the log keeps every segment; the next checkpoint retries
            logger.warning("data dir: checkpoint of %s failed (its log is kept, nothing is lost): %s", log.folder, exc)
        finally:
            with self._guard:
                self._scheduled.discard(log)
                self._idle.notify_all()

    def wait_for_checkpoints(self, timeout: float | None = None) -> bool:
        """Wait until no background checkpoint is queued or running; False if ``timeout`` passed first."""
        with self._guard:
            return self._idle.wait_for(lambda: not self._scheduled, timeout)

    def close(self, logs: Sequence[CollectionLog]) -> None:
        """Stop the checkpoint thread, checkpoint and close ``logs``, release the folder's lock."""
        with self._guard:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            # A queued checkpoint is dropped (the final one below covers it); a running one finishes.
            executor.shutdown(wait=True, cancel_futures=True)
            with self._guard:
                self._scheduled.clear()
                self._idle.notify_all()
        try:
            if self._file_lock is not None:
                for log in logs:
                    try:
                        log.checkpoint()
                    except Exception as exc:  # noqa: BLE001 - its log is kept: the next start replays it
                        logger.warning("data dir: final checkpoint of %s failed (the next start replays its log): "
                                       "%s", log.folder, exc)
        finally:
            for log in logs:
                log.close()
            self.release()
