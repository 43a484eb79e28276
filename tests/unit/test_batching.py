"""MicroBatcher behaviour: coalescing, ordering, priorities, cancellation, backpressure, isolation."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest

from gpuprompt.batching import MicroBatcher
from gpuprompt.errors import ClosedError, ConfigurationError, EngineDeadError, QueueFullError


class Gate:
    """A batch function that records batches and can be held closed to let a queue build up."""

    def __init__(self, fn=lambda xs: [x * 2 for x in xs]) -> None:
        self.fn = fn
        self.batches: list[list] = []
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()

    def __call__(self, items: list) -> list:
        self.entered.set()
        self.open.wait(10)
        self.batches.append(list(items))
        return self.fn(items)


def _hold(batcher: MicroBatcher, gate: Gate) -> object:
    """Occupy the worker with one item so that later submissions queue up."""
    gate.open.clear()
    gate.entered.clear()
    first = batcher.submit(-1)
    assert gate.entered.wait(5)
    return first


def test_results_in_order_and_coalesced_under_load() -> None:
    gate = Gate()
    with MicroBatcher(gate, name="t", max_batch_size=8, max_wait_ms=0) as batcher:
        first = _hold(batcher, gate)
        futures = [batcher.submit(i) for i in range(20)]
        gate.open.set()
        assert [f.result(5) for f in futures] == [i * 2 for i in range(20)]
        assert first.result(5) == -2
        stats = batcher.stats()
    # 1 held item, then 20 queued items in batches of at most 8.
    assert [len(b) for b in gate.batches] == [1, 8, 8, 4]
    assert stats.batches == 4 and stats.items == 21
    assert stats.max_batch_size == 8
    assert stats.mean_batch_size == pytest.approx(21 / 4)


def test_many_threads_are_coalesced() -> None:
    def slow(xs: list) -> list:
        time.sleep(0.01)
        return [x + 1 for x in xs]

    with MicroBatcher(slow, name="t", max_batch_size=64) as batcher:
        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(lambda i: batcher.submit(i).result(5), range(256)))
        stats = batcher.stats()
    assert results == [i + 1 for i in range(256)]
    assert stats.batches < 256 / 4, stats
    assert stats.mean_batch_size > 4


def test_cost_budget_limits_batches() -> None:
    gate = Gate(lambda xs: xs)
    with MicroBatcher(gate, name="t", max_batch_size=100, max_batch_cost=10, cost=lambda x: x, max_wait_ms=0) as b:
        _hold(b, gate)
        futures = [b.submit(x) for x in [4, 4, 4, 20, 1]]
        gate.open.set()
        assert [f.result(5) for f in futures] == [4, 4, 4, 20, 1]
    # 4+4 fits 10, the third 4 starts a new batch; 20 exceeds the budget and runs alone.
    assert gate.batches[1:] == [[4, 4], [4], [20], [1]]


def test_priority_lower_first_fifo_within() -> None:
    gate = Gate(lambda xs: xs)
    with MicroBatcher(gate, name="t", max_batch_size=1, max_wait_ms=0) as b:
        _hold(b, gate)
        futures = [b.submit("low-1", priority=5), b.submit("high-1", priority=0),
                   b.submit("low-2", priority=5), b.submit("high-2", priority=0)]
        gate.open.set()
        for f in futures:
            f.result(5)
    assert [batch[0] for batch in gate.batches[1:]] == ["high-1", "high-2", "low-1", "low-2"]


def test_cancelled_items_never_run() -> None:
    gate = Gate()
    with MicroBatcher(gate, name="t", max_batch_size=8, max_wait_ms=0) as b:
        _hold(b, gate)
        keep = b.submit(1)
        drop = b.submit(2)
        assert drop.cancel()
        gate.open.set()
        assert keep.result(5) == 2
        with pytest.raises(CancelledError):
            drop.result(5)
        assert b.stats().cancelled == 1
    assert all(2 not in batch for batch in gate.batches)


def test_queue_full_is_typed_and_frees_up() -> None:
    gate = Gate()
    with MicroBatcher(gate, name="t", max_queue=2, max_wait_ms=0) as b:
        _hold(b, gate)
        waiting = [b.submit(1), b.submit(2)]
        with pytest.raises(QueueFullError, match="max_queue=2"):
            b.submit(3)
        waiting[1].cancel()  # a cancelled item gives its place back
        extra = b.submit(4)
        gate.open.set()
        assert waiting[0].result(5) == 2 and extra.result(5) == 8


def test_poisoned_item_fails_alone() -> None:
    def fn(xs: list) -> list:
        if "poison" in xs:
            raise ValueError("bad item")
        return [str(x).upper() for x in xs]

    gate = Gate(fn)
    with MicroBatcher(gate, name="t", max_batch_size=16, max_wait_ms=0) as b:
        _hold(b, gate)
        items = ["a", "b", "poison", "c", "d"]
        futures = [b.submit(x) for x in items]
        gate.open.set()
        for item, future in zip(items, futures):
            if item == "poison":
                with pytest.raises(ValueError, match="bad item"):
                    future.result(5)
            else:
                assert future.result(5) == item.upper()
        stats = b.stats()
    assert stats.failed == 1 and stats.splits >= 1


def test_per_item_exception_results() -> None:
    with MicroBatcher(lambda xs: [ValueError(x) if x < 0 else x for x in xs], name="t") as b:
        good, bad = b.submit(1), b.submit(-1)
        assert good.result(5) == 1
        with pytest.raises(ValueError):
            bad.result(5)


def test_fatal_error_reaches_every_waiter_without_bisect() -> None:
    calls = []

    def dead(xs: list) -> list:
        calls.append(len(xs))
        raise EngineDeadError("engine died")

    gate = Gate(dead)
    with MicroBatcher(gate, name="t", max_batch_size=8, max_wait_ms=0) as b:
        _hold(b, gate)
        futures = [b.submit(i) for i in range(6)]
        gate.open.set()
        for f in futures:
            with pytest.raises(EngineDeadError):
                f.result(5)
    assert calls == [1, 6]


def test_wrong_result_count_is_an_error_not_a_hang() -> None:
    with MicroBatcher(lambda xs: [], name="t", isolate_failures=False) as b:
        with pytest.raises(Exception, match="returned 0 results for 1 items"):
            b.submit(1).result(5)


def test_close_fails_pending_and_refuses_new() -> None:
    gate = Gate()
    b = MicroBatcher(gate, name="t", max_wait_ms=0)
    running = _hold(b, gate)
    pending = b.submit(1)
    closer = threading.Thread(target=b.close)
    closer.start()
    with pytest.raises(ClosedError):
        pending.result(5)
    gate.open.set()
    closer.join(5)
    assert running.result(5) == -2  # the running batch finishes
    with pytest.raises(ClosedError):
        b.submit(2)


async def test_async_and_thread_callers_mix() -> None:
    with MicroBatcher(lambda xs: [x * 10 for x in xs], name="t") as b:
        loop = asyncio.get_running_loop()
        thread_results = loop.run_in_executor(None, lambda: [b.submit(i).result(5) for i in range(10)])
        async_results = await asyncio.gather(*(b.asubmit(i) for i in range(10, 20)))
        assert list(async_results) == [i * 10 for i in range(10, 20)]
        assert await thread_results == [i * 10 for i in range(10)]


async def test_async_cancellation_drops_queued_item() -> None:
    gate = Gate()
    with MicroBatcher(gate, name="t", max_wait_ms=0) as b:
        held = await asyncio.to_thread(_hold, b, gate)
        task = asyncio.create_task(b.asubmit(99))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.open.set()
        assert await asyncio.wrap_future(held) == -2
        assert await b.asubmit(5) == 10  # the queue still works
        assert b.stats().cancelled == 1
    assert all(99 not in batch for batch in gate.batches)


def test_lone_call_is_not_delayed_by_window() -> None:
    # With the worker idle, an item is dispatched at once even with a long window.
    gate = Gate()
    with MicroBatcher(gate, name="t", max_wait_ms=10_000) as b:
        assert b.submit(3).result(2) == 6


def test_a_busy_worker_takes_what_queued_at_once_without_waiting_out_its_window() -> None:
    # Dispatch when free: the queue that built up behind a batch is the next batch, immediately,
    # even with a window of 10 s (it only applies under min_batch_size).
    gate = Gate()
    with MicroBatcher(gate, name="t", max_batch_size=8, max_wait_ms=10_000) as b:
        first = _hold(b, gate)
        futures = [b.submit(i) for i in range(3)]
        gate.open.set()
        assert [f.result(2) for f in futures] == [0, 2, 4]  # 10 s window: would time out if waited
        assert first.result(2) == -2
    assert [len(batch) for batch in gate.batches] == [1, 3]


def test_min_batch_size_gathers_a_short_queue_after_a_batch_within_the_window() -> None:
    gate = Gate()
    with MicroBatcher(gate, name="t", max_batch_size=8, min_batch_size=4, max_wait_ms=10_000) as b:
        first = _hold(b, gate)
        futures = [b.submit(i) for i in range(2)]
        gate.open.set()
        assert first.result(2) == -2
        time.sleep(0.2)  # the worker is free but waits: only 2 of 4 queued
        assert not any(f.done() for f in futures) and len(gate.batches) == 1
        futures += [b.submit(i) for i in range(2, 4)]  # the 4th fills the minimum: dispatched at once
        assert [f.result(2) for f in futures] == [0, 2, 4, 6]
    assert [len(batch) for batch in gate.batches] == [1, 4]
    gate = Gate()
    with MicroBatcher(gate, name="t", min_batch_size=4, max_wait_ms=50) as b:
        first = _hold(b, gate)
        late = b.submit(7)
        gate.open.set()
        assert late.result(2) == 14  # never more than the window: it goes alone after 50 ms
        assert first.result(2) == -2
    assert [len(batch) for batch in gate.batches] == [1, 1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"min_batch_size": 0}, "min_batch_size"),
        ({"min_batch_size": 40, "max_batch_size": 32}, "min_batch_size"),
        ({"max_batch_cost": 5}, "needs a 'cost'"),
        ({"max_wait_ms": -1}, "max_wait_ms"),
        ({"max_queue": 0}, "max_queue"),
    ],
)
def test_bad_configuration(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        MicroBatcher(lambda xs: xs, **kwargs)


def test_on_idle_runs_once_each_time_the_queue_runs_dry_never_while_items_wait() -> None:
    gate = Gate()
    seen: list[int] = []
    idle = threading.Event()
    batcher: MicroBatcher[int, int]

    def on_idle() -> None:
        seen.append(batcher.stats().queue_depth)
        idle.set()

    batcher = MicroBatcher(gate, max_batch_size=2, max_wait_ms=0, on_idle=on_idle)
    try:
        first = _hold(batcher, gate)
        futures = [batcher.submit(i) for i in range(5)]  # three more batches queue behind the first
        gate.open.set()
        assert [f.result(5) for f in futures] == [0, 2, 4, 6, 8] and first.result(5) == -2
        assert idle.wait(5)
        time.sleep(0.05)  # an idle worker does not call it again
        assert seen == [0] and len(gate.batches) == 4
        idle.clear()
        assert batcher.submit(7).result(5) == 14
        assert idle.wait(5) and seen == [0, 0]
    finally:
        batcher.close()


def test_a_failing_on_idle_hook_never_stops_the_worker() -> None:
    def broken() -> None:
        raise RuntimeError("hook")

    batcher = MicroBatcher(lambda xs: xs, on_idle=broken)
    try:
        for i in range(3):
            assert batcher.submit(i).result(5) == i
    finally:
        batcher.close()
    with pytest.raises(ConfigurationError, match="on_idle"):
        MicroBatcher(lambda xs: xs, on_idle="not callable")  # type: ignore[arg-type]


def test_heap_trim_returns_memory_only_after_enough_work() -> None:
    from gpuprompt._memory import HeapTrim, release_free_memory

    calls: list[int] = []
    trim = HeapTrim(threshold=100, release=lambda: calls.append(1) or True)
    trim.add(60)
    trim()
    assert calls == []  # small work: no trim
    trim.add(60)
    trim()
    trim()
    assert calls == [1] and trim.trims == 1  # once per threshold of work
    assert isinstance(release_free_memory(), bool)  # glibc here: True; elsewhere a no-op
