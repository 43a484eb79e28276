"""The value types of conversation memory: :class:`Turn`, :class:`ContextStats`, the session ids a
cache accepts, and the append-only storage of one session (shared by the cache and its store sync)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuprompt.validation import check_str

__all__ = ["MAX_SESSIONS_LIMIT", "MAX_SESSION_ID_LENGTH", "MAX_TURNS_LIMIT", "ContextStats", "Session", "Turn",
           "check_session_id"]

MAX_SESSIONS_LIMIT = 100_000_000
"""Largest accepted ``max_sessions``."""
MAX_TURNS_LIMIT = 1_000_000
"""Largest accepted ``max_turns_per_session``."""
MAX_SESSION_ID_LENGTH = 1024
"""Longest accepted session id (the server's ``"<collection>/<session>"`` keys stay below 330)."""


def check_session_id(value: Any, name: str = "session_id") -> str:
    """Return ``value`` if a :class:`ContextCache` accepts it as a session id: a non-empty,
    well-formed str of at most :data:`MAX_SESSION_ID_LENGTH` characters.

    For surfaces that take a session id before they reach the cache (a default session, a tag on a
    message), so a value they accept never fails at the cache later.

    Raises:
        InputTypeError: not a str.
        InvalidInputError: empty, too long, or holding a lone surrogate.
    """
    checked = check_str(value, name, allow_empty=False, max_length=MAX_SESSION_ID_LENGTH)
    assert checked is not None
    return checked


@dataclass(frozen=True)
class Turn:
    """One message of a conversation.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"`` (``gpuprompt.llm._types.ROLES``:
            a stored turn always fits a :class:`~gpuprompt.llm.GenerationRequest`; a ``"tool"`` turn
            is a tool result, its text only).
        text: the message text.
        index: position in the session, counting from 0 (stable even after old turns are dropped).
        created_at: wall-clock time of the append (``time.time()``).
        tokens: the turn's length under the cache's token counter.
    """

    role: str
    text: str
    index: int
    created_at: float
    tokens: int

    def as_message(self) -> dict[str, str]:
        """The turn as a chat message dict ``{"role": ..., "content": ...}``."""
        return {"role": self.role, "content": self.text}


@dataclass(frozen=True)
class ContextStats:
    """Counters of a :class:`ContextCache`."""

    sessions: int
    turns: int
    evicted_sessions: int
    expired_sessions: int
    dropped_turns: int


@dataclass
class Session:
    """One session's storage: append-only rows, live from ``start`` to the end.

    ``turns[i]`` and row ``i`` of ``vectors`` describe the same turn for every ``i < len(turns)``;
    rows are written once and never changed, so a reader may keep ``(turns, vectors, start, end)``
    and read it without the lock. Only whole-object replacement (a new list and tensor) compacts.
    """

    turns: list[Turn] = field(default_factory=list)
    vectors: Any = None  # (capacity, dim) float32 tensor on the embedder's device, rows >= len(turns) unwritten
    start: int = 0
    next_index: int = 0
    last_access: float = 0.0
    epoch: str | None = None  # with a store: the stored session this is a copy of

    def live(self) -> list[Turn]:
        return self.turns[self.start :]
