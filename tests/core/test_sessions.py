"""Session stores without a server: the protocol, MemoryStore, the record format, and ContextCache
caches ("replicas" in one process) that share a MemoryStore."""

from __future__ import annotations

import asyncio
import math
import re
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

from gpuprompt import ContextCache, Embedder
from gpuprompt.errors import (
    ConfigurationError,
    DimensionMismatchError,
    EmbedderMismatchError,
    InputTypeError,
    InvalidInputError,
    SnapshotError,
)
from gpuprompt.context.stores import MemoryStore, SessionStore, TurnRecord
from gpuprompt.context.stores._protocol import decode_record, encode_record

CHAT = [
    ("user", "I'm looking for a red summer dress."),
    ("assistant", "The Aurora dress is red, 100% cotton, and costs 49 euros."),
    ("user", "Do you deliver to Norway?"),
    ("assistant", "Yes, delivery to Norway takes four days."),
    ("user", "Can I pay with an invoice?"),
    ("assistant", "Invoices are available for orders above 100 euros."),
]
QUERY = "Will the cotton dress shrink when washed?"
DIM = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(text: str, dim: int = DIM, role: str = "user", value: float = 0.5) -> TurnRecord:
    return TurnRecord(role, text, len(text.split()), 1_700_000_000.25, np.full(dim, value, "<f4").tobytes())


def embedded(embedder) -> int:
    """Texts the embedder was asked for so far (cache hits included: a re-embedding would count)."""
    return embedder.stats().texts


# ---------------------------------------------------------------------------------------- MemoryStore
def test_store_numbers_turns_and_loads_from_an_index() -> None:
    store = MemoryStore()
    head = store.append("s", [record("a"), record("b")], embedder="m", dim=DIM)
    assert (head.embedder, head.dim, head.next_index) == ("m", DIM, 2)
    head2 = store.append("s", [record("c")], embedder="m", dim=DIM)
    assert head2.next_index == 3 and head2.epoch == head.epoch
    part = store.load("s")
    assert [(r.index, r.text) for r in part.records] == [(0, "a"), (1, "b"), (2, "c")]
    assert [r.text for r in store.load("s", since=2).records] == ["c"]
    assert store.load("s", since=3).records == []
    assert store.load("missing") is None
    assert isinstance(store, SessionStore)


def test_store_keeps_the_last_turns_and_indexes_stay() -> None:
    store = MemoryStore()
    store.append("s", [record(str(i)) for i in range(5)], embedder="m", dim=DIM, keep=3)
    store.append("s", [record("5")], embedder="m", dim=DIM, keep=3)
    assert [(r.index, r.text) for r in store.load("s").records] == [(3, "3"), (4, "4"), (5, "5")]
    assert store.load("s").head.next_index == 6


def test_store_refuses_another_embedder_or_dimension_and_changes_nothing() -> None:
    store = MemoryStore()
    store.append("s", [record("a")], embedder="m", dim=DIM)
    with pytest.raises(EmbedderMismatchError, match="'m'") as info:
        store.append("s", [record("b")], embedder="other", dim=DIM)
    assert (info.value.expected, info.value.got) == ("m", "other")
    with pytest.raises(DimensionMismatchError) as info:
        store.append("s", [record("b", dim=8)], embedder="m", dim=8)
    assert (info.value.expected, info.value.got) == (DIM, 8)
    assert [r.text for r in store.load("s").records] == ["a"]


@pytest.mark.parametrize(
    ("records", "dim", "error", "name"),
    [
        ([], DIM, InputTypeError, "records"),
        ("abc", DIM, InputTypeError, "records"),
        ([("user", "x")], DIM, InputTypeError, "records[0]"),
        ([record("a", dim=3)], DIM, DimensionMismatchError, "records[0].embedding"),
        ([TurnRecord("user", "a", -1, 0.0, bytes(16))], DIM, InvalidInputError, "records[0].tokens"),
        ([TurnRecord("user", "a", 1, math.nan, bytes(16))], DIM, InvalidInputError, "records[0].created_at"),
        ([TurnRecord("user", "\ud800", 1, 0.0, bytes(16))], DIM, InvalidInputError, "records[0].text"),
        ([TurnRecord("user", "a", 1, 0.0, bytearray(16))], DIM, InputTypeError, "records[0].embedding"),
        ([record("a")], 0, InvalidInputError, "dim"),
    ],
)
def test_store_validates_an_append_before_writing(records, dim, error, name) -> None:
    store = MemoryStore()
    with pytest.raises(error, match=re.escape(f"'{name}'")):
        store.append("s", records, embedder="m", dim=dim)
    assert store.load("s") is None and store.sessions() == []


def test_store_ttl_counts_from_the_last_append_and_lists_live_sessions() -> None:
    clock = Clock()
    store = MemoryStore(ttl_s=10, clock=clock)
    store.append("a", [record("x")], embedder="m", dim=DIM)
    clock.now += 6
    store.append("b", [record("x")], embedder="m", dim=DIM)
    clock.now += 6  # a: 12 s since its append, b: 6 s
    assert store.sessions() == ["b"]
    assert store.load("a") is None
    store.append("b", [record("y")], embedder="m", dim=DIM)  # refreshes b
    clock.now += 8
    assert [r.text for r in store.load("b").records] == ["x", "y"]


def test_store_drop_and_clear_and_a_new_epoch() -> None:
    store = MemoryStore()
    first = store.append("s", [record("a")], embedder="m", dim=DIM)
    store.append("t", [record("a")], embedder="m", dim=DIM)
    assert store.sessions() == ["s", "t"]
    store.drop("s")
    store.drop("never-existed")
    again = store.append("s", [record("b")], embedder="m", dim=DIM)
    assert again.epoch != first.epoch and again.next_index == 1
    assert store.sessions() == ["t", "s"]
    store.clear()
    assert store.sessions() == [] and store.load("t") is None


@pytest.mark.parametrize("bad", [{"ttl_s": 0}, {"ttl_s": -1}, {"ttl_s": math.inf}, {"ttl_s": "60"}, {"clock": 3}])
def test_store_options_are_checked(bad) -> None:
    with pytest.raises(ConfigurationError):
        MemoryStore(**bad)


# ---------------------------------------------------------------------------------------- record format
def test_record_round_trip_is_exact() -> None:
    vector = np.array([0.1, -1e-38, 3.4e38, float(np.float32(1 / 3))], dtype="<f4")
    original = TurnRecord("assistant", 'naïve 日本 \n {"json": 1}', 7, 1_764_700_000.123456, vector.tobytes())
    back = decode_record(encode_record(original), 42, DIM)
    assert back == TurnRecord(original.role, original.text, 7, original.created_at, original.embedding, 42)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x02" + encode_record(record("a"))[1:],  # another format
        encode_record(record("a"))[:-1],  # truncated vector
        struct.pack("<BI", 1, 400) + b"{}",  # header longer than the record
        struct.pack("<BI", 1, 2) + b"[]" + bytes(16),  # header not an object
        struct.pack("<BI", 1, 2) + b"{}" + bytes(16),  # header without fields
    ],
)
def test_damaged_records_are_refused(data) -> None:
    with pytest.raises(SnapshotError, match="stored turn 3"):
        decode_record(data, 3, DIM)


# ---------------------------------------------------------------------------------------- ContextCache + store
def test_cache_refuses_a_non_store() -> None:
    with pytest.raises(ConfigurationError, match="'store'"):
        ContextCache(Embedder(), store=object())


def test_two_caches_share_a_session_without_reembedding(embedder) -> None:
    store = MemoryStore()
    a, b = ContextCache(embedder, store=store), ContextCache(embedder, store=store)
    written = a.extend("s1", CHAT)
    before = embedded(embedder)
    assert b.turns("s1") == written == a.turns("s1")  # same indexes, times and token counts
    assert embedded(embedder) == before  # the history came with its embeddings
    window_b = b.window("s1", query=QUERY, max_turns=3)
    assert embedded(embedder) == before + 1  # only the query
    assert window_b == a.window("s1", query=QUERY, max_turns=3)
    assert [t.index for t in window_b] == [0, 1, 5]
    b.append("s1", "user", "Does it come in blue?")
    assert [t.index for t in a.turns("s1")] == list(range(7))
    assert a.window("s1", query=QUERY, max_turns=4) == b.window("s1", query=QUERY, max_turns=4)
    assert a.sessions() == b.sessions() == ["s1"]


def test_without_a_store_sessions_stay_in_their_cache(embedder) -> None:
    a, b = ContextCache(embedder), ContextCache(embedder)
    a.extend("s1", CHAT[:2])
    assert b.turns("s1") == [] and b.sessions() == []


def test_an_evicted_copy_is_reloaded_from_the_store(embedder) -> None:
    store = MemoryStore()
    cache = ContextCache(embedder, store=store, max_sessions=1)
    cache.extend("s1", CHAT[:3])
    cache.extend("s2", CHAT[3:])
    assert cache.stats().evicted_sessions == 1  # s1's in-process copy is gone ...
    before = embedded(embedder)
    assert [t.text for t in cache.turns("s1")] == [text for _, text in CHAT[:3]]  # ... not the session
    assert embedded(embedder) == before
    assert cache.sessions() == ["s1", "s2"]  # the store's list (least recently appended first)


def test_clear_reaches_every_cache_and_a_new_session_starts_at_zero(embedder) -> None:
    store = MemoryStore()
    a, b = ContextCache(embedder, store=store), ContextCache(embedder, store=store)
    a.extend("s1", CHAT[:4])
    assert len(b.turns("s1")) == 4
    b.clear("s1")
    assert a.turns("s1") == []
    a.append("s1", "user", "Hello again")
    assert [(t.index, t.text) for t in b.turns("s1")] == [(0, "Hello again")]
    a.clear()
    assert b.turns("s1") == [] and store.sessions() == []


def test_store_ttl_expires_every_copy(embedder) -> None:
    clock = Clock()
    store = MemoryStore(ttl_s=60, clock=clock)
    a, b = ContextCache(embedder, store=store), ContextCache(embedder, store=store)
    a.extend("s1", CHAT[:2])
    assert len(b.turns("s1")) == 2
    clock.now += 61
    assert a.turns("s1") == [] and b.window("s1", query=QUERY) == []
    assert a.stats().sessions == 0


def test_a_copy_whose_missing_turns_were_trimmed_is_rebuilt(embedder) -> None:
    store = MemoryStore()
    a = ContextCache(embedder, store=store, max_turns_per_session=3)
    b = ContextCache(embedder, store=store, max_turns_per_session=3)
    a.extend("s1", CHAT[:2])
    b.extend("s1", CHAT[2:])  # 4 more: the store keeps turns 3-5, a's copy holds 0-1
    before = embedded(embedder)
    assert [t.index for t in a.turns("s1")] == [3, 4, 5] == [t.index for t in b.turns("s1")]
    assert a.window("s1", query=QUERY, max_turns=2) == b.window("s1", query=QUERY, max_turns=2)
    assert embedded(embedder) == before + 2
    a.append("s1", "user", "And in blue?")
    assert [t.index for t in b.turns("s1")] == [4, 5, 6]


def test_a_session_of_another_embedder_is_refused(embedder) -> None:
    store = MemoryStore()
    dim = embedder.dim
    store.append("s1", [record("from another model", dim=dim)], embedder="another-model", dim=dim)
    cache = ContextCache(embedder, store=store)
    with pytest.raises(EmbedderMismatchError, match="another-model"):
        cache.turns("s1")
    with pytest.raises(EmbedderMismatchError):
        cache.append("s1", "user", "hello")
    assert [r.text for r in store.load("s1").records] == ["from another model"]
    assert cache.stats().sessions == 0


def test_concurrent_writers_in_two_caches_lose_nothing(embedder) -> None:
    store = MemoryStore()
    caches = [ContextCache(embedder, store=store), ContextCache(embedder, store=store)]
    texts = {name: [f"{name} says {i}" for i in range(15)] for name in "ab"}
    embedder.embed_tensor(texts["a"] + texts["b"])  # warm the embedder's cache: the test is about order
    start = threading.Barrier(2)

    def write(cache: ContextCache, name: str) -> None:
        start.wait()
        for text in texts[name]:
            cache.append("s1", "user", text)

    threads = [threading.Thread(target=write, args=(c, n)) for c, n in zip(caches, "ab")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stored = [r.text for r in store.load("s1").records]
    assert sorted(stored) == sorted(texts["a"] + texts["b"])
    for name in "ab":
        assert [s for s in stored if s.startswith(name)] == texts[name]
    fresh = ContextCache(embedder, store=store)
    assert [t.text for t in caches[0].turns("s1")] == stored == [t.text for t in caches[1].turns("s1")]
    windows = [c.window("s1", query="b says 3", max_turns=4) for c in [*caches, fresh]]
    assert windows[0] == windows[1] == windows[2]


async def test_async_calls_write_through(embedder) -> None:
    store = MemoryStore()
    a, b = ContextCache(embedder, store=store), ContextCache(embedder, store=store)
    await a.aextend("s1", CHAT)
    await a.aappend("s1", "user", "Is it machine washable?")
    window = await b.awindow("s1", query=QUERY, max_turns=3)
    assert window == await a.awindow("s1", query=QUERY, max_turns=3)
    assert len(await asyncio.to_thread(b.turns, "s1")) == 7


def test_importing_and_constructing_a_store_loads_no_heavy_library() -> None:
    code = (
        "import sys\n"
        "from gpuprompt import ContextCache, Embedder\n"
        "from gpuprompt.context.stores import MemoryStore, RedisStore\n"
        "ContextCache(Embedder(), store=MemoryStore())\n"
        "try:\n"
        "    ContextCache(Embedder(), store=RedisStore('redis://127.0.0.1:1/0'))\n"
        "except ImportError:\n"
        "    pass\n"
        "print(','.join(m for m in ('torch', 'faiss', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_redis_store_options_are_checked() -> None:
    pytest.importorskip("redis")
    from gpuprompt.context.stores import RedisStore

    for bad in [{"url": "http://localhost:6379"}, {"url": ""}, {"url": 6379}]:
        with pytest.raises(ConfigurationError, match="'url'"):
            RedisStore(**bad)
    for bad in [{"ttl_s": 0}, {"ttl_s": math.nan}, {"timeout_s": 0}, {"prefix": 3}]:
        with pytest.raises(ConfigurationError):
            RedisStore("redis://127.0.0.1:6379/0", **bad)
    store = RedisStore("redis://user:secret@127.0.0.1:6379/0")
    assert "secret" not in repr(store) and isinstance(store, SessionStore)
