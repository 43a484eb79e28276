"""ContextCache: per-session conversation memory whose turn embeddings stay on the device.

A turn is embedded once, when appended; ``window`` picks the recent turns plus the older turns most
similar to the query with one matrix-vector product on the device, within turn and token budgets.

Consistency: a session's turn list and its embedding tensor are append-only. A row, once written,
is never changed: dropping old turns (the per-session cap) only advances a start offset, and when
the tensor is full the kept rows are copied into a *new* tensor and list. A reader therefore takes a
snapshot under the lock in O(1) (the two references and a ``[start, end)`` range) and scores it
outside the lock, on the device, while writers go on appending: every window is the answer for
one instant of the session.

Tool calls: an assistant turn may carry its tool calls and a ``"tool"`` turn is a tool's result
(``tool_call_id``, ``name``, ``status``). What is embedded and counted for an assistant turn that
calls tools is its text plus each call as ``name(arguments)`` (:func:`~gpuprompt.context._types.memory_text`),
and a window keeps a call and its results together, both or neither (:mod:`gpuprompt.context._window`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpuprompt.bridge import off_loop
from gpuprompt.context._sync import StoreSync
from gpuprompt.context._types import (
    MAX_SESSIONS_LIMIT,
    MAX_TURNS_LIMIT,
    ROLES,
    ContextStats,
    Session,
    Turn,
    _draft,
    check_session_id,
    check_turn,
    memory_text,
)
from gpuprompt.context._window import select_units, tool_units
from gpuprompt.context.stores._protocol import check_store
from gpuprompt.errors import ConfigurationError, DimensionMismatchError, InputTypeError
from gpuprompt.validation import INT64_MAX, check_clock, check_int, check_str, check_ttl, fail

if TYPE_CHECKING:
    import torch

    from gpuprompt.context.stores import SessionStore
    from gpuprompt.protocols import EmbedderLike

__all__ = ["ROLES", "ContextCache", "ContextStats", "Turn", "check_session_id"]

class ContextCache(StoreSync):
    """Per-session conversation memory with device-resident turn embeddings.

    Sessions are isolated (a window only ever reads its own session), bounded by ``max_sessions``
    (least recently used evicted), ``ttl_seconds`` of inactivity and ``max_turns_per_session``
    (oldest turns dropped). Thread-safe: every read (``turns``, ``window``) sees one consistent
    instant of its session, even while other threads append to it.

    Example:
        >>> from gpuprompt import connect
        >>> memory = connect().context_cache()      # the process's shared cache over the shared embedder
        >>> memory.extend("s1", [("user", "I want a red dress in cotton."),
        ...                      ("assistant", "The Aurora dress is 100% cotton, 49 EUR."),
        ...                      ("user", "Do you ship to Norway?")])
        [...]
        >>> [t.text for t in memory.window("s1", query="will the dress shrink?", max_turns=2)]
        ['I want a red dress in cotton.', 'Do you ship to Norway?']

    Args:
        embedder: the embedder for turns and queries (an :class:`~gpuprompt.protocols.EmbedderLike`;
            ``connect().context_cache()`` builds the cache over the process's shared embedder).
        max_sessions: most sessions kept, in ``[1, 100_000_000]``; the least recently used is
            evicted beyond it.
        ttl_seconds: a session untouched this long (a finite number > 0) is dropped; None keeps
            sessions for ever.
        max_turns_per_session: most turns kept per session, in ``[1, 1_000_000]``; older ones are
            dropped.
        token_counter: counts a text's tokens for ``max_tokens`` budgets (default: the embedder's
            tokenizer; pass the LLM's ``count_tokens`` for exact prompt budgets). It must return an
            int >= 0.
        clock: the monotonic clock TTLs are measured with (tests pass one they control).
        store: a :class:`~gpuprompt.context.stores.SessionStore` (``RedisStore``, ``MemoryStore``) that
            every turn is written through to and sessions are loaded from, so that replicas share
            them (see :mod:`gpuprompt.context.stores`); None keeps sessions in this process only. With a
            store, ``max_sessions`` and ``ttl_seconds`` bound the in-process copy, the store's
            ``ttl_s`` a session's life.

    Raises:
        ConfigurationError: an option has the wrong type or is out of range.
    """

    def __init__(
        self,
        embedder: EmbedderLike,
        *,
        max_sessions: int = 10_000,
        ttl_seconds: float | None = 3600.0,
        max_turns_per_session: int = 1000,
        token_counter: Callable[[str], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        store: SessionStore | None = None,
    ) -> None:
        if embedder is None:
            raise ConfigurationError(
                "ContextCache needs an embedder: ContextCache(connect().embedder(), ...), or connect().context_cache() "
                "for the process's shared cache over the shared embedder."
            )
        if not (callable(getattr(embedder, "embed_tensor", None)) and callable(getattr(embedder, "aembed_tensor", None))):
            raise fail("embedder", "a gpuprompt.Embedder (an EmbedderLike)", embedder, error=ConfigurationError)
        max_sessions = check_int(max_sessions, "max_sessions", min=1, max=MAX_SESSIONS_LIMIT, error=ConfigurationError)
        max_turns_per_session = check_int(
            max_turns_per_session, "max_turns_per_session", min=1, max=MAX_TURNS_LIMIT, error=ConfigurationError
        )
        ttl_seconds = check_ttl(ttl_seconds)
        if token_counter is not None and not callable(token_counter):
            raise fail("token_counter", "a callable (str) -> int or None", token_counter, error=ConfigurationError)
        check_clock(clock)
        self._session_store = check_store(store)
        if token_counter is not None:
            try:  # the same probe for the counter: a bad count is a bad option, found now
                probe = token_counter("probe")
            except Exception as exc:
                raise ConfigurationError(f"'token_counter' raised {exc!r} on a probe text; pass (str) -> int.") from exc
            check_int(probe, "token_counter(text)", min=0, max=INT64_MAX, error=ConfigurationError)
        self._embedder = embedder
        self.max_sessions: int = max_sessions  # type: ignore[assignment]
        self.ttl_seconds: float | None = ttl_seconds
        self.max_turns_per_session: int = max_turns_per_session  # type: ignore[assignment]
        self._token_counter = token_counter
        self._clock = clock
        self._lock = threading.RLock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._evicted = self._expired = self._dropped = 0

    def __repr__(self) -> str:
        return f"<ContextCache sessions={len(self._sessions)} max_sessions={self.max_sessions} ttl={self.ttl_seconds}>"

    @property
    def embedder(self) -> EmbedderLike:
        """The embedder used for turns and queries."""
        return self._embedder

    @property
    def session_store(self) -> SessionStore | None:
        """The store the sessions are written through to (None: this process's memory only)."""
        return self._session_store

    # ------------------------------------------------------------------ validation
    @staticmethod
    def _check_session(session_id: Any) -> str:
        """Refuse anything but a non-empty, well-formed str of at most ``MAX_SESSION_ID_LENGTH``."""
        return check_session_id(session_id)

    @staticmethod
    def _check_turn(role: Any, text: Any = None) -> Turn:
        """``append``'s turn as a draft: a role and a text, or one message dict in place of the role
        (text omitted; see :func:`~gpuprompt.context._types.check_turn`)."""
        if isinstance(role, Mapping) and text is None:
            return check_turn(role, "message")
        return _draft(role, text, "role", "text")

    @classmethod
    def _check_turns(cls, turns: Any) -> list[Turn]:
        """Materialise and validate ``extend``'s turns as drafts; a bare str or a single dict is refused."""
        if isinstance(turns, (str, bytes, bytearray, Mapping)) or not isinstance(turns, Iterable):
            raise fail(
                "turns",
                "an iterable of (role, text) pairs or {'role': ..., 'content': ...} dicts",
                turns,
                fix="For one turn use append(session_id, role, text)." if isinstance(turns, Mapping) else "",
                error=InputTypeError,
            )
        return [check_turn(turn, f"turns[{i}]") for i, turn in enumerate(turns)]

    @staticmethod
    def _check_window_args(
        max_turns: Any, max_tokens: Any, recent: Any
    ) -> tuple[int, int | None, int | None]:
        # No upper bound: these are never stored, and every use below is clamped to the session.
        return (
            check_int(max_turns, "max_turns", min=0),  # type: ignore[return-value]
            check_int(max_tokens, "max_tokens", min=0, allow_none=True),
            check_int(recent, "recent", min=0, allow_none=True),
        )

    def _count(self, texts: list[str]) -> list[int]:
        """Token counts of ``texts``; a counter that returns anything but an int >= 0 is refused."""
        if self._token_counter is None:
            counter = getattr(self.embedder, "count_tokens", None)
            if counter is None:
                raise ConfigurationError(
                    f"the embedder {self.embedder!r} counts no tokens: pass ContextCache(token_counter=...) for "
                    "token budgets."
                )
            counts = list(counter(texts, truncate=False))
        else:
            counts = [self._token_counter(text) for text in texts]
        return [
            check_int(n, "token_counter(text)", min=0, max=INT64_MAX, error=ConfigurationError)  # type: ignore[misc]
            for n in counts
        ]

    # ------------------------------------------------------------------ writes
    def append(self, session_id: str, role: str | Mapping[str, Any], text: str | None = None) -> Turn:
        """Add one turn to a session (created on first use); embeds the text once.

        Args:
            session_id: the session, a non-empty str of at most 1024 characters.
            role: one of ``"system"``, ``"user"``, ``"assistant"``, ``"tool"``; or, with ``text``
                omitted, one chat message dict as :meth:`extend` takes it (an assistant turn with
                ``tool_calls``, a tool result with ``tool_call_id``, ``name``, ``status``).
            text: the message, a well-formed str.

        Returns:
            The stored turn.

        Raises:
            InputTypeError: ``session_id``, ``role`` or ``text`` is not a str.
            InvalidInputError: ``session_id`` is empty or too long, ``role`` is not a known role, or
                a str holds a lone surrogate. Nothing stored changed.
        """
        self._check_session(session_id)
        draft = self._check_turn(role, text)
        vectors = self.embedder.embed_tensor([memory_text(draft)])
        return self._store(session_id, [draft], vectors)[0]

    def extend(self, session_id: str, turns: Iterable[tuple[str, str] | Mapping[str, Any]]) -> list[Turn]:
        """Add several turns at once (one batched embedding call).

        Args:
            session_id: the session, a non-empty str of at most 1024 characters.
            turns: ``(role, text)`` pairs or chat message dicts ``{"role": ..., "content": ...}``;
                a dict may carry, on an assistant turn, ``tool_calls`` (OpenAI tool-call dicts or
                :class:`~gpuprompt.llm.ToolCall`; ``content`` may then be None) and, on a ``"tool"``
                turn, ``tool_call_id``, ``name`` and ``status`` (``"success"`` | ``"error"``): they
                are stored and read back exactly (:meth:`Turn.as_message` gives the dict back).
                What is embedded and counted for an assistant turn that calls tools is its text
                plus each call as ``name(arguments)``.

        Returns:
            The stored turns, in order (also those that the turn cap dropped at once).

        Raises:
            InputTypeError: an argument or one turn has the wrong type (the message names it).
            InvalidInputError: a value is out of range. All turns are validated before anything is
                stored; on any error nothing stored changed.
            ConfigurationError: the ``token_counter`` returned something other than an int >= 0.
            DimensionMismatchError: the embedder's vectors changed dimension for this session.
        """
        self._check_session(session_id)
        drafts = self._check_turns(turns)
        if not drafts:
            return []
        vectors = self.embedder.embed_tensor([memory_text(d) for d in drafts])
        return self._store(session_id, drafts, vectors)

    async def aappend(self, session_id: str, role: str | Mapping[str, Any], text: str | None = None) -> Turn:
        """Async :meth:`append`: the embedding runs in the batched embedder, off the event loop."""
        self._check_session(session_id)
        draft = self._check_turn(role, text)
        vectors = await self.embedder.aembed_tensor([memory_text(draft)])
        return (await asyncio.to_thread(self._store, session_id, [draft], vectors))[0]

    async def aextend(self, session_id: str, turns: Iterable[tuple[str, str] | Mapping[str, Any]]) -> list[Turn]:
        """Async :meth:`extend`."""
        self._check_session(session_id)
        drafts = self._check_turns(turns)
        if not drafts:
            return []
        vectors = await self.embedder.aembed_tensor([memory_text(d) for d in drafts])
        return await asyncio.to_thread(self._store, session_id, drafts, vectors)

    def _store(self, session_id: str, drafts: list[Turn], vectors: torch.Tensor) -> list[Turn]:
        """Append validated draft turns. Rows below a session's current end are never written again.

        Everything that can fail (counting tokens, allocating, copying) happens before the first
        change to stored state.
        """
        tokens = self._count([memory_text(d) for d in drafts])
        now_wall = time.time()
        if self._session_store is not None:  # the store first: it numbers the turns and acknowledges them
            return self._write_through(session_id, drafts, tokens, vectors, now_wall)
        with self._lock:
            self._purge_expired()
            session = self._sessions.get(session_id)
            fresh = session is None
            if session is None:
                session = Session()
            new = [
                replace(draft, index=session.next_index + i, created_at=now_wall, tokens=count)
                for i, (draft, count) in enumerate(zip(drafts, tokens))
            ]
            return self._commit(session_id, session, fresh, new, vectors)

    def _commit(self, session_id: str, session: Session, fresh: bool, new: list[Turn], vectors: Any) -> list[Turn]:
        """Add numbered turns and their rows to ``session`` (registered when ``fresh``); returns ``new``."""
        import torch

        with self._lock:
            buffer, matrix, start, end = session.turns, session.vectors, session.start, len(session.turns)
            live = end - start
            keep = min(live + len(new), self.max_turns_per_session)
            dropped = live + len(new) - keep
            drop_old = min(dropped, live)
            skip_new = dropped - drop_old  # a batch longer than the cap: its first turns go at once
            start += drop_old
            added, rows = new[skip_new:], vectors[skip_new:]
            if matrix is not None and (rows.ndim != 2 or rows.shape[1] != matrix.shape[1]):
                raise DimensionMismatchError(
                    f"the embedder returned vectors of shape {tuple(rows.shape)} for session {session_id!r}, whose "
                    f"stored turns have dimension {matrix.shape[1]}; use one embedder per ContextCache.",
                    expected=int(matrix.shape[1]),
                    got=int(rows.shape[-1]) if rows.ndim else None,
                )
            if matrix is None or end + len(added) > matrix.shape[0]:
                # Full: copy the kept rows into a new tensor and list. The old ones stay intact for
                # any reader still scoring them.
                capacity = max(8, 2 * keep)
                grown = torch.empty((capacity, rows.shape[1]), dtype=torch.float32, device=rows.device)
                if end > start:
                    grown[: end - start] = matrix[start:end]
                buffer, matrix, start, end = buffer[start:end], grown, 0, end - start
            matrix[end : end + len(added)] = rows  # rows no snapshot has seen yet
            # Commit: plain assignments and a list extend, none of which can fail.
            buffer.extend(added)
            session.turns, session.vectors, session.start = buffer, matrix, start
            session.next_index = new[-1].index + 1
            session.tools = session.tools or any(turn.calls_tools for turn in added)
            self._dropped += dropped
            if fresh:
                self._sessions[session_id] = session
                while len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
                    self._evicted += 1
            self._sessions.move_to_end(session_id)
            session.last_access = self._clock()
            return new

    # ------------------------------------------------------------------ reads
    def turns(self, session_id: str) -> list[Turn]:
        """Every kept turn of a session, chronological (empty for an unknown or expired session).

        Raises:
            InputTypeError: ``session_id`` is not a str.
            InvalidInputError: ``session_id`` is empty, too long or not well-formed.
        """
        self._check_session(session_id)
        self._pull(session_id)
        with self._lock:
            session = self._touch(session_id)
            return session.live() if session is not None else []

    async def aturns(self, session_id: str) -> list[Turn]:
        """Async :meth:`turns` (with a session store, off the event loop: the store is I/O)."""
        if self._session_store is None:
            return self.turns(session_id)
        return await off_loop(self.turns, session_id)

    @staticmethod
    def check_session_id(value: Any, name: str = "session_id") -> str:
        """``value`` if this cache accepts it as a session id (see :func:`gpuprompt.context.check_session_id`)."""
        return check_session_id(value, name)

    async def asessions(self) -> list[str]:
        """Async :meth:`sessions`."""
        if self._session_store is None:
            return self.sessions()
        return await off_loop(self.sessions)

    def sessions(self) -> list[str]:
        """The live session ids, least recently used first (with a store: the store's, least
        recently appended to first)."""
        if self._session_store is not None:
            return self._session_store.sessions()
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

        The window is computed over one snapshot of the session: turns appended (or dropped) by
        other threads during the call are either all seen or not seen at all.

        Args:
            session_id: the session.
            query: the new user message; without it the window is simply the most recent turns.
            max_turns: most turns returned, an int >= 0.
            max_tokens: most tokens (under the token counter) returned, an int >= 0; None for no
                budget.
            recent: how many of the latest turns are always considered first, an int >= 0
                (default: half of ``max_turns`` when a query is given, all of it otherwise).

        Returns:
            Turns in chronological order. Under a token budget the least relevant older turns go
            first, then the oldest recent ones. An assistant turn that calls tools and its tool
            results count as one unit of as many turns, taken or dropped together (both or
            neither; its relevance is its best turn's); a unit that does not fit what is left of
            ``max_turns`` is passed over. A tool result whose call is not in the session (dropped
            by the turn cap, or never stored) is never returned. In a session that never held a
            tool call or result every unit is one turn.

        Raises:
            InputTypeError: ``session_id`` or ``query`` is not a str.
            InvalidInputError: a budget is not an int in range (bools are refused), or a str is
                empty or malformed. Nothing is embedded or touched on a refused call.
        """
        self._check_session(session_id)
        check_str(query, "query", allow_none=True)
        budgets = self._check_window_args(max_turns, max_tokens, recent)
        query_vector = None if query is None else self.embedder.embed_tensor([query])[0]
        return self._select(session_id, query_vector, *budgets)

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
        check_str(query, "query", allow_none=True)
        budgets = self._check_window_args(max_turns, max_tokens, recent)
        query_vector = None if query is None else (await self.embedder.aembed_tensor([query]))[0]
        if self._session_store is not None:  # store I/O off the event loop
            return await asyncio.to_thread(self._select, session_id, query_vector, *budgets)
        return self._select(session_id, query_vector, *budgets)

    def _select(
        self, session_id: str, query_vector: Any, max_turns: int, max_tokens: int | None, recent: int | None
    ) -> list[Turn]:
        self._pull(session_id)
        with self._lock:
            session = self._touch(session_id)
            if session is None or max_turns == 0:
                return []
            # The snapshot: references and a range. Rows [start, end) of these objects never change.
            buffer, matrix, start, end = session.turns, session.vectors, session.start, len(session.turns)
            grouped = session.tools
        turns = buffer[start:end]
        n = len(turns)
        if grouped:
            scores = None
            if query_vector is not None:
                scores = (matrix[start:end] @ query_vector.to(matrix.device)).tolist()
            return [turns[i] for i in select_units(turns, tool_units(turns), scores, max_turns, max_tokens, recent)]
        if recent is None:
            recent = max_turns // 2 if query_vector is not None else max_turns
        recent = min(recent, max_turns, n)
        recent_ids = list(range(n - recent, n))
        older_ranked: list[int] = []
        if query_vector is not None and n > recent and max_turns > recent:
            scores = matrix[start : end - recent] @ query_vector.to(matrix.device)
            top = min(max_turns - recent, n - recent)
            older_ranked = scores.topk(top).indices.tolist()
        elif n > recent and max_turns > recent:
            older_ranked = list(range(n - recent - 1, max(n - max_turns, 0) - 1, -1))
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
    def _touch(self, session_id: str) -> Session | None:
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

    async def aclear(self, session_id: str | None = None) -> None:
        """Async :meth:`clear` (with a session store, off the event loop)."""
        if self._session_store is None:
            self.clear(session_id)
        else:
            await off_loop(self.clear, session_id)

    def clear(self, session_id: str | None = None) -> None:
        """Forget one session, or every session when ``session_id`` is None (with a store: in the
        store too, so for every replica).

        Raises:
            InputTypeError: ``session_id`` is neither None nor a str.
            InvalidInputError: ``session_id`` is empty, too long or not well-formed.
        """
        if session_id is not None:
            self._check_session(session_id)
        if self._session_store is not None and session_id is None:
            self._session_store.clear()
        elif self._session_store is not None:
            self._session_store.drop(session_id)
        with self._lock:
            if session_id is None:
                self._sessions.clear()
            else:
                self._sessions.pop(session_id, None)

    def stats(self) -> ContextStats:
        """Return a snapshot of the counters."""
        with self._lock:
            self._purge_expired()
            return ContextStats(
                sessions=len(self._sessions),
                turns=sum(len(s.turns) - s.start for s in self._sessions.values()),
                evicted_sessions=self._evicted,
                expired_sessions=self._expired,
                dropped_turns=self._dropped,
            )

