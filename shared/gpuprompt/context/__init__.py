"""Conversation memory: :class:`ContextCache` (per-session turns whose embeddings stay on the
device), its value types, and the session stores that let conversations survive a replica
(:mod:`gpuprompt.context.stores`: in process, Redis).

Importing this package loads no torch and no redis client.
"""

from __future__ import annotations

from gpuprompt.context._cache import ContextCache
from gpuprompt.context._types import (
    MAX_SESSION_ID_LENGTH,
    MAX_SESSIONS_LIMIT,
    MAX_TURNS_LIMIT,
    ContextStats,
    Turn,
    check_session_id,
)
from gpuprompt.context._window import replayable
from gpuprompt.context.stores import MemoryStore, RedisStore, SessionStore

__all__ = [
    "MAX_SESSIONS_LIMIT",
    "MAX_SESSION_ID_LENGTH",
    "MAX_TURNS_LIMIT",
    "ContextCache",
    "ContextStats",
    "MemoryStore",
    "RedisStore",
    "SessionStore",
    "Turn",
    "check_session_id",
    "replayable",
]
