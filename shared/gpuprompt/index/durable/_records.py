"""The write-ahead log's record format: framing, checksums, upsert/delete payloads, replay of a
segment (torn tails dropped, corruption refused). See :mod:`gpuprompt.index.durable` for the layout."""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from gpuprompt.errors import InvalidInputError, SnapshotError

__all__ = ["LOCK_NAME", "MAGIC", "CollectionDropped", "LogRecord", "encode_delete", "encode_upsert", "read_segment",
           "replay_segment"]

logger = logging.getLogger("gpuprompt.index.durable")

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
