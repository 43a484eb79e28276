"""MemoryStore: the session store inside one process (unit tests, several caches in one process)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpuprompt.context.stores._protocol import SessionHead, SessionSlice, TurnRecord, check_append, mismatch
from gpuprompt.validation import check_clock, check_int, check_str, check_ttl

__all__ = ["MemoryStore"]


@dataclass
class _Stored:
    head: SessionHead
    records: list[TurnRecord] = field(default_factory=list)
    written_at: float = 0.0


class MemoryStore:
    """A :class:`~gpuprompt.context.stores.SessionStore` in this process's memory.

    It has the semantics of :class:`~gpuprompt.context.stores.RedisStore` (store-assigned indexes, epochs,
    TTL from the last append, embedder checks), so caches that share one see each other's turns;
    nothing outlives the process.

    Example:
        >>> from gpuprompt import ContextCache
        >>> from gpuprompt.context.stores import MemoryStore
        >>> store = MemoryStore()
        >>> emb = connect().embedder()
        >>> a, b = ContextCache(emb, store=store), ContextCache(emb, store=store)
        >>> _ = a.append("s1", "user", "Do you ship to Norway?")
        >>> [t.text for t in b.turns("s1")]
        ['Do you ship to Norway?']

    Args:
        ttl_s: seconds a session lives after its last append (a finite number > 0), or None.
        clock: the monotonic clock the TTL is measured with (tests pass one they control).

    Raises:
        ConfigurationError: an option has the wrong type or is out of range.
    """

    def __init__(self, *, ttl_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s: float | None = check_ttl(ttl_s, "ttl_s")
        self._clock = check_clock(clock)
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, _Stored] = OrderedDict()  # least recently appended first

    def __repr__(self) -> str:
        return f"<MemoryStore sessions={len(self._sessions)} ttl_s={self.ttl_s}>"

    def _purge(self) -> None:
        if self.ttl_s is None:
            return
        deadline = self._clock() - self.ttl_s
        while self._sessions:
            oldest_id, oldest = next(iter(self._sessions.items()))
            if oldest.written_at > deadline:
                break
            del self._sessions[oldest_id]

    def append(
        self, session_id: str, records: list[TurnRecord], *, embedder: str, dim: int, keep: int | None = None
    ) -> SessionHead:
        """See :meth:`SessionStore.append`."""
        records = check_append(session_id, records, embedder, dim, keep)
        with self._lock:
            self._purge()
            stored = self._sessions.get(session_id)
            if stored is None:
                stored = _Stored(SessionHead(embedder, dim, uuid.uuid4().hex[:16], 0))
            else:
                error = mismatch(session_id, stored.head, embedder, dim)
                if error is not None:
                    raise error
            first = stored.head.next_index
            added = [replace(record, index=first + i) for i, record in enumerate(records)]
            kept = stored.records + added
            stored.records = kept[-keep:] if keep is not None else kept
            stored.head = replace(stored.head, next_index=first + len(records))
            stored.written_at = self._clock()
            self._sessions[session_id] = stored
            self._sessions.move_to_end(session_id)
            return stored.head

    def load(self, session_id: str, since: int = 0) -> SessionSlice | None:
        """See :meth:`SessionStore.load`."""
        check_str(session_id, "session_id", allow_empty=False, max_length=1024)
        check_int(since, "since", min=0)
        with self._lock:
            self._purge()
            stored = self._sessions.get(session_id)
            if stored is None:
                return None
            return SessionSlice(stored.head, [r for r in stored.records if r.index >= since])

    def drop(self, session_id: str) -> None:
        """See :meth:`SessionStore.drop`."""
        check_str(session_id, "session_id", allow_empty=False, max_length=1024)
        with self._lock:
            self._sessions.pop(session_id, None)

    def clear(self) -> None:
        """See :meth:`SessionStore.clear`."""
        with self._lock:
            self._sessions.clear()

    def sessions(self) -> list[str]:
        """See :meth:`SessionStore.sessions`."""
        with self._lock:
            self._purge()
            return list(self._sessions)

    def close(self) -> None:
        """Nothing to release; the sessions stay readable."""
