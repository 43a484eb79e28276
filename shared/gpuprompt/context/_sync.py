"""The part of ContextCache that writes turns through to a SessionStore and keeps its in-process
copy of each session in step with the store (lazy load on first use, then only the new turns).

The store is the source of truth and numbers the turns; the in-process session is a cache of it,
holding the same rows on the device. Store I/O never runs under the cache's lock.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpuprompt.context._types import Session, Turn
from gpuprompt.context.stores._protocol import SessionSlice, TurnRecord, mismatch
from gpuprompt.errors import DimensionMismatchError

if TYPE_CHECKING:
    import torch

    from gpuprompt.context.stores._protocol import SessionStore

__all__ = ["StoreSync"]


class StoreSync:
    """Mixin of :class:`~gpuprompt.ContextCache` (which provides ``_lock``, ``_sessions``,
    ``embedder``, ``max_turns_per_session``, ``_purge_expired`` and ``_commit``)."""

    _session_store: SessionStore | None
    _lock: Any
    _sessions: Any
    embedder: Any
    max_turns_per_session: int

    def _purge_expired(self) -> None: ...  # provided by ContextCache

    def _commit(self, session_id: str, session: Any, fresh: bool, new: list[Turn], rows: Any) -> list[Turn]: ...

    def _identity(self) -> tuple[str, int | None]:
        """The embedder's identity (what a store records per session) and its dimension if known."""
        emb = self.embedder
        identity = getattr(emb, "identity", None)
        if not isinstance(identity, str) or not identity:
            identity = f"{type(emb).__module__}.{type(emb).__qualname__}"
        dim = getattr(emb, "dim", None)
        return identity, dim if isinstance(dim, int) and not isinstance(dim, bool) else None

    def _write_through(
        self, session_id: str, drafts: list[Turn], tokens: list[int], vectors: torch.Tensor, now_wall: float
    ) -> list[Turn]:
        """Append to the store first (the turn is acknowledged once it is there), then to the
        in-process copy: directly when no other writer came between, else by pulling from the store."""
        import torch

        store = self._session_store
        assert store is not None
        if vectors.ndim != 2 or vectors.shape[0] != len(drafts):
            raise DimensionMismatchError(
                f"the embedder returned vectors of shape {tuple(vectors.shape)} for {len(drafts)} turns; "
                "use a gpuprompt.Embedder.",
                got=int(vectors.shape[-1]) if vectors.ndim else None,
            )
        identity, _ = self._identity()
        array = vectors.detach().to("cpu", torch.float32).numpy().astype("<f4", copy=False)
        records = [
            TurnRecord(d.role, d.text, count, now_wall, array[i].tobytes(), tool_calls=d.tool_calls,
                       tool_call_id=d.tool_call_id, name=d.name, status=d.status)
            for i, (d, count) in enumerate(zip(drafts, tokens))
        ]
        head = store.append(
            session_id, records, embedder=identity, dim=int(vectors.shape[1]), keep=self.max_turns_per_session
        )
        first = head.next_index - len(records)
        new = [
            replace(d, index=first + i, created_at=now_wall, tokens=count)
            for i, (d, count) in enumerate(zip(drafts, tokens))
        ]
        with self._lock:
            self._purge_expired()
            session = self._sessions.get(session_id)
            if session is not None and session.epoch != head.epoch:
                del self._sessions[session_id]  # the session this copy was of is gone from the store
                session = None
            if session is None and first == 0:
                return self._commit(session_id, Session(epoch=head.epoch), True, new, vectors)
            if session is not None and session.next_index == first:
                return self._commit(session_id, session, False, new, vectors)
            if session is not None and session.next_index >= head.next_index:
                return new  # a concurrent pull in this process already brought these turns in
        self._pull(session_id)  # another writer came between (or the history is not loaded yet)
        return new

    def _pull(self, session_id: str) -> None:
        """Bring the in-process copy up to the store: the whole session on first use in this
        process, afterwards only turns appended since (usually none: one small round trip)."""
        store = self._session_store
        if store is None:
            return
        with self._lock:
            session = self._sessions.get(session_id)
            since = session.next_index if session is not None else 0
        if not self._merge(session_id, store.load(session_id, since), since):
            self._merge(session_id, store.load(session_id, 0), 0)

    def _merge(self, session_id: str, part: SessionSlice | None, since: int) -> bool:
        """Merge a slice loaded from ``since`` into the in-process copy; False when the copy turned
        out stale beyond the slice (another epoch, or turns trimmed in between) and a full load is
        needed."""
        import numpy as np
        import torch

        if part is not None:
            identity, dim = self._identity()
            error = mismatch(session_id, part.head, identity, part.head.dim if dim is None else dim)
            if error is not None:
                raise error
            rows_all = None
            if part.records:
                blob = b"".join(r.embedding for r in part.records)
                array = np.frombuffer(blob, dtype="<f4").astype(np.float32).reshape(len(part.records), part.head.dim)
                # On the device the embedder puts its vectors on (where the cache's rows live).
                rows_all = torch.from_numpy(array).to(getattr(self.embedder, "device", "cpu"))
        with self._lock:
            session = self._sessions.get(session_id)
            if part is None:  # expired or dropped in the store: so is the copy
                if session is not None:
                    del self._sessions[session_id]
                return True
            if session is not None and session.epoch != part.head.epoch:
                if since != 0:
                    return False
                del self._sessions[session_id]
                session = None
            if session is None and since != 0:
                return False  # the copy was evicted meanwhile: its older turns are not in this slice
            start = 0 if session is None else session.next_index
            skip = next((i for i, r in enumerate(part.records) if r.index >= start), len(part.records))
            records = part.records[skip:]
            if not records:
                return True
            if session is not None and records[0].index != session.next_index:
                if since != 0:
                    return False  # turns between were trimmed by other writers: rebuild from a full load
                del self._sessions[session_id]
                session, records, skip = None, part.records, 0
            assert rows_all is not None
            turns = [
                Turn(r.role, r.text, r.index, r.created_at, r.tokens, r.tool_calls, r.tool_call_id, r.name, r.status)
                for r in records
            ]
            fresh = session is None
            if session is None:
                session = Session(epoch=part.head.epoch)
            self._commit(session_id, session, fresh, turns, rows_all[skip:])
            return True
