"""The session-store protocol, its records, and the checks every store shares.

A store keeps each session as an append-only list of :class:`TurnRecord` (text, token count, the
turn's embedding as float32 bytes, and a tool call's or result's fields) plus a :class:`SessionHead`
that names the embedder that made the vectors; the store, not the caller, numbers the turns, so
several replicas can append to one session.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gpuprompt.errors import (
    ConfigurationError,
    DimensionMismatchError,
    EmbedderMismatchError,
    InputTypeError,
    InvalidInputError,
    SnapshotError,
)
from gpuprompt.llm._tools import MAX_ID, MAX_TOOLS, ToolCall
from gpuprompt.validation import INT64_MAX, check_choice, check_int, check_number, check_str, fail

__all__ = ["SessionHead", "SessionSlice", "SessionStore", "TurnRecord", "check_store"]

MAX_DIM = 65_536
"""Widest embedding a store accepts (the index's bound)."""
_FORMAT = 1
"""First byte of an encoded record; a reader refuses any other value. The tool fields of a record
are optional header keys, written only when set: records written before they existed read as turns
without them, and a turn without them is written exactly as before."""
_STATUSES = ("success", "error")
_PREFIX = struct.Struct("<BI")  # format byte, header length


@dataclass(frozen=True)
class TurnRecord:
    """One stored turn.

    Attributes:
        role: the turn's role (``"system"``, ``"user"``, ``"assistant"`` or ``"tool"`` for a ContextCache).
        text: the message text.
        tokens: the turn's length under the writer's token counter.
        created_at: wall-clock time of the append (``time.time()``).
        embedding: the turn's embedding as little-endian float32 bytes (``dim * 4`` bytes).
        index: the turn's position in its session; the store assigns it on append (the value given
            there is ignored) and sets it on every loaded record.
        tool_calls: an assistant turn's tool calls.
        tool_call_id: a tool result's call id (None: not given).
        name: a tool result's tool name (None: not given).
        status: a tool result's ``"success"`` or ``"error"`` (None: not given).
    """

    role: str
    text: str
    tokens: int
    created_at: float
    embedding: bytes = field(repr=False)
    index: int = -1
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    status: str | None = None


@dataclass(frozen=True)
class SessionHead:
    """What a store knows about a session besides its turns.

    Attributes:
        embedder: identity of the embedder whose vectors the session holds (``Embedder.identity``).
        dim: the embeddings' dimension.
        epoch: a token drawn when the session was created; a session dropped (or expired) and created
            again gets a new one, so a replica can tell its cached copy is of a session that is gone.
        next_index: turns appended so far, which is the next turn's index.
    """

    embedder: str
    dim: int
    epoch: str
    next_index: int


@dataclass(frozen=True)
class SessionSlice:
    """A session's head and its kept turns from some index on, chronological."""

    head: SessionHead
    records: list[TurnRecord]


@runtime_checkable
class SessionStore(Protocol):
    """Where a :class:`~gpuprompt.ContextCache` writes its turns through and loads sessions from.

    Implementations: :class:`~gpuprompt.context.stores.MemoryStore` (in-process) and
    :class:`~gpuprompt.context.stores.RedisStore` (shared by replicas). Every method is thread-safe; an
    append is all-or-nothing, and a store that cannot be reached raises a typed error
    (:class:`~gpuprompt.errors.SessionStoreError`) within its timeout, never hangs.

    Attributes:
        ttl_s: seconds a session lives after its last append (None: until dropped).
    """

    ttl_s: float | None

    def append(
        self, session_id: str, records: list[TurnRecord], *, embedder: str, dim: int, keep: int | None = None
    ) -> SessionHead:
        """Append ``records`` to a session (created on first use) as one atomic step, refresh its
        TTL, and keep only its last ``keep`` turns (None: all). Returns the head after the append;
        the first appended turn's index is ``head.next_index - len(records)``.

        Raises:
            EmbedderMismatchError: the session holds another embedder's vectors.
            DimensionMismatchError: the session holds vectors of another dimension.
        """
        ...

    def load(self, session_id: str, since: int = 0) -> SessionSlice | None:
        """The session's head and its kept turns whose index is >= ``since`` (None: no such session)."""
        ...

    def drop(self, session_id: str) -> None:
        """Forget one session (no error when it does not exist)."""
        ...

    def clear(self) -> None:
        """Forget every session of this store."""
        ...

    def sessions(self) -> list[str]:
        """The live session ids, least recently appended to first."""
        ...

    def close(self) -> None:
        """Release connections; the stored sessions stay."""
        ...


def check_store(store: Any) -> SessionStore | None:
    """Return ``store`` if it is None or implements :class:`SessionStore`.

    Raises:
        ConfigurationError: anything else (the message names the missing methods).
    """
    if store is None:
        return None
    missing = [
        name
        for name in ("append", "load", "drop", "clear", "sessions", "close")
        if not callable(getattr(store, name, None))
    ]
    if missing:
        raise fail(
            "store",
            "a gpuprompt.context.stores.SessionStore (MemoryStore, RedisStore) or None",
            store,
            fix=f"It lacks {', '.join(missing)}.",
            error=ConfigurationError,
        )
    return store


def check_append(session_id: Any, records: Any, embedder: Any, dim: Any, keep: Any) -> list[TurnRecord]:
    """Validate :meth:`SessionStore.append`'s arguments, before anything is written."""
    check_str(session_id, "session_id", allow_empty=False, max_length=1024)
    check_str(embedder, "embedder", allow_empty=False, max_length=512)
    check_int(dim, "dim", min=1, max=MAX_DIM)
    check_int(keep, "keep", min=1, allow_none=True)
    if not isinstance(records, (list, tuple)) or not records:
        raise fail("records", "a non-empty list of TurnRecord", records, error=InputTypeError)
    for i, record in enumerate(records):
        if not isinstance(record, TurnRecord):
            raise fail(f"records[{i}]", "a TurnRecord", record, error=InputTypeError)
        check_str(record.role, f"records[{i}].role", allow_empty=False, max_length=64)
        check_str(record.text, f"records[{i}].text")
        check_int(record.tokens, f"records[{i}].tokens", min=0, max=INT64_MAX)
        check_number(record.created_at, f"records[{i}].created_at")
        _check_tool_fields(record, f"records[{i}]")
        if not isinstance(record.embedding, bytes):
            raise fail(f"records[{i}].embedding", "float32 bytes", record.embedding, error=InputTypeError)
        if len(record.embedding) != 4 * dim:
            raise DimensionMismatchError(
                f"'records[{i}].embedding' holds {len(record.embedding)} bytes; a {dim}-d float32 vector "
                f"is {4 * dim} bytes.",
                expected=dim,
                got=len(record.embedding) // 4,
            )
    return list(records)


def _check_tool_fields(record: TurnRecord, name: str) -> None:
    calls = record.tool_calls
    if not isinstance(calls, tuple) or not all(isinstance(c, ToolCall) for c in calls):
        raise fail(f"{name}.tool_calls", "a tuple of gpuprompt.llm.ToolCall", calls, error=InputTypeError)
    if len(calls) > MAX_TOOLS:
        raise InvalidInputError(f"'{name}.tool_calls' must hold at most {MAX_TOOLS} calls (got {len(calls)}).")
    check_str(record.tool_call_id, f"{name}.tool_call_id", allow_none=True, allow_empty=False, max_length=MAX_ID)
    check_str(record.name, f"{name}.name", allow_none=True, allow_empty=False, max_length=64)
    if record.status is not None:
        check_choice(record.status, f"{name}.status", _STATUSES)


def mismatch(session_id: str, head: SessionHead, embedder: str, dim: int) -> InvalidInputError | None:
    """The error for appending (or reading) ``embedder``'s ``dim``-d vectors to a session made by
    ``head.embedder``, or None when they match."""
    if head.embedder != embedder:
        return EmbedderMismatchError(
            f"session {session_id!r} holds vectors from embedder {head.embedder!r}; vectors from {embedder!r} "
            "are in another space and would pick the wrong turns. Use the session's embedder for this "
            "ContextCache, or a store prefix per embedder.",
            expected=head.embedder,
            got=embedder,
        )
    if head.dim != dim:
        return DimensionMismatchError(
            f"session {session_id!r} holds {head.dim}-d vectors; got {dim}-d ones from the same embedder "
            f"{embedder!r}. Use one embedder configuration per session.",
            expected=head.dim,
            got=dim,
        )
    return None


def encode_record(record: TurnRecord) -> bytes:
    """One record as bytes: a format byte, the JSON header's length (uint32 LE), the UTF-8 JSON header
    (role, text, tokens, created_at; and, only when set, ``tool_calls`` as ``[{"id", "name",
    "arguments"}]``, ``tool_call_id``, ``name``, ``status``) and the raw float32 embedding. No
    pickle; exact floats; a call's arguments kept as the very JSON text given."""
    fields: dict[str, Any] = {
        "role": record.role, "text": record.text, "tokens": record.tokens, "created_at": record.created_at
    }
    if record.tool_calls:
        fields["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in record.tool_calls]
    for key in ("tool_call_id", "name", "status"):
        if getattr(record, key) is not None:
            fields[key] = getattr(record, key)
    header = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return _PREFIX.pack(_FORMAT, len(header)) + header + record.embedding


def decode_record(data: bytes, index: int, dim: int) -> TurnRecord:
    """Read :func:`encode_record`'s bytes back as the turn at ``index``.

    Raises:
        SnapshotError: the bytes are not a record of this format with a ``dim``-d embedding.
    """
    try:
        version, size = _PREFIX.unpack_from(data)
        end = _PREFIX.size + size
        header = json.loads(data[_PREFIX.size : end].decode("utf-8"))
        embedding = bytes(data[end:])
        role, text, tokens, created_at = header["role"], header["text"], header["tokens"], header["created_at"]
        ok = (
            version == _FORMAT
            and len(embedding) == 4 * dim
            and isinstance(role, str)
            and isinstance(text, str)
            and type(tokens) is int
            and tokens >= 0
            and isinstance(created_at, (int, float))
            and math.isfinite(created_at)
        )
        tools = _tool_fields(header) if ok else {}
    except (struct.error, UnicodeDecodeError, ValueError, KeyError, TypeError, OverflowError, AttributeError,
            InvalidInputError):
        ok = False
    if not ok:
        raise SnapshotError(
            f"stored turn {index} is not a gpuprompt session record of format {_FORMAT} with a {dim}-d "
            f"embedding ({len(data)} bytes); the store holds foreign or damaged data under this prefix."
        )
    return TurnRecord(role, text, tokens, float(created_at), embedding, index, **tools)


def _tool_fields(header: dict[str, Any]) -> dict[str, Any]:
    """The optional tool fields of a decoded header (absent in records written before them), checked
    as on append; anything malformed raises (the caller reports a damaged record)."""
    fields: dict[str, Any] = {}
    calls = header.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise TypeError("tool_calls")
        fields["tool_calls"] = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in calls)
    for key in ("tool_call_id", "name", "status"):
        if header.get(key) is not None:
            fields[key] = header[key]
    probe = TurnRecord("tool", "", 0, 0.0, b"", **fields)
    _check_tool_fields(probe, "record")
    return fields
