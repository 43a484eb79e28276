"""ContextCache validates every public entry: typed errors naming the argument, nothing changed.

A stub embedder counts its calls (a refused call must not embed anything) and a clock that ticks
on every read shows that a refused call does not even touch a session's LRU position.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from gpuprompt import ContextCache
from gpuprompt.context import MAX_SESSION_ID_LENGTH, MAX_SESSIONS_LIMIT, MAX_TURNS_LIMIT
from gpuprompt.errors import (
    ConfigurationError,
    DimensionMismatchError,
    GPUPromptError,
    InputTypeError,
    InvalidInputError,
    describe,
)


class StubEmbedder:
    """Embeds any text as a fixed-size vector derived from its length; counts calls."""

    def __init__(self, dim: int = 4) -> None:
        self.dim = dim
        self.calls = 0
        self.fail_on: str | None = None

    def embed_tensor(self, texts: Sequence[str]) -> Any:
        import torch

        self.calls += 1
        if self.fail_on is not None and self.fail_on in texts:
            raise RuntimeError("the embedding backend failed")
        return torch.tensor([[float(len(t)), 1.0] + [0.0] * (self.dim - 2) for t in texts], dtype=torch.float32)

    async def aembed_tensor(self, texts: Sequence[str]) -> Any:
        return self.embed_tensor(texts)

    def count_tokens(self, texts: list[str], *, truncate: bool = True) -> list[int]:
        return [len(t.split()) for t in texts]


class TickingClock:
    """Advances one second per reading, so any touch of a session changes its ``last_access``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def make_cache(**options: Any) -> tuple[ContextCache, StubEmbedder]:
    embedder = StubEmbedder()
    cache = ContextCache(embedder, clock=TickingClock(), **options)  # type: ignore[arg-type]
    cache.extend("s", [("user", "kept one"), ("assistant", "kept two")])
    cache.append("other", "user", "another session")
    return cache, embedder


def state(cache: ContextCache) -> Any:
    """Everything stored, read without touching anything."""
    sessions = [
        (sid, [(t.role, t.text, t.index, t.tokens) for t in s.live()], s.last_access, s.next_index)
        for sid, s in cache._sessions.items()
    ]
    return sessions, cache._evicted, cache._expired, cache._dropped


def assert_refused(
    call: Callable[[ContextCache], Any], error: type[Exception], name: str, **options: Any
) -> GPUPromptError:
    cache, embedder = make_cache(**options)
    before, calls = state(cache), embedder.calls
    with pytest.raises(error) as info:
        call(cache)
    assert isinstance(info.value, GPUPromptError)
    assert f"'{name}' must be" in str(info.value), str(info.value)
    assert state(cache) == before, "a refused call changed what is stored"
    assert embedder.calls == calls, "a refused call embedded something"
    return info.value


SURROGATE = "bad \ud800 text"

# (call, error, the argument the message names)
REFUSED_CALLS: list[tuple[str, Callable[[ContextCache], Any], type[Exception], str]] = [
    # session ids
    ("sid None", lambda c: c.append(None, "user", "x"), InputTypeError, "session_id"),
    ("sid int", lambda c: c.append(5, "user", "x"), InputTypeError, "session_id"),
    ("sid bytes", lambda c: c.append(b"s", "user", "x"), InputTypeError, "session_id"),
    ("sid empty", lambda c: c.append("", "user", "x"), InvalidInputError, "session_id"),
    ("sid long", lambda c: c.append("x" * (MAX_SESSION_ID_LENGTH + 1), "user", "x"), InvalidInputError, "session_id"),
    ("sid surrogate", lambda c: c.append("s\udc80", "user", "x"), InvalidInputError, "session_id"),
    ("sid extend", lambda c: c.extend(["s"], [("user", "x")]), InputTypeError, "session_id"),
    ("sid window", lambda c: c.window(1.5), InputTypeError, "session_id"),
    ("sid turns", lambda c: c.turns(None), InputTypeError, "session_id"),
    ("sid clear int", lambda c: c.clear(3), InputTypeError, "session_id"),
    ("sid clear empty", lambda c: c.clear(""), InvalidInputError, "session_id"),
    # roles
    ("role list", lambda c: c.append("s", ["user"], "x"), InputTypeError, "role"),
    ("role None", lambda c: c.append("s", None, "x"), InputTypeError, "role"),
    ("role bytes", lambda c: c.append("s", b"user", "x"), InputTypeError, "role"),
    ("role dict", lambda c: c.append("s", {"user": 1}, "x"), InputTypeError, "role"),
    ("role unknown", lambda c: c.append("s", "robot", "x"), InvalidInputError, "role"),
    ("role case", lambda c: c.append("s", "User", "x"), InvalidInputError, "role"),
    ("role surrogate", lambda c: c.append("s", "us\ud800er", "x"), InvalidInputError, "role"),
    # texts
    ("text None", lambda c: c.append("s", "user", None), InputTypeError, "text"),
    ("text bytes", lambda c: c.append("s", "user", b"x"), InputTypeError, "text"),
    ("text int", lambda c: c.append("s", "user", 5), InputTypeError, "text"),
    ("text surrogate", lambda c: c.append("s", "user", SURROGATE), InvalidInputError, "text"),
    # extend: the container and each item; a bad item late in the batch stores nothing
    ("turns str", lambda c: c.extend("s", "user"), InputTypeError, "turns"),
    ("turns dict", lambda c: c.extend("s", {"role": "user", "content": "x"}), InputTypeError, "turns"),
    ("turns int", lambda c: c.extend("s", 5), InputTypeError, "turns"),
    ("turns None", lambda c: c.extend("s", None), InputTypeError, "turns"),
    ("item short", lambda c: c.extend("s", [("user", "ok"), ("user",)]), InputTypeError, "turns[1]"),
    ("item str", lambda c: c.extend("s", [("user", "ok"), "user: hi"]), InputTypeError, "turns[1]"),
    ("item keys", lambda c: c.extend("s", [("user", "ok"), {"role": "user"}]), InputTypeError, "turns[1]"),
    ("item role", lambda c: c.extend("s", [("user", "ok"), ("robot", "x")]), InvalidInputError, "turns[1][0]"),
    ("item role list", lambda c: c.extend("s", [("user", "ok"), (["user"], "x")]), InputTypeError, "turns[1][0]"),
    ("item text", lambda c: c.extend("s", [("user", "ok"), ("user", None)]), InputTypeError, "turns[1][1]"),
    (
        "item surrogate",
        lambda c: c.extend("s", [("user", "ok"), {"role": "user", "content": SURROGATE}]),
        InvalidInputError,
        "turns[1]['content']",
    ),
    (
        "item dict role",
        lambda c: c.extend("s", [{"role": "tool?", "content": "x"}]),
        InvalidInputError,
        "turns[0]['role']",
    ),
    # window arguments
    ("query int", lambda c: c.window("s", query=5), InputTypeError, "query"),
    ("query bytes", lambda c: c.window("s", query=b"q"), InputTypeError, "query"),
    ("query surrogate", lambda c: c.window("s", query=SURROGATE), InvalidInputError, "query"),
    ("max_turns bool", lambda c: c.window("s", max_turns=True), InvalidInputError, "max_turns"),
    ("max_turns neg", lambda c: c.window("s", max_turns=-1), InvalidInputError, "max_turns"),
    ("max_turns float", lambda c: c.window("s", max_turns=2.0), InvalidInputError, "max_turns"),
    ("max_turns str", lambda c: c.window("s", max_turns="3"), InvalidInputError, "max_turns"),
    ("max_turns None", lambda c: c.window("s", max_turns=None), InvalidInputError, "max_turns"),
    ("max_tokens bool", lambda c: c.window("s", max_tokens=False), InvalidInputError, "max_tokens"),
    ("max_tokens neg", lambda c: c.window("s", max_tokens=-5), InvalidInputError, "max_tokens"),
    ("max_tokens nan", lambda c: c.window("s", max_tokens=math.nan), InvalidInputError, "max_tokens"),
    ("recent bool", lambda c: c.window("s", "q", recent=True), InvalidInputError, "recent"),
    ("recent neg", lambda c: c.window("s", "q", recent=-1), InvalidInputError, "recent"),
    ("recent str", lambda c: c.window("s", "q", recent="2"), InvalidInputError, "recent"),
]


@pytest.mark.parametrize(("call", "error", "name"), [c[1:] for c in REFUSED_CALLS], ids=[c[0] for c in REFUSED_CALLS])
def test_refused_calls_name_the_argument_and_change_nothing(call, error, name) -> None:
    assert_refused(call, error, name)


def test_messages_follow_the_template() -> None:
    error = assert_refused(lambda c: c.append("s", ["user"], "x"), InputTypeError, "role")
    assert str(error) == f"'role' must be a str (got {describe(['user'])})."
    error = assert_refused(lambda c: c.append("s", "robot", "x"), InvalidInputError, "role")
    assert str(error) == "'role' must be one of 'system', 'user', 'assistant', 'tool' (got 'robot' that is a str)."
    # One roles definition: a turn the cache accepts always fits a GenerationRequest, a tool
    # result ("tool", its text only) included.
    cache = ContextCache(StubEmbedder(), clock=TickingClock())
    cache.append("s", "tool", "42 items in stock")
    assert [turn.role for turn in cache.turns("s")] == ["tool"]
    error = assert_refused(lambda c: c.window("s", max_turns=True), InvalidInputError, "max_turns")
    assert str(error) == "'max_turns' must be an int >= 0 (got True that is a bool)."
    error = assert_refused(lambda c: c.append("s", "user", SURROGATE), InvalidInputError, "text")
    assert "lone surrogate" in str(error)


ASYNC_REFUSED: list[tuple[str, Callable[[ContextCache], Any], type[Exception], str]] = [
    ("aappend role", lambda c: c.aappend("s", ["user"], "x"), InputTypeError, "role"),
    ("aappend text", lambda c: c.aappend("s", "user", SURROGATE), InvalidInputError, "text"),
    ("aappend sid", lambda c: c.aappend("", "user", "x"), InvalidInputError, "session_id"),
    ("aextend item", lambda c: c.aextend("s", [("user", "ok"), ("bot", "x")]), InvalidInputError, "turns[1][0]"),
    ("aextend str", lambda c: c.aextend("s", "hello"), InputTypeError, "turns"),
    ("awindow max_turns", lambda c: c.awindow("s", "q", max_turns=True), InvalidInputError, "max_turns"),
    ("awindow recent", lambda c: c.awindow("s", "q", recent=-2), InvalidInputError, "recent"),
    ("awindow query", lambda c: c.awindow("s", query=["q"]), InputTypeError, "query"),
]


@pytest.mark.parametrize(("call", "error", "name"), [c[1:] for c in ASYNC_REFUSED], ids=[c[0] for c in ASYNC_REFUSED])
async def test_async_refusals_match_the_sync_ones(call, error, name) -> None:
    cache, embedder = make_cache()
    before, calls = state(cache), embedder.calls
    with pytest.raises(error, match=re.escape(f"'{name}' must be")):
        await call(cache)
    assert state(cache) == before
    assert embedder.calls == calls


# ---------------------------------------------------------------------- configuration
BAD_OPTIONS: list[tuple[str, Any]] = [
    ("ttl_seconds", math.nan),
    ("ttl_seconds", math.inf),
    ("ttl_seconds", -math.inf),
    ("ttl_seconds", -1),
    ("ttl_seconds", 0),
    ("ttl_seconds", 0.0),
    ("ttl_seconds", True),
    ("ttl_seconds", "60"),
    ("ttl_seconds", [60]),
    ("ttl_seconds", np.float64("nan")),
    ("max_sessions", 0),
    ("max_sessions", -3),
    ("max_sessions", True),
    ("max_sessions", 1.5),
    ("max_sessions", 10.0),
    ("max_sessions", "10"),
    ("max_sessions", None),
    ("max_sessions", 2**70),
    ("max_sessions", MAX_SESSIONS_LIMIT + 1),
    ("max_turns_per_session", 0),
    ("max_turns_per_session", False),
    ("max_turns_per_session", 2.0),
    ("max_turns_per_session", None),
    ("max_turns_per_session", MAX_TURNS_LIMIT + 1),
    ("token_counter", 5),
    ("token_counter", "len"),
    ("clock", None),
    ("clock", 1000.0),
]


@pytest.mark.parametrize(("name", "value"), BAD_OPTIONS, ids=[f"{n}={v!r}" for n, v in BAD_OPTIONS])
def test_bad_options_are_configuration_errors(name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        ContextCache(StubEmbedder(), **{name: value})  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"'{name}' must be"), message
    assert f"(got {describe(value)})." in message, message


@pytest.mark.parametrize("embedder", [object(), "cpu", 5])
def test_bad_embedder_is_a_configuration_error(embedder: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"'embedder' must be a gpuprompt.Embedder \(an EmbedderLike\)"):
        ContextCache(embedder)


def test_nan_ttl_no_longer_purges_every_session() -> None:
    """``ttl_seconds=nan`` used to be accepted and then expired every session on the next access."""
    with pytest.raises(ConfigurationError, match="'ttl_seconds' must be a finite number"):
        ContextCache(StubEmbedder(), ttl_seconds=float("nan"))  # type: ignore[arg-type]


def test_good_options_are_accepted_and_normalised() -> None:
    cache = ContextCache(
        StubEmbedder(),  # type: ignore[arg-type]
        max_sessions=np.int64(3),
        max_turns_per_session=np.int32(2),
        ttl_seconds=np.float32(0.5),
    )
    assert type(cache.max_sessions) is int and cache.max_sessions == 3
    assert type(cache.max_turns_per_session) is int and cache.max_turns_per_session == 2
    assert type(cache.ttl_seconds) is float and cache.ttl_seconds == 0.5
    assert ContextCache(StubEmbedder(), ttl_seconds=None).ttl_seconds is None  # type: ignore[arg-type]
    assert ContextCache(StubEmbedder(), ttl_seconds=60).ttl_seconds == 60.0  # type: ignore[arg-type]


def test_window_accepts_the_minimums_and_numpy_ints() -> None:
    cache, _ = make_cache()
    assert cache.window("s", max_turns=0) == []
    assert cache.window("s", max_turns=2, max_tokens=0) == []
    assert [t.text for t in cache.window("s", "q", max_turns=np.int64(2), recent=0)] == ["kept one", "kept two"]
    assert cache.window("unknown session", "q") == []


@pytest.mark.parametrize("query", [None, "q"])
def test_huge_budgets_are_clamped_to_the_session(query: str | None) -> None:
    """Budgets are unbounded ints (nothing stores them), so no use of them may scale with them."""
    cache, _ = make_cache()
    started = time.perf_counter()
    for recent in (None, 0, 1, 2**80):
        got = cache.window("s", query, max_turns=2**80, max_tokens=2**90, recent=recent)
        assert [t.text for t in got] == ["kept one", "kept two"]
    assert time.perf_counter() - started < 1.0


# ---------------------------------------------------------------------- nothing stored changes
@pytest.mark.parametrize("bad", [-1, 2.5, "3", True, None])
def test_bad_token_counter_result_stores_nothing(bad: Any) -> None:
    def counter(text: str) -> Any:
        return bad if text == "poison" else 1

    cache, _ = make_cache(token_counter=counter)
    before = state(cache)
    with pytest.raises(ConfigurationError, match=r"'token_counter\(text\)' must be an int"):
        cache.extend("s", [("user", "fine"), ("user", "poison")])
    with pytest.raises(ConfigurationError):
        cache.append("fresh", "user", "poison")
    assert state(cache) == before


def test_embedder_failure_stores_nothing() -> None:
    cache, embedder = make_cache()
    before = state(cache)
    embedder.fail_on = "boom"
    with pytest.raises(RuntimeError, match="backend failed"):
        cache.extend("s", [("user", "fine"), ("user", "boom")])
    with pytest.raises(RuntimeError):
        cache.append("fresh", "user", "boom")
    assert state(cache) == before


def test_embedder_dimension_change_is_refused_and_stores_nothing() -> None:
    cache, embedder = make_cache()
    before = state(cache)
    embedder.dim = 6
    with pytest.raises(DimensionMismatchError, match="dimension 4") as info:
        cache.append("s", "user", "six dims now")
    assert (info.value.expected, info.value.got) == (4, 6)
    assert state(cache) == before
    cache.append("new session", "user", "a new session takes any dimension")


def test_empty_extend_creates_no_session() -> None:
    cache, embedder = make_cache()
    before, calls = state(cache), embedder.calls
    assert cache.extend("new", []) == []
    assert cache.extend("new", iter(())) == []
    assert state(cache) == before and embedder.calls == calls


def test_pairs_may_be_lists_and_turns_any_iterable() -> None:
    cache, _ = make_cache()
    stored = cache.extend("g", (pair for pair in [["user", "from a list"], ("assistant", "from a tuple")]))
    assert [(t.role, t.text, t.index) for t in stored] == [("user", "from a list", 0), ("assistant", "from a tuple", 1)]


# ---------------------------------------------------------------------- turn cap and compaction
def test_batch_longer_than_the_cap_keeps_its_last_turns() -> None:
    cache, _ = make_cache(max_turns_per_session=3)
    returned = cache.extend("s", [("user", f"batch {i}") for i in range(5)])
    assert [t.index for t in returned] == [2, 3, 4, 5, 6]  # every turn of the call is returned
    assert [t.index for t in cache.turns("s")] == [4, 5, 6]
    assert cache.stats().dropped_turns == 4  # the two older turns, then the batch's first two
    assert cache.stats().turns == 3 + 1


def test_many_appends_under_the_cap_keep_rows_and_turns_aligned() -> None:
    """Hundreds of appends (many compactions): each kept turn still scores with its own vector."""
    embedder = StubEmbedder()
    cache = ContextCache(embedder, max_turns_per_session=5, token_counter=lambda t: 1)  # type: ignore[arg-type]
    for i in range(300):
        cache.append("s", "user", "x" * (i % 37 + 1))  # the vector's first coordinate is the length
        session = cache._sessions["s"]
        live = session.live()
        rows = session.vectors[session.start : len(session.turns)]
        assert [float(r[0]) for r in rows] == [float(len(t.text)) for t in live]
        assert [t.index for t in live] == list(range(max(0, i - 4), i + 1))
        assert session.vectors.shape[0] <= 2 * 5 + 8


def test_roles_are_the_llm_roles_and_every_stored_turn_fits_a_request() -> None:
    from gpuprompt.context import _cache as context
    from gpuprompt.llm import GenerationRequest
    from gpuprompt.llm._types import ROLES

    assert context.ROLES is ROLES == ("system", "user", "assistant", "tool")
    cache = ContextCache(StubEmbedder(), clock=TickingClock())
    cache.extend("s", [(role, f"a {role} turn") for role in ROLES])
    GenerationRequest(messages=[turn.as_message() for turn in cache.turns("s")])  # accepted as stored
