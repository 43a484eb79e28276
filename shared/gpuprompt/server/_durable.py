"""Collections that outlive the process (``gpuprompt serve --data-dir DIR``): snapshots plus write-ahead logs.

Layout (gpuprompt reads and writes only these names under ``DIR``; anything else there is left alone)::

    DIR/.gpuprompt.lock                          flock held by the serving process (one server per DIR)
    DIR/collections/<name>/snapshot              the collection's VectorIndex snapshot (VectorIndex.save)
    DIR/collections/<name>/.snapshot.gpuprompt-* the snapshot protocol's previous / temporary generations
    DIR/collections/<name>/wal-00000001.log      log segments: the acknowledged writes since older snapshots
    DIR/collections/.<name>.gpuprompt-dropped-<32 hex>   a dropped collection being deleted

**One log per collection**, not one per server: a write holds only its own collection's lock while
it is logged and applied, so collections never queue behind each other's fsyncs; the record being
written is always the last one in its file, so a write that fails after logging is undone by
truncating the file back (no compensating record); a checkpoint rotates and retires one
collection's segments without coordinating with the others; and a drop is one atomic, durable
``rename`` of the collection's folder, so it needs no log record and a recreated collection of the
same name starts from a fresh folder.

**Record format.** A segment starts with the 8-byte magic ``GPWAL001``; then records, each::

    uint32 length | uint32 crc32(payload) | uint32 crc32(the 8 bytes before) | payload (length bytes)

(little-endian). An upsert's payload is ``b"U"``, a uint32 JSON length, the JSON ``{"ids",
"documents", "metadatas", "embedder", "dim"}`` and the vectors as ``n * dim`` little-endian float32
(so a replay never re-embeds); a delete's is ``b"D"`` and the JSON ``{"ids"}``. Generated ids are
chosen before logging, so a replay makes the same ids. A kill -9 leaves a prefix of what was
written: a record that runs past the end of its file, or a final one whose checksum fails, or an
all-zero tail, is a torn write that was never acknowledged and is dropped (and cut off) on replay.
A record that fails its checksum with more data after it is corruption of acknowledged data: the
start fails with a :class:`~gpuprompt.errors.SnapshotError` naming the file and byte offset; it is
never skipped.

**Ordering: log first, then the index.** Under the collection's lock a write is appended and
fsynced, then applied to the index; the HTTP 200 is sent after both. If the log write fails, the
partial record is truncated away and the index was never touched; if the index refuses the write
(it changes nothing when it does), the logged record is truncated away too. Searches therefore
only ever see writes that are already durable. (The other order, index first and roll back on a
failed log write, would let searches see writes that then vanish, and a rollback of an upsert
needs the replaced records.) If even the truncation fails, the log is marked broken and every
later write to that collection fails with a 503 until a restart; replay then keeps or drops that
one unacknowledged write, which a client that got an error must expect of any write.

**Checkpoints.** A checkpoint rotates to a new segment (under the collection's lock: one file
create and fsync), saves a snapshot (``VectorIndex.save``: atomic and crash-safe; it holds the
index's read lock, so index writes wait for the save, searches do not), then deletes the segments
older than the *previous* checkpoint's rotation. Replay is idempotent (every record sets or deletes
whole records by id, with the ids fixed in the record), so replaying a segment whose writes are
already in the snapshot is harmless; keeping one extra checkpoint's segments means that even when
``VectorIndex.load`` falls back to the snapshot's previous generation (the newest one damaged or
cut by a crash), the log still holds every write since it. Checkpoints run at start (after the
replay), every ``checkpoint_every`` acknowledged writes of a collection (in one background thread,
off the event loop), and at clean shutdown.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from gpuprompt.errors import ConfigurationError, InvalidInputError, SnapshotError

if TYPE_CHECKING:
    from filelock import BaseFileLock

    from gpuprompt.index import VectorIndex

__all__ = [
    "LOCK_NAME",
    "CollectionDropped",
    "CollectionLog",
    "DataDir",
    "LogRecord",
    "encode_delete",
    "encode_upsert",
    "purge",
    "read_segment",
    "replay_segment",
]

logger = logging.getLogger("gpuprompt.server")

T = TypeVar("T")

LOCK_NAME = ".gpuprompt.lock"
"""The lock file under the data dir, held (flock) by the server that serves it."""
COLLECTIONS = "collections"
SNAPSHOT = "snapshot"
MAGIC = b"GPWAL001"
"""The first 8 bytes of every log segment (format version 1)."""
_HEADER = struct.Struct("<III")  # payload length, crc32(payload), crc32(first 8 header bytes)
_MAX_PAYLOAD = 1 << 31
_SEGMENT = re.compile(r"wal-(\d{8,})\.log")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # server._collections.COLLECTION_NAME_PATTERN
_DROPPED = re.compile(r"\..+\.gpuprompt-dropped-[0-9a-f]{32}")


class CollectionDropped(Exception):
    """Internal: the collection's log was closed by a drop while a write waited for it."""


@dataclass(frozen=True)
class LogRecord:
    """One write read back from a log segment."""

    kind: Literal["upsert", "delete"]
    ids: list[str]
    offset: int
    """The record's byte offset in its segment."""
    documents: list[str | None] | None = None
    metadatas: list[dict[str, Any] | None] | None = None
    vectors: np.ndarray | None = None
    embedder: str | None = None


# ---------------------------------------------------------------------------------------- records
def _json(value: Any) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (ValueError, TypeError) as exc:  # lone surrogates, NaN, a non-JSON value
        raise InvalidInputError(
            f"the records cannot be written to the server's data dir log ({exc}); send well-formed UTF-8 text "
            "and JSON metadata with finite numbers. Nothing was stored."
        ) from exc


def _frame(payload: bytes) -> bytes:
    if len(payload) >= _MAX_PAYLOAD:
        raise InvalidInputError(
            f"one write must be under {_MAX_PAYLOAD} bytes in the data dir log (got {len(payload)}); send fewer "
            "documents per request. Nothing was stored."
        )
    head = struct.pack("<II", len(payload), zlib.crc32(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload


def encode_upsert(
    ids: Sequence[str],
    vectors: np.ndarray,
    documents: Sequence[str | None] | None,
    metadatas: Sequence[dict[str, Any] | None] | None,
    embedder: str | None,
) -> bytes:
    """The framed log record of an upsert (ids already chosen: a replay must make the same ones).

    Raises:
        InvalidInputError: the records cannot be encoded (text that is not valid UTF-8, NaN in
            metadata, ``vectors`` not one float row per id); nothing was written.
    """
    matrix = np.ascontiguousarray(vectors, dtype="<f4")
    if matrix.ndim != 2 or matrix.shape[0] != len(ids):
        raise InvalidInputError(
            f"'vectors' must be one row per id ({len(ids)}) (got shape {tuple(matrix.shape)})."
        )
    head = _json({
        "ids": list(ids),
        "documents": None if documents is None else list(documents),
        "metadatas": None if metadatas is None else list(metadatas),
        "embedder": embedder,
        "dim": int(matrix.shape[1]),
    })
    return _frame(b"U" + struct.pack("<I", len(head)) + head + matrix.tobytes())


def encode_delete(ids: Sequence[str]) -> bytes:
    """The framed log record of a delete by id.

    Raises:
        InvalidInputError: an id cannot be encoded as UTF-8.
    """
    return _frame(b"D" + _json({"ids": list(ids)}))


def _corrupt(path: Path, offset: int, why: str) -> SnapshotError:
    return SnapshotError(
        f"data dir log {str(path)!r} is corrupt at byte offset {offset}: {why}. Acknowledged writes follow "
        f"it, so the server will not skip it; restore {str(path.parent)!r} from a backup, or move that "
        "collection's folder out of the data dir to start without it."
    )


def _decode(payload: bytes, path: Path, offset: int) -> LogRecord:
    try:
        kind = payload[:1]
        if kind == b"D":
            head = json.loads(payload[1:].decode("utf-8"))
            return LogRecord("delete", list(head["ids"]), offset)
        if kind != b"U":
            raise ValueError(f"unknown record kind {kind!r}")
        (size,) = struct.unpack_from("<I", payload, 1)
        head = json.loads(payload[5 : 5 + size].decode("utf-8"))
        ids, dim = list(head["ids"]), int(head["dim"])
        raw = payload[5 + size :]
        if len(raw) != len(ids) * dim * 4:
            raise ValueError(f"{len(raw)} vector bytes for {len(ids)} ids of dimension {dim}")
        vectors = np.frombuffer(raw, dtype="<f4").reshape(len(ids), dim).astype(np.float32)
        return LogRecord("upsert", ids, offset, head["documents"], head["metadatas"], vectors, head["embedder"])
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise _corrupt(path, offset, f"its checksum matches but it cannot be decoded ({exc})") from exc


def _zeros_from(file: Any, offset: int, size: int) -> bool:
    """Whether every byte from ``offset`` to the end is zero (a tail a crash left unwritten)."""
    file.seek(offset)
    while chunk := file.read(1 << 20):
        if chunk.strip(b"\0"):
            return False
    return offset < size


def replay_segment(path: str | os.PathLike[str], apply: Callable[[LogRecord], None]) -> int:
    """Call ``apply`` on each whole record of the segment at ``path``, in order.

    Returns:
        The length of the segment's valid prefix: less than the file's size when a torn final
        record (cut by a crash, never acknowledged) was dropped.

    Raises:
        SnapshotError: a record other than the last fails its checksum or cannot be decoded (the
            message names the file and byte offset), or the file is not a log segment.
    """
    path = Path(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        magic = file.read(len(MAGIC))
        if not size:
            return 0  # a segment whose creation a crash cut short, already cut back by a recovery
        if magic != MAGIC:
            if len(magic) < len(MAGIC) and (MAGIC.startswith(magic) or not magic.strip(b"\0")):
                return _torn(path, 0, size)  # created by a rotation a crash cut short
            raise _corrupt(path, 0, f"it does not start with {MAGIC!r}, the header of a gpuprompt log of this version")
        offset = len(MAGIC)
        while offset < size:
            file.seek(offset)
            header = file.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return _torn(path, offset, size)
            length, crc, header_crc = _HEADER.unpack(header)
            if zlib.crc32(header[:8]) != header_crc:
                if _zeros_from(file, offset, size):
                    return _torn(path, offset, size)
                raise _corrupt(path, offset, "its header checksum does not match")
            if not 0 < length < _MAX_PAYLOAD:
                raise _corrupt(path, offset, f"its header gives an impossible length {length}")
            end = offset + _HEADER.size + length
            if end > size:
                return _torn(path, offset, size)
            payload = file.read(length)
            if zlib.crc32(payload) != crc:
                if end == size:
                    return _torn(path, offset, size)
                raise _corrupt(path, offset, f"its checksum does not match and {size - end} more bytes follow it")
            apply(_decode(payload, path, offset))
            offset = end
    return offset


def _torn(path: Path, offset: int, size: int) -> int:
    logger.warning("data dir log %s: dropping %d bytes at offset %d, a last write cut short by a crash "
                   "(it was never acknowledged)", path, size - offset, offset)
    return offset


def read_segment(path: str | os.PathLike[str]) -> tuple[list[LogRecord], int]:
    """Every whole record of a segment and the length of its valid prefix (see :func:`replay_segment`)."""
    records: list[LogRecord] = []
    valid = replay_segment(path, records.append)
    return records, valid


# ---------------------------------------------------------------------------------------- files
def _fsync_dir(path: Path) -> None:
    """Make a folder's entries (a new, renamed or deleted name) durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds (Windows)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _segment_name(number: int) -> str:
    return f"wal-{number:08d}.log"


def _segments(folder: Path) -> list[int]:
    return sorted(int(m.group(1)) for entry in os.listdir(folder) if (m := _SEGMENT.fullmatch(entry)))


# ---------------------------------------------------------------------------------------- one collection
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
