"""Indexes that outlive the process: snapshots plus write-ahead logs, one log per collection (the
storage behind ``gpuprompt serve --data-dir DIR``, usable without a server).

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

from gpuprompt.index.durable._data_dir import DataDir
from gpuprompt.index.durable._log import CollectionLog, purge
from gpuprompt.index.durable._records import (
    LOCK_NAME,
    MAGIC,
    CollectionDropped,
    LogRecord,
    encode_delete,
    encode_upsert,
    read_segment,
    replay_segment,
)

__all__ = [
    "LOCK_NAME",
    "MAGIC",
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
