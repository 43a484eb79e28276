"""ContextCache: windows, relevance pick, budgets, eviction, TTL, isolation, embed-once."""

from __future__ import annotations

import threading

import pytest

from gpuprompt import ContextCache
from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError

CHAT = [
    ("user", "I'm looking for a red summer dress."),
    ("assistant", "The Aurora dress is red, 100% cotton, and costs 49 euros."),
    ("user", "Do you deliver to Norway?"),
    ("assistant", "Yes, delivery to Norway takes four days."),
    ("user", "Can I pay with an invoice?"),
    ("assistant", "Invoices are available for orders above 100 euros."),
]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def memory(embedder) -> ContextCache:
    cache = ContextCache(embedder)
    cache.extend("s1", CHAT)
    return cache


def test_turns_are_chronological_with_indexes(memory: ContextCache) -> None:
    turns = memory.turns("s1")
    assert [(t.role, t.text) for t in turns] == CHAT
    assert [t.index for t in turns] == list(range(6))
    assert all(t.tokens > 0 for t in turns)
    assert turns[0].as_message() == {"role": "user", "content": CHAT[0][1]}


def test_window_without_query_is_most_recent(memory: ContextCache) -> None:
    assert [t.index for t in memory.window("s1", max_turns=3)] == [3, 4, 5]


def test_window_picks_relevant_older_turns(memory: ContextCache) -> None:
    window = memory.window("s1", query="Will the cotton dress shrink when washed?", max_turns=3)
    # One recent turn plus... max_turns // 2 = 1 recent, then the two older turns most about the dress.
    assert [t.index for t in window] == [0, 1, 5]


def test_token_budget_drops_least_relevant_then_oldest(memory: ContextCache) -> None:
    full = memory.window("s1", query="red cotton dress price", max_turns=4)
    budget = sum(t.tokens for t in full) - 1
    trimmed = memory.window("s1", query="red cotton dress price", max_turns=4, max_tokens=budget)
    assert len(trimmed) < len(full)
    assert sum(t.tokens for t in trimmed) <= budget
    assert trimmed[-1].index == 5  # the latest turn is the last to go
    assert memory.window("s1", max_turns=4, max_tokens=0) == []


def test_each_turn_is_embedded_exactly_once(embedder) -> None:
    cache = ContextCache(embedder)
    turns = [("user", f"unique turn text {i} about linen shirts") for i in range(5)]
    before = embedder.stats()
    cache.extend("embed-once", turns)
    for q in range(5):
        cache.window("embed-once", query=f"query {q} about shirts", max_turns=4)
        cache.window("embed-once", query=f"query {q} about shirts", max_turns=4)
    after = embedder.stats()
    # 5 turns + 5 distinct queries reach the model once each; the repeats are cache hits and the
    # stored turns are never looked up again.
    assert after.cache_misses - before.cache_misses == 10
    assert after.texts - before.texts == 5 + 10


def test_sessions_are_isolated(memory: ContextCache) -> None:
    memory.append("s2", "user", "A completely different customer about hiking boots.")
    assert [t.text for t in memory.turns("s2")] == ["A completely different customer about hiking boots."]
    assert all("boots" not in t.text for t in memory.window("s1", query="hiking boots", max_turns=10))
    memory.clear("s2")
    assert memory.turns("s2") == []
    assert len(memory.turns("s1")) == 6


def test_lru_eviction_of_sessions(embedder) -> None:
    cache = ContextCache(embedder, max_sessions=2)
    cache.append("a", "user", "hello a")
    cache.append("b", "user", "hello b")
    cache.turns("a")  # touch a: b is now least recently used
    cache.append("c", "user", "hello c")
    assert sorted(cache.sessions()) == ["a", "c"]
    assert cache.stats().evicted_sessions == 1


def test_ttl_expiry(embedder) -> None:
    clock = Clock()
    cache = ContextCache(embedder, ttl_seconds=60, clock=clock)
    cache.append("old", "user", "hello")
    clock.now += 30
    cache.append("new", "user", "hi")
    clock.now += 45  # "old" idle 75 s, "new" idle 45 s
    assert cache.turns("old") == []
    assert len(cache.turns("new")) == 1
    assert cache.stats().expired_sessions == 1


def test_turn_cap_drops_oldest(embedder) -> None:
    cache = ContextCache(embedder, max_turns_per_session=3)
    cache.extend("s", [("user", f"message number {i}") for i in range(5)])
    assert [t.index for t in cache.turns("s")] == [2, 3, 4]
    window = cache.window("s", query="message number 2", max_turns=3)
    assert [t.index for t in window] == [2, 3, 4]
    assert cache.stats().dropped_turns == 2


def test_thread_safety(embedder) -> None:
    cache = ContextCache(embedder)

    def worker(n: int) -> None:
        for i in range(10):
            cache.append(f"t{n % 4}", "user", f"thread {n} message {i}")
            cache.window(f"t{n % 4}", query=f"thread {n}", max_turns=5)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in range(4):
        turns = cache.turns(f"t{s}")
        assert len(turns) == 20
        assert [t.index for t in turns] == list(range(20))


async def test_async_api(embedder) -> None:
    cache = ContextCache(embedder)
    await cache.aappend("a", "user", "async red dress question")
    await cache.aextend("a", [{"role": "assistant", "content": "async answer about the dress"}])
    window = await cache.awindow("a", query="dress", max_turns=2)
    assert [t.role for t in window] == ["user", "assistant"]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda c: c.append("", "user", "x"), InvalidInputError, "'session_id' must be a non-empty str"),
        (lambda c: c.append(5, "user", "x"), InputTypeError, "'session_id' must be a str"),
        (lambda c: c.append("s", "robot", "x"), InvalidInputError, "'role' must be one of"),
        (lambda c: c.append("s", "user", None), InputTypeError, "'text' must be a str"),
        (lambda c: c.extend("s", [("user", "ok"), ("user",)]), InputTypeError, r"'turns\[1\]'"),
        (lambda c: c.window("s", max_turns=-1), InvalidInputError, "'max_turns' must be an int >= 0"),
        (lambda c: c.window("s", query=5), InputTypeError, "'query' must be a str or None"),
    ],
)
def test_bad_input(embedder, call, error, message) -> None:
    cache = ContextCache(embedder)
    cache.append("s", "user", "kept")
    with pytest.raises(error, match=message):
        call(cache)
    assert [t.text for t in cache.turns("s")] == ["kept"]  # nothing stored changed


def test_bad_configuration(embedder) -> None:
    with pytest.raises(ConfigurationError, match="'max_sessions'"):
        ContextCache(embedder, max_sessions=0)
    with pytest.raises(ConfigurationError, match="'ttl_seconds'"):
        ContextCache(embedder, ttl_seconds=-5)


@pytest.mark.gpu
def test_turn_vectors_stay_on_cuda() -> None:
    from gpuprompt import Embedder

    emb = Embedder(device="cuda")
    try:
        cache = ContextCache(emb)
        cache.extend("g", CHAT)
        assert cache._sessions["g"].vectors.device.type == "cuda"
        assert [t.index for t in cache.window("g", query="cotton dress", max_turns=3)] == [0, 1, 5]
    finally:
        emb.close()
