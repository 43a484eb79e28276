"""VectorIndex's async API: each coroutine equals its sync twin, never blocks the loop, and cancels cleanly.

"Never blocks" is shown without timing: another thread holds the lock an operation needs, and
releases it only once a ticker task on the event loop has ticked -- which it can only do if the
waiting operation left the loop free. A cancelled write is checked the moment CancelledError
arrives: either every record of it is stored, or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from gpuprompt import VectorIndex
from gpuprompt.errors import DimensionMismatchError, FilterError, InputTypeError, InvalidInputError
from index_helpers import check_mmr_batched_with_a_larger_search

DIM = 8
N = 60
TICKS = 20  # loop iterations the ticker must make while an operation waits


def _data(n: int = N, seed: int = 0) -> tuple[list[str], np.ndarray, list[str], list[dict]]:
    vectors = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return [f"s{seed}-{i}" for i in range(n)], vectors, [f"doc {i}" for i in range(n)], [{"i": i} for i in range(n)]


def _index(**options) -> VectorIndex:
    return VectorIndex(DIM, backend="torch", device="cpu", **options)


def _state(index: VectorIndex) -> list[tuple]:
    return [(r.id, r.vector.tobytes(), r.document, r.metadata) for r in index.get(index.ids())]


def _rows(hits: list[list]) -> list[list[tuple]]:
    return [[(h.id, pytest.approx(h.score, abs=1e-6), h.document, h.metadata) for h in row] for row in hits]


# ---------------------------------------------------------------------------------------- equality
async def test_every_async_operation_equals_its_sync_twin(tmp_path: Path) -> None:
    sync, other = _index(), _index()
    ids, vectors, docs, metas = _data()
    assert await other.aadd(ids, vectors, docs, metas) == sync.add(ids, vectors, docs, metas)
    generated = await other.aadd(None, vectors[:2])
    assert len(generated) == 2 and all(len(key) == 32 for key in generated)
    assert await other.adelete(generated) == 2
    assert _state(other) == _state(sync)
    wanted = [ids[5], "missing", ids[0]]
    assert await other.aget(wanted) == sync.get(wanted)
    flt = {"i": {"$lt": 10}}
    assert await other.aids() == sync.ids() and await other.aids(filter=flt) == sync.ids(filter=flt)
    queries = vectors[:3] + 0.05
    assert _rows(await other.asearch(queries, 4, filter=flt)) == _rows(sync.search(queries, 4, filter=flt))
    assert _rows([await other.ammr(queries[0], k=3, fetch_k=10)]) == _rows([sync.mmr(queries[0], k=3, fetch_k=10)])
    assert await other.adelete(ids[:7] + ["missing"]) == sync.delete(ids[:7] + ["missing"]) == 7
    assert _state(other) == _state(sync)
    await other.asave(tmp_path / "async")
    sync.save(tmp_path / "sync")
    loaded = [await VectorIndex.aload(tmp_path / name, device="cpu", max_batch_size=4) for name in ("async", "sync")]
    assert _state(loaded[0]) == _state(loaded[1]) == _state(VectorIndex.load(tmp_path / "sync", device="cpu"))
    assert loaded[0].config == loaded[1].config and loaded[0].config.max_batch_size == 4
    await other.aclear()
    sync.clear()
    assert other.count == sync.count == 0 and await other.aids() == []


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda index: index.aadd(["a"], np.ones((1, DIM + 1))), DimensionMismatchError),
        (lambda index: index.aadd(["a", "b"], np.ones((1, DIM))), InvalidInputError),
        (lambda index: index.aadd(["a"], np.full((1, DIM), np.nan)), InvalidInputError),
        (lambda index: index.adelete("a"), InputTypeError),
        (lambda index: index.aget([3]), InputTypeError),
        (lambda index: index.aids(filter={"$bad": 1}), FilterError),
        (lambda index: index.asearch(np.ones(DIM), k=0), InvalidInputError),
        (lambda index: index.ammr(np.ones((2, DIM))), InvalidInputError),
        (lambda index: index.asave(3), InputTypeError),
        (lambda index: VectorIndex.aload(b"x"), InputTypeError),
    ],
)
async def test_async_operations_raise_what_their_sync_twins_raise(call, error: type[Exception]) -> None:
    index = _index()
    index.add(["keep"], np.ones((1, DIM)))
    with pytest.raises(error):
        await call(index)
    assert index.ids() == ["keep"]


# ---------------------------------------------------------------------------------------- the loop stays free
@contextlib.contextmanager
def _held(lock_cm: Callable[[], contextlib.AbstractContextManager], release: threading.Event) -> Iterator[None]:
    """Hold a lock on another thread until ``release`` is set (or 5 s pass: then the test fails)."""
    taken = threading.Event()
    timed_out: list[bool] = []

    def hold() -> None:
        with lock_cm():
            taken.set()
            timed_out.append(not release.wait(timeout=5))

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait()
    try:
        yield
    finally:
        release.set()
        thread.join()
    assert timed_out == [False], "the lock was never released from the event loop: the loop was blocked"


async def _runs_with_the_loop_free(operation: Awaitable, lock_cm: Callable[[], contextlib.AbstractContextManager]):
    """Run ``operation`` while another thread holds the lock it needs; the ticker must free it."""
    release = threading.Event()
    ticks: list[int] = []

    async def ticker() -> None:
        while len(ticks) < TICKS:
            await asyncio.sleep(0)
            ticks.append(len(ticks))
        release.set()  # only a free loop gets here: the operation is still waiting for the lock

    with _held(lock_cm, release):
        tick_task = asyncio.create_task(ticker())
        try:
            result = await operation
        finally:
            tick_task.cancel()
    assert len(ticks) == TICKS, f"the event loop ticked {len(ticks)} times while the operation waited"
    return result


@pytest.mark.parametrize("name", ["aadd", "adelete", "aclear", "aget", "aids", "asave", "asearch", "ammr"])
async def test_operations_wait_for_locks_off_the_loop(tmp_path: Path, name: str) -> None:
    index = _index()
    ids, vectors, docs, metas = _data()
    index.add(ids, vectors, docs, metas)
    index.search(vectors[0], k=1)  # the backend and the batch worker exist
    operations = {
        "aadd": lambda: index.aadd(["new"], np.ones((1, DIM))),
        "adelete": lambda: index.adelete(ids[:3]),
        "aclear": lambda: index.aclear(),
        "aget": lambda: index.aget(ids[:3]),
        "aids": lambda: index.aids(filter={"i": 1}),
        "asave": lambda: index.asave(tmp_path / "snap"),
        "asearch": lambda: index.asearch(vectors[:2], k=2),
        "ammr": lambda: index.ammr(vectors[0], k=2),
    }
    result = await _runs_with_the_loop_free(operations[name](), index._lock.write)
    expected = {"aadd": ["new"], "adelete": 3, "aget": index.get(ids[:3]), "aids": [ids[1]]}
    if name in expected:
        assert result == expected[name]
    if name == "asave":
        assert VectorIndex.load(tmp_path / "snap", device="cpu").count == N


async def test_aload_waits_for_a_save_off_the_loop(tmp_path: Path) -> None:
    index = _index()
    index.add(*_data())
    index.save(tmp_path / "snap")

    @contextlib.contextmanager
    def save_lock() -> Iterator[None]:  # what a save in another process holds while it renames
        with open(tmp_path / ".snap.gpuprompt-lock", "rb") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            yield

    loaded = await _runs_with_the_loop_free(VectorIndex.aload(tmp_path / "snap", device="cpu"), save_lock)
    assert _state(loaded) == _state(index)


# ---------------------------------------------------------------------------------------- cancellation
async def test_a_cancelled_running_add_is_whole_when_cancelled_error_arrives() -> None:
    index = _index()
    index.add(*_data(seed=1))
    ids, vectors, docs, metas = _data(500, seed=2)
    release = threading.Event()
    with _held(index._lock.write, release):
        task = asyncio.create_task(index.aadd(ids, vectors, docs, metas))
        for _ in range(5000):  # the add is running: checked, and waiting for the write lock
            if index._lock._writers_waiting:
                break
            await asyncio.sleep(0.001)
        assert index._lock._writers_waiting and not release.is_set()
        task.cancel()
        for _ in range(TICKS):
            await asyncio.sleep(0)
        assert not task.done()  # the cancellation waits for the running write (the loop stays free) ...
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    # ... which is complete the moment CancelledError arrives: nothing is left running behind it
    assert index.count == N + 500
    assert [(r.id, r.document, r.metadata) for r in index.get(ids)] == list(zip(ids, docs, metas))


async def test_a_cancelled_add_that_has_not_started_never_runs() -> None:
    index = _index()
    index.add(*_data(seed=1))
    before = _state(index)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=1))  # this test's loop only
    gate = threading.Event()
    busy = loop.run_in_executor(None, gate.wait)  # the one worker is busy: the add queues behind it
    try:
        task = asyncio.create_task(index.aadd(*_data(50, seed=3)))
        for _ in range(TICKS):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task  # at once: a call that has not started is dropped, nothing to wait for
    finally:
        gate.set()
    await busy
    await loop.run_in_executor(None, lambda: None)  # the queue has drained past the dropped add
    assert _state(index) == before


async def test_cancelling_adds_at_random_moments_leaves_each_whole_or_absent() -> None:
    index = _index()
    keys = [f"k{i}" for i in range(400)]
    rng = np.random.default_rng(7)
    index.add(keys, rng.standard_normal((400, DIM)), metadatas=[{"v": 0}] * 400)
    current, applied, cancelled = 0, 0, 0
    for version in range(1, 31):
        task = asyncio.create_task(index.aadd(keys, rng.standard_normal((400, DIM)), metadatas=[{"v": version}] * 400))
        await asyncio.sleep(float(rng.uniform(0, 0.004)))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
        versions = {record.metadata["v"] for record in index.get(keys)}
        assert len(versions) == 1 and versions <= {current, version}, versions  # never a mix
        assert index.count == 400
        if versions == {version}:
            current, applied = version, applied + 1
    assert cancelled > 0


def test_an_mmr_batched_with_a_larger_search_keeps_to_its_own_candidates() -> None:
    check_mmr_batched_with_a_larger_search(VectorIndex(DIM, backend="torch", device="cpu", max_wait_ms=50), DIM)
