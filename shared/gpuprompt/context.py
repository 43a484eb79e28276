"""ContextCache: per-session conversation memory whose turn embeddings stay on the device.

A turn is embedded once, when appended; ``window`` picks the recent turns plus the older turns most
similar to the query with one matrix-vector product on the device, within turn and token budgets.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, describe

if TYPE_CHECKING:
    import torch

    from gpuprompt.embedder import Embedder

__all__ = ["ContextCache", "ContextStats", "Turn"]

ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class Turn:
    """One message of a conversation.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``.
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
class _Session:
    turns: list[Turn] = field(default_factory=list)
    vectors: Any = None  # (capacity, dim) float32 tensor on the embedder's device
    next_index: int = 0
    last_access: float = 0.0


class ContextCache:
    """Per-session conversation memory with device-resident turn embeddings.

    Sessions are isolated (a window only ever reads its own session), bounded by ``max_sessions``
    (least recently used evicted), ``ttl_seconds`` of inactivity and ``max_turns_per_session``
    (oldest turns dropped). Thread-safe.

    Example:
        >>> from gpuprompt import ContextCache
        >>> memory = ContextCache()
        >>> memory.extend("s1", [("user", "I want a red dress in cotton."),
        ...                      ("assistant", "The Aurora dress is 100% cotton, 49 EUR."),
        ...                      ("user", "Do you ship to Norway?")])
        [...]
        >>> [t.text for t in memory.window("s1", query="will the dress shrink?", max_turns=2)]
        ['I want a red dress in cotton.', 'Do you ship to Norway?']

    Args:
        embedder: the embedder for turns and queries (default: the runtime's shared embedder).
        max_sessions: most sessions kept; the least recently used is evicted beyond it.
        ttl_seconds: a session untouched this long is dropped; None keeps sessions for ever.
        max_turns_per_session: most turns kept per session; older ones are dropped.
        token_counter: counts a text's tokens for ``max_tokens`` budgets (default: the embedder's
            tokenizer; pass the LLM's ``count_tokens`` for exact prompt budgets).
        clock: the monotonic clock TTLs are measured with (tests pass one they control).
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        max_sessions: int = 10_000,
        ttl_seconds: float | None = 3600.0,
        max_turns_per_session: int = 1000,
        token_counter: Callable[[str], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (("max_sessions", max_sessions), ("max_turns_per_session", max_turns_per_session)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"'{name}' must be an int >= 1 (got {describe(value)}).")
        if ttl_seconds is not None and (not isinstance(ttl_seconds, (int, float)) or ttl_seconds <= 0):
            raise ConfigurationError(f"'ttl_seconds' must be None or a number > 0 (got {describe(ttl_seconds)}).")
        self._embedder = embedder
        self.max_sessions = max_sessions
        self.ttl_seconds = ttl_seconds
        self.max_turns_per_session = max_turns_per_session
        self._token_counter = token_counter
        self._clock = clock
        self._lock = threading.RLock()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._evicted = self._expired = self._dropped = 0

    def __repr__(self) -> str:
        return f"<ContextCache sessions={len(self._sessions)} max_sessions={self.max_sessions} ttl={self.ttl_seconds}>"

    @property
    def embedder(self) -> Embedder:
        """The embedder used for turns and queries."""
        if self._embedder is None:
            from gpuprompt.runtime import get_runtime

            self._embedder = get_runtime().embedder()
        return self._embedder

    # ------------------------------------------------------------------ validation
    @staticmethod
    def _check_session(session_id: Any) -> str:
        if not isinstance(session_id, str) or not session_id:
            raise InputTypeError(f"'session_id' must be a non-empty str (got {describe(session_id)}).")
        return session_id

    @staticmethod
    def _check_turn(role: Any, text: Any) -> None:
        if role not in ROLES:
            raise InvalidInputError(f"'role' must be one of {sorted(ROLES)} (got {describe(role)}).")
        if not isinstance(text, str):
            raise InputTypeError(f"'text' must be a str (got {describe(text)}).")

    def _count(self, text: str) -> int:
        if self._token_counter is not None:
            return int(self._token_counter(text))
        return self.embedder._count_tokens([text])[0]

    # ------------------------------------------------------------------ writes
    def append(self, session_id: str, role: str, text: str) -> Turn:
        """Add one turn to a session (created on first use); embeds the text once.

        Raises:
            InputTypeError: ``session_id`` or ``text`` has the wrong type.
            InvalidInputError: ``role`` is not a known role.
        """
        return self.extend(session_id, [(role, text)])[0]

    def extend(self, session_id: str, turns: Iterable[tuple[str, str] | Mapping[str, str]]) -> list[Turn]:
        """Add several turns at once (one batched embedding call). Accepts ``(role, text)`` pairs or
        ``{"role": ..., "content": ...}`` dicts. All are validated before anything is stored."""
        self._check_session(session_id)
        pairs = [_pair(turn, i) for i, turn in enumerate(turns)]
        for role, text in pairs:
            self._check_turn(role, text)
        if not pairs:
            return []
        vectors = self.embedder.embed_tensor([text for _, text in pairs])
        return self._store(session_id, pairs, vectors)

    async def aappend(self, session_id: str, role: str, text: str) -> Turn:
        """Async :meth:`append`: the embedding runs in the batched embedder, off the event loop."""
        return (await self.aextend(session_id, [(role, text)]))[0]

    async def aextend(self, session_id: str, turns: Iterable[tuple[str, str] | Mapping[str, str]]) -> list[Turn]:
        """Async :meth:`extend`."""
        self._check_session(session_id)
        pairs = [_pair(turn, i) for i, turn in enumerate(turns)]
        for role, text in pairs:
            self._check_turn(role, text)
        if not pairs:
            return []
        vectors = await self.embedder.aembed_tensor([text for _, text in pairs])
        return await asyncio.to_thread(self._store, session_id, pairs, vectors)

    def _store(self, session_id: str, pairs: list[tuple[str, str]], vectors: torch.Tensor) -> list[Turn]:
        import torch

        tokens = [self._count(text) for _, text in pairs]
        now_wall = time.time()
        with self._lock:
            self._purge_expired()
            session = self._sessions.get(session_id)
            if session is None:
                session = _Session()
                self._sessions[session_id] = session
                while len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
                    self._evicted += 1
            self._sessions.move_to_end(session_id)
            session.last_access = self._clock()
            new = [
                Turn(role, text, session.next_index + i, now_wall, count)
                for i, ((role, text), count) in enumerate(zip(pairs, tokens))
            ]
            session.next_index += len(new)
            count = len(session.turns)
            needed = count + len(new)
            if session.vectors is None or session.vectors.shape[0] < needed:
                capacity = max(8, needed, 0 if session.vectors is None else session.vectors.shape[0] * 2)
                grown = torch.empty((capacity, vectors.shape[1]), dtype=torch.float32, device=vectors.device)
                if session.vectors is not None and count:
                    grown[:count] = session.vectors[:count]
                session.vectors = grown
            session.vectors[count:needed] = vectors
            session.turns.extend(new)
            overflow = len(session.turns) - self.max_turns_per_session
            if overflow > 0:
                kept = len(session.turns) - overflow
                session.vectors[:kept] = session.vectors[overflow : len(session.turns)].clone()
                del session.turns[:overflow]
                self._dropped += overflow
            return new

    # ------------------------------------------------------------------ reads
    def turns(self, session_id: str) -> list[Turn]:
        """Every kept turn of a session, chronological (empty for an unknown or expired session)."""
        self._check_session(session_id)
        with self._lock:
            session = self._touch(session_id)
            return list(session.turns) if session is not None else []

    def sessions(self) -> list[str]:
        """The live session ids, least recently used first."""
        with self._lock:
            self._purge_expired()
            return list(self._sessions)

    def window(
        self,
        session_id: str,
        query: str | None = None,
        max_turns: int = 10,
        max_tokens: int | None = None,
        *,
        recent: int | None = None,
    ) -> list[Turn]:
        """The turns to put in a prompt: the most recent ones plus the older ones most relevant to
        ``query``, in chronological order, within ``max_turns`` and ``max_tokens``.

        Args:
            session_id: the session.
            query: the new user message; without it the window is simply the most recent turns.
            max_turns: most turns returned.
            max_tokens: most tokens (under the token counter) returned; None for no budget.
            recent: how many of the latest turns are always considered first (default: half of
                ``max_turns`` when a query is given, all of it otherwise).

        Returns:
            Turns in chronological order. Under a token budget the least relevant older turns go
            first, then the oldest recent ones.
        """
        self._check_session(session_id)
        query_vector = None
        if query is not None:
            if not isinstance(query, str):
                raise InputTypeError(f"'query' must be None or a str (got {describe(query)}).")
            query_vector = self.embedder.embed_tensor([query])[0]
        return self._select(session_id, query_vector, max_turns, max_tokens, recent)

    async def awindow(
        self,
        session_id: str,
        query: str | None = None,
        max_turns: int = 10,
        max_tokens: int | None = None,
        *,
        recent: int | None = None,
    ) -> list[Turn]:
        """Async :meth:`window`: the query is embedded by the batched embedder, off the event loop."""
        self._check_session(session_id)
        query_vector = None
        if query is not None:
            if not isinstance(query, str):
                raise InputTypeError(f"'query' must be None or a str (got {describe(query)}).")
            query_vector = (await self.embedder.aembed_tensor([query]))[0]
        return self._select(session_id, query_vector, max_turns, max_tokens, recent)

    def _select(
        self, session_id: str, query_vector: Any, max_turns: int, max_tokens: int | None, recent: int | None
    ) -> list[Turn]:
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 0:
            raise InvalidInputError(f"'max_turns' must be an int >= 0 (got {describe(max_turns)}).")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            raise InvalidInputError(f"'max_tokens' must be None or an int >= 0 (got {describe(max_tokens)}).")
        if recent is not None and (not isinstance(recent, int) or recent < 0):
            raise InvalidInputError(f"'recent' must be None or an int >= 0 (got {describe(recent)}).")
        with self._lock:
            session = self._touch(session_id)
            if session is None or max_turns == 0:
                return []
            turns = list(session.turns)
            vectors = session.vectors[: len(turns)] if query_vector is not None else None
        n = len(turns)
        if recent is None:
            recent = max_turns // 2 if query_vector is not None else max_turns
        recent = min(recent, max_turns, n)
        recent_ids = list(range(n - recent, n))
        older_ranked: list[int] = []
        if query_vector is not None and n > recent and max_turns > recent:
            scores = vectors[: n - recent] @ query_vector.to(vectors.device)
            top = min(max_turns - recent, n - recent)
            older_ranked = scores.topk(top).indices.tolist()
        elif n > recent and max_turns > recent:
            older_ranked = list(range(n - recent - 1, n - max_turns - 1, -1))
            older_ranked = [i for i in older_ranked if i >= 0]
        chosen = older_ranked + recent_ids
        if max_tokens is not None:
            # Drop order: least relevant older turns first, then the oldest recent turns.
            drop_order = list(reversed(older_ranked)) + recent_ids
            total = sum(turns[i].tokens for i in chosen)
            kept = set(chosen)
            for i in drop_order:
                if total <= max_tokens:
                    break
                kept.discard(i)
                total -= turns[i].tokens
            chosen = [i for i in chosen if i in kept]
        return [turns[i] for i in sorted(chosen)]

    # ------------------------------------------------------------------ housekeeping
    def _touch(self, session_id: str) -> _Session | None:
        self._purge_expired()
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_access = self._clock()
            self._sessions.move_to_end(session_id)
        return session

    def _purge_expired(self) -> None:
        if self.ttl_seconds is None:
            return
        deadline = self._clock() - self.ttl_seconds
        # The OrderedDict is in access order, so expired sessions are at the front.
        while self._sessions:
            oldest_id, oldest = next(iter(self._sessions.items()))
            if oldest.last_access > deadline:
                break
            del self._sessions[oldest_id]
            self._expired += 1

    def clear(self, session_id: str | None = None) -> None:
        """Forget one session, or every session when ``session_id`` is None."""
        with self._lock:
            if session_id is None:
                self._sessions.clear()
            else:
                self._check_session(session_id)
                self._sessions.pop(session_id, None)

    def stats(self) -> ContextStats:
        """Return a snapshot of the counters."""
        with self._lock:
            self._purge_expired()
            return ContextStats(
                sessions=len(self._sessions),
                turns=sum(len(s.turns) for s in self._sessions.values()),
                evicted_sessions=self._evicted,
                expired_sessions=self._expired,
                dropped_turns=self._dropped,
            )


def _pair(turn: tuple[str, str] | Mapping[str, str], index: int) -> tuple[str, str]:
    if isinstance(turn, Mapping):
        if "role" not in turn or "content" not in turn:
            raise InvalidInputError(f"'turns[{index}]' must have 'role' and 'content' keys (got {describe(turn)}).")
        return turn["role"], turn["content"]
    if isinstance(turn, tuple) and len(turn) == 2:
        return turn[0], turn[1]
    raise InputTypeError(f"'turns[{index}]' must be a (role, text) pair or a message dict (got {describe(turn)}).")
