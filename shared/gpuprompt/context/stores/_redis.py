"""RedisStore: sessions in Redis, shared by every replica that points at the same server.

Layout, under ``prefix`` (default ``"gpuprompt:"``), for a session ``S``::

    {prefix}session:{S}:turns   LIST  one encoded TurnRecord per turn (format byte, JSON header, float32 bytes)
    {prefix}session:{S}:head    HASH  embedder, dim, epoch, next (turns appended so far)
    {prefix}sessions            ZSET  session id -> wall time of its last append (for ``sessions()``)

A list of compact records rather than a hash per turn: a session is two keys whatever its length, so
refreshing its TTL on a write is two ``PEXPIRE`` calls (not one per turn), and a replica reads
everything it has not seen yet with one ``LRANGE``. Each append is one Lua script, which Redis runs
atomically: the embedder check, the index assignment (``next``), the ``RPUSH``, the trim to ``keep``
and the TTL refresh happen together or not at all, and two replicas appending to one session at once
are serialised by the server (no WATCH/retry loop, one round trip). The ``{S}`` braces are a hash
tag: a session's two keys share a Redis Cluster slot (the ``sessions`` index does not, so the
store needs a single primary, with or without replicas/Sentinel).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from gpuprompt.context.stores._protocol import (
    SessionHead,
    SessionSlice,
    TurnRecord,
    check_append,
    decode_record,
    encode_record,
    mismatch,
)
from gpuprompt.errors import ConfigurationError, DependencyError, SessionStoreError
from gpuprompt.validation import check_int, check_number, check_str, check_ttl, fail

__all__ = ["RedisStore"]

_APPEND = """
local head = redis.call('HMGET', KEYS[2], 'embedder', 'dim', 'epoch', 'next')
local epoch, nxt = head[3], 0
if epoch then
  if head[1] ~= ARGV[1] or head[2] ~= ARGV[2] then return {'mismatch', head[1], head[2], epoch, head[4]} end
  nxt = tonumber(head[4])
else
  epoch = ARGV[3]
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'embedder', ARGV[1], 'dim', ARGV[2], 'epoch', epoch)
end
for i = 8, #ARGV do redis.call('RPUSH', KEYS[1], ARGV[i]) end
nxt = nxt + #ARGV - 7
redis.call('HSET', KEYS[2], 'next', nxt)
local keep = tonumber(ARGV[4])
if keep > 0 then redis.call('LTRIM', KEYS[1], -keep, -1) end
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (tonumber(ARGV[6]) - ttl / 1000))
end
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[7])
return {'ok', ARGV[1], ARGV[2], epoch, nxt}
"""
"""KEYS: turns, head, index. ARGV: embedder, dim, new epoch, keep (0: all), ttl ms (0: none), now,
session id, records... Returns {status, embedder, dim, epoch, next}."""

_LOAD = """
local head = redis.call('HMGET', KEYS[2], 'embedder', 'dim', 'epoch', 'next')
if not head[3] then return false end
local nxt = tonumber(head[4])
local n = redis.call('LLEN', KEYS[1])
local off = tonumber(ARGV[1]) - (nxt - n)
if off < 0 then off = 0 end
local items = {}
if off < n then items = redis.call('LRANGE', KEYS[1], off, -1) end
return {head[1], head[2], head[3], nxt, nxt - n + off, items}
"""
"""KEYS: turns, head. ARGV: since. Returns false, or {embedder, dim, epoch, next, first index, records}."""

_URL = re.compile(r"^(redis|rediss|unix)://")


class RedisStore:
    """A :class:`~gpuprompt.context.stores.SessionStore` in Redis: any replica continues any conversation.

    Each turn is written through when it is appended (acknowledged only once Redis has it), and a
    :class:`~gpuprompt.ContextCache` loads a session lazily, on its first use in a process, with the
    stored embeddings: no turn is embedded twice. Redis that is down, or stalls, gives a typed
    :class:`~gpuprompt.errors.SessionStoreError` within ``timeout_s`` (no call hangs, and an append is never
    retried, so a lost reply cannot store a turn twice).

    Example:
        >>> from gpuprompt import ContextCache
        >>> from gpuprompt.context.stores import RedisStore
        >>> memory = connect().context_cache(store=RedisStore("redis://127.0.0.1:6379/0", ttl_s=3600))
        >>> _ = memory.append("customer-42", "user", "Do you ship to Norway?")   # in replica A
        >>> # ... replica B, another process or machine, same URL and embedder:
        >>> [t.text for t in memory.window("customer-42", query="delivery time?")]
        ['Do you ship to Norway?']

    Durability of acknowledged turns across a Redis restart is Redis's: run it with
    ``appendonly yes`` (``appendfsync everysec`` loses at most a second; ``always`` nothing), and
    with a ``maxmemory-policy`` that never evicts these keys (``noeviction``, or ``volatile-ttl``
    with ``ttl_s``).

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) or ``unix:///path?db=0``.
        prefix: prepended to every key (several apps or embedders can share a server).
        ttl_s: seconds a session lives after its last append (refreshed by every append); None
            keeps sessions until dropped.
        timeout_s: socket connect and read timeout of every call, seconds (> 0).
        client: a ``redis.Redis`` to use instead of one built from ``url`` (its own timeouts apply).

    Raises:
        ConfigurationError: an option has the wrong type or is out of range.
        DependencyError: the ``redis`` package is missing (``pip install 'gpuprompt[redis]'``).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "gpuprompt:",
        ttl_s: float | None = None,
        timeout_s: float = 2.0,
        client: Any = None,
    ) -> None:
        if not isinstance(url, str) or not _URL.match(url):
            raise fail("url", "a redis://, rediss:// or unix:// URL", url, error=ConfigurationError)
        if not isinstance(prefix, str) or len(prefix) > 256:
            raise fail("prefix", "a str of at most 256 characters", prefix, error=ConfigurationError)
        self.ttl_s: float | None = check_ttl(ttl_s, "ttl_s")
        self.timeout_s: float = check_number(timeout_s, "timeout_s", min=0.001, max=3600, error=ConfigurationError)  # type: ignore[assignment]
        self.prefix = prefix
        self._where = re.sub(r"//[^@/]*@", "//***@", url)  # never a password in a message
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            raise DependencyError(
                "RedisStore needs the redis package: pip install 'gpuprompt[redis]' (or pip install redis)."
            ) from exc
        self._errors = (redis.exceptions.RedisError, OSError)
        if client is None:
            try:
                client = redis.Redis.from_url(
                    url,
                    socket_timeout=self.timeout_s,
                    socket_connect_timeout=self.timeout_s,
                    retry=Retry(NoBackoff(), 0),
                    decode_responses=False,
                )
            except ValueError as exc:
                raise ConfigurationError(f"'url' {self._where!r} is not a usable Redis URL: {exc}.") from exc
        self._client = client
        self._append = client.register_script(_APPEND)
        self._load = client.register_script(_LOAD)
        self._index_key = f"{prefix}sessions"

    def __repr__(self) -> str:
        return f"<RedisStore {self._where} prefix={self.prefix!r} ttl_s={self.ttl_s}>"

    def _keys(self, session_id: str) -> list[str]:
        base = f"{self.prefix}session:{{{session_id}}}"
        return [f"{base}:turns", f"{base}:head"]

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one Redis call; a connection failure, timeout or server error becomes SessionStoreError."""
        try:
            return fn(*args, **kwargs)
        except self._errors as exc:
            raise SessionStoreError(
                f"the session store at {self._where} failed to {what}: {type(exc).__name__}: {exc}. "
                f"Check that Redis runs and is reachable (timeout {self.timeout_s:g} s); nothing was "
                "changed by this call unless Redis applied it before the reply was lost."
            ) from exc

    def ping(self) -> None:
        """Check that Redis answers (a server calls this at start, to fail fast).

        Raises:
            SessionStoreError: Redis is down, unreachable or too slow.
        """
        self._call("answer PING", self._client.ping)

    def append(
        self, session_id: str, records: list[TurnRecord], *, embedder: str, dim: int, keep: int | None = None
    ) -> SessionHead:
        """See :meth:`SessionStore.append`. One atomic script: all records are stored, or none.

        Raises:
            EmbedderMismatchError, DimensionMismatchError: the session holds other vectors.
            SessionStoreError: Redis failed or did not answer within ``timeout_s``.
        """
        records = check_append(session_id, records, embedder, dim, keep)
        ttl_ms = 0 if self.ttl_s is None else max(1, round(self.ttl_s * 1000))
        args = [embedder, str(dim), uuid.uuid4().hex[:16], keep or 0, ttl_ms, repr(time.time()), session_id]
        reply = self._call(
            "append a turn",
            self._append,
            keys=[*self._keys(session_id), self._index_key],
            args=args + [encode_record(r) for r in records],
        )
        head = _head(reply[1:])
        if reply[0] != b"ok":
            error = mismatch(session_id, head, embedder, dim)
            assert error is not None
            raise error
        return head

    def load(self, session_id: str, since: int = 0) -> SessionSlice | None:
        """See :meth:`SessionStore.load`.

        Raises:
            SessionStoreError: Redis failed or did not answer within ``timeout_s``.
            SnapshotError: a stored record is not a gpuprompt record (foreign data under the prefix).
        """
        check_str(session_id, "session_id", allow_empty=False, max_length=1024)
        check_int(since, "since", min=0)
        reply = self._call("load a session", self._load, keys=self._keys(session_id), args=[since])
        if reply is None:
            return None
        head = _head(reply[:4])
        first = int(reply[4])
        return SessionSlice(head, [decode_record(data, first + i, head.dim) for i, data in enumerate(reply[5])])

    def drop(self, session_id: str) -> None:
        """See :meth:`SessionStore.drop`.

        Raises:
            SessionStoreError: Redis failed or did not answer within ``timeout_s``.
        """
        check_str(session_id, "session_id", allow_empty=False, max_length=1024)
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(*self._keys(session_id))
        pipe.zrem(self._index_key, session_id)
        self._call("drop a session", pipe.execute)

    def clear(self) -> None:
        """See :meth:`SessionStore.clear`: deletes every session key under this store's prefix.

        Raises:
            SessionStoreError: Redis failed or did not answer within ``timeout_s``.
        """
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix) + "session:{*}:*"

        def run() -> None:
            batch: list[bytes] = []
            for key in self._client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    self._client.unlink(*batch)
                    batch.clear()
            if batch:
                self._client.unlink(*batch)
            self._client.delete(self._index_key)

        self._call("clear the sessions", run)

    def sessions(self) -> list[str]:
        """See :meth:`SessionStore.sessions` (ids of sessions whose TTL has not run out).

        Raises:
            SessionStoreError: Redis failed or did not answer within ``timeout_s``.
        """
        low = "-inf" if self.ttl_s is None else f"({time.time() - self.ttl_s!r}"
        members = self._call("list the sessions", self._client.zrangebyscore, self._index_key, low, "+inf")
        return [m.decode("utf-8") for m in members]

    def close(self) -> None:
        """Close this store's connections (the sessions stay in Redis)."""
        try:
            self._client.close()
        except self._errors:
            pass


def _head(values: list[Any]) -> SessionHead:
    embedder, dim, epoch, nxt = values
    return SessionHead(embedder.decode("utf-8"), int(dim), epoch.decode("ascii"), int(nxt))
