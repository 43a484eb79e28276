"""Session stores for :class:`~gpuprompt.ContextCache`: conversations that survive a replica.

A ``ContextCache(embedder, store=...)`` writes each turn through to the store (role, text, token count and the
turn's embedding as float32 bytes) before it acknowledges it, and loads a session lazily, on its
first use in a process, with the stored embeddings: any replica continues any conversation, and no
turn is embedded twice. Without a store (the default) sessions live in the cache's process only.

How to run it::

    # a Redis server (Debian: apt-get install redis-server; or any Redis >= 6.2 / Valkey)
    redis-server --bind 127.0.0.1 --port 6379 --appendonly yes

    from gpuprompt import connect
    from gpuprompt.context.stores import RedisStore

    store = RedisStore("redis://127.0.0.1:6379/0", ttl_s=3600)   # pip install 'gpuprompt[redis]'
    memory = connect().context_cache(store=store)   # same URL and embedder in every replica
    memory.append("customer-42", "user", "Do you ship to Norway?")
    memory.window("customer-42", query="how long is delivery?")

With a store, the cache's ``max_sessions`` and ``ttl_seconds`` bound only its in-process copy (a
session dropped from it is reloaded from the store on its next use); the store's ``ttl_s`` bounds a
session's life, counted from its last append. Redis that is down or stalls gives
:class:`~gpuprompt.errors.SessionStoreError` within ``timeout_s``; a session written with another embedder
is refused with :class:`~gpuprompt.errors.EmbedderMismatchError`.

Stores: :class:`MemoryStore` (in-process; tests, several caches in one process) and
:class:`RedisStore`; anything implementing :class:`SessionStore` can be passed.
"""

from __future__ import annotations

from gpuprompt.context.stores._memory import MemoryStore
from gpuprompt.context.stores._protocol import SessionHead, SessionSlice, SessionStore, TurnRecord
from gpuprompt.context.stores._redis import RedisStore

__all__ = ["MemoryStore", "RedisStore", "SessionHead", "SessionSlice", "SessionStore", "TurnRecord"]
