"""The one sync/async bridge (a long-lived background loop) and the shared call policy."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuprompt.bridge import bridge_loop, run_sync
from gpuprompt.errors import (
    EngineDeadError,
    EngineError,
    InvalidInputError,
    QueueFullError,
    RequestTimeoutError,
)
from gpuprompt.llm import CallPolicy, GenerationRequest

pytestmark = pytest.mark.timeout(300)

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def _bridge_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpuprompt-bridge"]


def test_run_sync_returns_and_raises_and_keeps_context() -> None:
    async def echo(value: int) -> tuple[int, str, str]:
        await asyncio.sleep(0)
        return value, VAR.get(), threading.current_thread().name

    async def boom() -> None:
        raise QueueFullError("full")

    token = VAR.set("caller")
    try:
        assert run_sync(echo(3)) == (3, "caller", "gpuprompt-bridge")
    finally:
        VAR.reset(token)
    with pytest.raises(QueueFullError):
        run_sync(boom())


def test_many_threads_share_one_loop_thread() -> None:
    async def work(i: int) -> int:
        await asyncio.sleep(0.01)
        return i * 2

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda i: run_sync(work(i)), range(200)))
    assert results == [i * 2 for i in range(200)]
    assert len(_bridge_threads()) == 1
    assert bridge_loop() is bridge_loop()


def test_run_sync_inside_a_running_loop_does_not_touch_that_loop() -> None:
    async def inner() -> str:
        return threading.current_thread().name

    async def caller() -> str:
        return run_sync(inner())  # a sync API called from async code (a notebook cell, say)

    assert asyncio.run(caller()) == "gpuprompt-bridge"


def test_timeout_cancels_the_work() -> None:
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run_sync(slow(), timeout=0.2)
    assert time.monotonic() - started < 5
    assert cancelled.wait(5)


def test_nested_run_sync_on_the_bridge_loop_does_not_deadlock() -> None:
    async def leaf() -> int:
        return 7

    async def outer() -> int:
        return run_sync(leaf())  # blocks the bridge loop; must not wait on itself

    assert run_sync(outer(), timeout=30) == 7


@pytest.mark.parametrize(
    "options",
    [{"timeout": 0}, {"timeout": -1}, {"timeout": float("nan")}, {"timeout": "5"}, {"max_retries": -1},
     {"max_retries": True}, {"max_retries": 10**9}, {"backoff": float("inf")}],
    ids=repr,
)
def test_policy_refuses_bad_options(options: dict) -> None:
    with pytest.raises(InvalidInputError):
        CallPolicy(**options)


def test_policy_retries_only_transient_errors() -> None:
    attempts = {"n": 0}

    async def flaky() -> str:
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise QueueFullError("busy")
        return "ok"

    assert asyncio.run(CallPolicy(max_retries=2, backoff=0).run(flaky)) == "ok"
    assert attempts["n"] == 3
    for error in (EngineDeadError("dead"), InvalidInputError("bad")):
        calls = {"n": 0}

        async def failing(error: Exception = error) -> None:
            calls["n"] += 1
            raise error

        with pytest.raises(type(error)):
            asyncio.run(CallPolicy(max_retries=5, backoff=0).run(failing))
        assert calls["n"] == 1
    sync_calls = {"n": 0}

    def sync_flaky() -> str:
        sync_calls["n"] += 1
        if sync_calls["n"] == 1:
            raise EngineError("transient")
        return "ok"

    assert CallPolicy(max_retries=1, backoff=0).run_blocking(sync_flaky) == "ok"


def test_policy_timeout_is_typed() -> None:
    async def slow() -> None:
        await asyncio.sleep(10)

    with pytest.raises(RequestTimeoutError, match="timeout=0.05"):
        asyncio.run(CallPolicy(timeout=0.05).run(slow))


def test_engine_timeouts_abort_and_the_engine_serves_on(tf_engine) -> None:
    request = GenerationRequest(messages=[{"role": "user", "content": "Count to fifty."}], max_tokens=200)
    with pytest.raises(RequestTimeoutError):
        tf_engine.generate([request], timeout=0.05)
    with pytest.raises(RequestTimeoutError):
        for _ in tf_engine.stream(request, timeout=0.05):
            pass

    async def go() -> None:
        with pytest.raises(RequestTimeoutError):
            await tf_engine.agenerate(request, timeout=0.05)

    asyncio.run(go())
    deadline = time.monotonic() + 60
    while tf_engine.stats().in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tf_engine.stats().in_flight == 0  # the timed-out requests were aborted, not left running
    short = GenerationRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert tf_engine.generate([short], timeout=120, max_retries=1)[0].usage.completion_tokens >= 1
