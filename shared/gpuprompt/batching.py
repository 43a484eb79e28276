"""MicroBatcher: the one dynamic-batching mechanism of gpuprompt.

Concurrent callers (threads or asyncio tasks) each submit one item and wait on their own future;
a single worker thread groups queued items into batches and runs the batch function on them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    EngineDeadError,
    EngineError,
    GPUPromptError,
    QueueFullError,
    describe,
)
from gpuprompt.validation import check_bool, check_int, check_number, check_str

__all__ = ["PRIORITY_MAX", "PRIORITY_MIN", "BatcherStats", "MicroBatcher", "check_priority"]

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger(__name__)

_WAIT_SAMPLES = 10_000
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
"""Priorities are ints in this range (lower runs first): what every engine backend can order."""
MAX_WAIT_MS_LIMIT = 60_000.0
MAX_CLOSE_TIMEOUT_S = 7 * 24 * 3600.0


def check_priority(priority: Any, name: str = "priority") -> int:
    """Return ``priority`` as an int in ``[PRIORITY_MIN, PRIORITY_MAX]`` or raise ``InvalidInputError``.

    Checked on the caller's side, before the item reaches the shared queue: an item that cannot be
    ordered must fail its own caller, never the worker that serves everyone.
    """
    return check_int(priority, name, min=PRIORITY_MIN, max=PRIORITY_MAX)  # type: ignore[return-value]


@dataclass(frozen=True)
class BatcherStats:
    """A snapshot of a MicroBatcher's counters.

    Attributes:
        batches: batch-function calls that completed (splits count once per call).
        items: items that received a result or an error from a batch.
        mean_batch_size: ``items / batches`` over dispatched batches (before any split).
        max_batch_size: the largest batch dispatched.
        queue_wait_p50_ms: median time from submit to dispatch, over recent items.
        queue_wait_p95_ms: 95th percentile of the same.
        failed: items that received an exception.
        splits: times a failing batch was bisected to isolate the failing item.
        cancelled: items cancelled before they ran (never passed to the batch function).
        queue_depth: items waiting now.
    """

    batches: int
    items: int
    mean_batch_size: float
    max_batch_size: int
    queue_wait_p50_ms: float
    queue_wait_p95_ms: float
    failed: int
    splits: int
    cancelled: int
    queue_depth: int


@dataclass(order=True)
class _Entry(Generic[T]):
    priority: int
    seq: int
    item: T = field(compare=False)
    future: Future = field(compare=False)
    cost: int = field(compare=False, default=1)
    enqueued_at: float = field(compare=False, default=0.0)
    taken: bool = field(compare=False, default=False)
    dropped: bool = field(compare=False, default=False)


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class MicroBatcher(Generic[T, R]):
    """Groups concurrent single-item requests into batched calls of ``fn``.

    Dispatch policy (as infinity and text-embeddings-inference dispatch): the worker never waits
    while work is queued. When it is idle, a new item is dispatched at once (a lone caller pays no
    wait); while a batch runs, new items queue, and when the batch ends the worker takes what queued
    meanwhile as the next batch, at once. The only wait is opt-in: with ``min_batch_size`` > 1, a
    worker that just finished a batch and finds fewer than that many items queued lets them gather
    for at most ``max_wait_ms`` (an idle worker still dispatches a lone item at once). Under load
    the batches therefore size themselves: the longer a batch runs, the more queues behind it.
    (The earlier policy waited after every batch for the callers just served to come back; in a
    pipeline of two batchers, such as embed-then-search, those callers were waiting on the other
    stage, so each stage idled out its window and cohorts split into small batches.)
    A batch holds at most ``max_batch_size`` items and, when ``cost`` is given, at most
    ``max_batch_cost`` total cost (a single item larger than the budget still runs, alone).
    Lower ``priority`` runs first; FIFO within a priority.

    Failure isolation: if ``fn`` raises on a batch of several items, the batch is bisected and
    retried, so only the item(s) that fail get the exception (this also halves batches on
    out-of-memory errors). ``fn`` may also return an exception instance in an item's slot to fail
    that item alone. Exceptions of the ``fatal`` types skip the bisection and go to every item.

    Example:
        >>> b = MicroBatcher(lambda xs: [x * 2 for x in xs], name="double")
        >>> b.submit(21).result()
        42
        >>> b.close()

    Args:
        fn: the batch function: takes a list of items, returns one result per item, in order.
        name: a short name for logs, stats and the worker thread.
        max_batch_size: most items per batch.
        max_batch_cost: most total cost per batch (needs ``cost``); None for no budget.
        cost: the cost of one item (for example its token count).
        max_wait_ms: with ``min_batch_size`` > 1, the longest a worker that just finished a batch
            waits for ``min_batch_size`` items to queue (it never waits when idle).
        min_batch_size: the queue a busy worker gathers before dispatching (within ``max_wait_ms``);
            1, the default, dispatches whatever is queued at once.
        max_queue: most items waiting; a further submit raises ``QueueFullError``.
        isolate_failures: bisect failing batches so one bad item fails alone.
        fatal: exception types that fail the whole batch without bisection.
        on_idle: called on the worker thread each time the queue runs dry after work (not while
            items wait), outside the lock; the embedder gives freed memory back to the OS there.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        name: str = "batcher",
        max_batch_size: int = 32,
        max_batch_cost: int | None = None,
        cost: Callable[[T], int] | None = None,
        max_wait_ms: float = 2.0,
        min_batch_size: int = 1,
        max_queue: int = 10_000,
        isolate_failures: bool = True,
        fatal: tuple[type[BaseException], ...] = (EngineDeadError, ClosedError),
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        check_int(max_batch_size, "max_batch_size", min=1, error=ConfigurationError)
        check_int(min_batch_size, "min_batch_size", min=1, max=max_batch_size, error=ConfigurationError)
        check_int(max_batch_cost, "max_batch_cost", min=1, allow_none=True, error=ConfigurationError)
        if max_batch_cost is not None and cost is None:
            raise ConfigurationError("'max_batch_cost' needs a 'cost' function that prices one item.")
        max_wait_ms = check_number(max_wait_ms, "max_wait_ms", min=0, max=MAX_WAIT_MS_LIMIT, error=ConfigurationError)
        check_int(max_queue, "max_queue", min=1, error=ConfigurationError)
        if not isinstance(fatal, tuple) or not all(isinstance(t, type) and issubclass(t, BaseException) for t in fatal):
            raise ConfigurationError(f"'fatal' must be a tuple of exception classes (got {describe(fatal)}).")
        check_bool(isolate_failures, "isolate_failures", error=ConfigurationError)
        check_str(name, "name", error=ConfigurationError)
        if not callable(fn) or (cost is not None and not callable(cost)) or (on_idle is not None and not callable(on_idle)):
            raise ConfigurationError(f"'fn', 'cost' and 'on_idle' must be callables (got {describe(fn)}, "
                                     f"{describe(cost)}, {describe(on_idle)}).")
        self._fn = fn
        self.name = name
        self.max_batch_size = max_batch_size
        self.min_batch_size = min_batch_size
        self.max_batch_cost = max_batch_cost
        self._cost = cost
        self._max_wait = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self._isolate = isolate_failures
        self._fatal = fatal
        self._on_idle = on_idle
        self._cond = threading.Condition(threading.RLock())
        self._heap: list[_Entry[T]] = []
        self._live = 0
        self._seq = itertools.count()
        self._closed = False
        self._worker: threading.Thread | None = None
        self._busy = False
        # counters
        self._batches = 0
        self._dispatches = 0
        self._dispatched_items = 0
        self._items = 0
        self._max_seen = 0
        self._failed = 0
        self._splits = 0
        self._cancelled = 0
        self._waits: deque[float] = deque(maxlen=_WAIT_SAMPLES)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<MicroBatcher {self.name!r} {state} queued={self._live} max_batch_size={self.max_batch_size}>"

    # ------------------------------------------------------------------ submission
    def submit(self, item: T, *, priority: int = 0) -> Future[R]:
        """Queue one item; return a future that receives its result or exception.

        Cancelling the future before its batch starts removes the item: it never runs.

        Raises:
            ClosedError: the batcher was closed.
            QueueFullError: ``max_queue`` items are already waiting.
        """
        return self.submit_many([item], priority=priority)[0]

    def submit_many(self, items: Iterable[T], *, priority: int = 0) -> list[Future[R]]:
        """Queue several items atomically (all or none); return their futures in order."""
        priority = check_priority(priority)
        items = list(items)
        costs = [self._item_cost(item) for item in items]
        now = time.perf_counter()
        entries: list[_Entry[T]] = []
        with self._cond:
            if self._closed:
                raise ClosedError(f"MicroBatcher {self.name!r} is closed; create a new one to submit work.")
            if self._live + len(items) > self.max_queue:
                raise QueueFullError(
                    f"MicroBatcher {self.name!r} queue is full ({self._live} waiting, max_queue="
                    f"{self.max_queue}, {len(items)} more asked); retry later or raise max_queue."
                )
            for item, cost in zip(items, costs):
                entry: _Entry[T] = _Entry(priority, next(self._seq), item, Future(), cost, now)
                heapq.heappush(self._heap, entry)
                entries.append(entry)
            self._live += len(entries)
            self._ensure_worker()
            self._cond.notify()
        for entry in entries:
            entry.future.add_done_callback(lambda fut, e=entry: self._on_done(e, fut))
        return [entry.future for entry in entries]

    async def asubmit(self, item: T, *, priority: int = 0) -> R:
        """Queue one item and await its result without blocking the event loop.

        Cancelling the awaiting task cancels the queued item (it never runs).
        """
        return await asyncio.wrap_future(self.submit(item, priority=priority))

    def map(self, items: Iterable[T], *, priority: int = 0) -> list[R]:
        """Submit items and block until all results are in (first exception is raised)."""
        futures = self.submit_many(items, priority=priority)
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()

    async def amap(self, items: Iterable[T], *, priority: int = 0) -> list[R]:
        """Async :meth:`map`: cancelling the caller cancels every item not yet running."""
        futures = [asyncio.wrap_future(f) for f in self.submit_many(items, priority=priority)]
        try:
            return list(await asyncio.gather(*futures))
        finally:
            for future in futures:
                future.cancel()

    def _item_cost(self, item: T) -> int:
        """The cost of one item, computed on the caller's thread: a bad item fails its caller alone."""
        if self._cost is None:
            return 1
        try:
            cost = self._cost(item)
        except GPUPromptError:
            raise
        except Exception as exc:
            raise EngineError(f"MicroBatcher {self.name!r}: pricing an item failed: {exc!r}") from exc
        if isinstance(cost, bool) or not isinstance(cost, int):
            raise EngineError(f"MicroBatcher {self.name!r}: the cost function returned {describe(cost)}, not an int.")
        return cost

    def _on_done(self, entry: _Entry[T], future: Future) -> None:
        if not future.cancelled():
            return
        with self._cond:
            if not entry.taken and not entry.dropped:
                entry.dropped = True
                self._live -= 1
                self._cancelled += 1

    # ------------------------------------------------------------------ worker
    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name=f"gpuprompt-{self.name}", daemon=True)
            self._worker.start()

    def _oldest_live(self) -> _Entry[T] | None:
        while self._heap and (self._heap[0].dropped or self._heap[0].taken):
            heapq.heappop(self._heap)
        if not self._heap:
            return None
        return min((e for e in self._heap if not e.dropped), key=lambda e: e.enqueued_at, default=None)

    def _full(self) -> bool:
        if self._live >= self.max_batch_size:
            return True
        if self.max_batch_cost is None:
            return False
        total = sum(e.cost for e in self._heap if not e.dropped and not e.taken)
        return total >= self.max_batch_cost

    def _take(self) -> list[_Entry[T]]:
        batch: list[_Entry[T]] = []
        total = 0
        while self._heap and len(batch) < self.max_batch_size:
            head = self._heap[0]
            if head.dropped:
                heapq.heappop(self._heap)
                continue
            if self.max_batch_cost is not None and batch and total + head.cost > self.max_batch_cost:
                break
            heapq.heappop(self._heap)
            head.taken = True
            self._live -= 1
            total += head.cost
            batch.append(head)
        return batch

    def _run(self) -> None:
        # The worker must never die while the batcher is open: a dead worker hangs every later caller.
        while True:
            try:
                self._loop()
                return
            except BaseException:  # noqa: BLE001 - logged; the loop restarts with the state it left
                logger.exception("MicroBatcher %r worker loop error; continuing", self.name)
                if self._closed:
                    return

    def _loop(self) -> None:
        freed_at: float | None = None  # when the last batch ended; None while idle
        while True:
            idle = False
            with self._cond:
                while not self._closed:
                    if (
                        freed_at is not None
                        and self._live < self.min_batch_size
                        and self._max_wait > 0
                        and not self._full()
                    ):
                        # Opt-in (min_batch_size > 1): a worker that just finished a batch lets a
                        # short queue gather for up to max_wait. With the default it never waits.
                        remaining = freed_at + self._max_wait - time.perf_counter()
                        if remaining > 0:
                            self._cond.wait(remaining)
                            continue
                    if self._live > 0:
                        break
                    self._busy = False
                    if freed_at is not None and self._on_idle is not None:
                        idle = True  # work just ran out: the hook runs once, outside the lock
                        break
                    freed_at = None  # nothing queued: idle, the next item goes at once
                    self._cond.wait()
                if self._closed:
                    return
                batch = [] if idle else self._take()
                self._busy = bool(batch)
            if idle:
                freed_at = None
                self._idle()
                continue
            if not batch:
                continue
            try:
                self._dispatch(batch)
            except BaseException as exc:  # the worker must never die with futures pending
                logger.exception("MicroBatcher %r worker error", self.name)
                self._fail(batch, exc)
            freed_at = time.perf_counter()

    def _idle(self) -> None:
        assert self._on_idle is not None
        try:
            self._on_idle()
        except Exception:  # noqa: BLE001 - a failing hook never stops the worker
            logger.exception("MicroBatcher %r on_idle hook failed", self.name)

    def _dispatch(self, batch: list[_Entry[T]]) -> None:
        started = time.perf_counter()
        runnable = [e for e in batch if e.future.set_running_or_notify_cancel()]
        with self._cond:
            self._cancelled += len(batch) - len(runnable)
            for entry in runnable:
                self._waits.append(started - entry.enqueued_at)
            if runnable:
                self._dispatches += 1
                self._dispatched_items += len(runnable)
                self._max_seen = max(self._max_seen, len(runnable))
        if runnable:
            self._execute(runnable)

    def _execute(self, entries: list[_Entry[T]]) -> None:
        try:
            returned = self._fn([e.item for e in entries])
            try:
                results = list(returned)
            except TypeError as exc:
                raise EngineError(
                    f"MicroBatcher {self.name!r}: the batch function returned {describe(returned)}, not a sequence."
                ) from exc
            if len(results) != len(entries):
                raise EngineError(
                    f"MicroBatcher {self.name!r}: the batch function returned {len(results)} results "
                    f"for {len(entries)} items."
                )
        except self._fatal as exc:
            self._count_batch()
            self._fail(entries, exc)
            return
        except BaseException as exc:  # noqa: BLE001 - any failure of one batch must stay with its items
            self._count_batch()
            if self._isolate and len(entries) > 1:
                with self._cond:
                    self._splits += 1
                mid = len(entries) // 2
                self._execute(entries[:mid])
                self._execute(entries[mid:])
            else:
                self._fail(entries, exc)
            return
        self._count_batch()
        failed = 0
        for entry, result in zip(entries, results):
            if isinstance(result, BaseException):
                failed += 1
                entry.future.set_exception(result)
            else:
                entry.future.set_result(result)
        with self._cond:
            self._items += len(entries)
            self._failed += failed

    def _count_batch(self) -> None:
        with self._cond:
            self._batches += 1

    def _fail(self, entries: list[_Entry[T]], exc: BaseException) -> None:
        count = 0
        for entry in entries:
            if not entry.future.done():
                entry.future.set_exception(exc)
                count += 1
        with self._cond:
            self._items += count
            self._failed += count

    # ------------------------------------------------------------------ lifecycle
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def queue_depth(self) -> int:
        """Items waiting to be dispatched now."""
        return self._live

    def close(self, *, timeout: float | None = 10.0) -> None:
        """Stop accepting work, fail queued items with ``ClosedError``, let the running batch end.

        Args:
            timeout: seconds to wait for the running batch; None waits for ever.
        """
        timeout = check_number(timeout, "timeout", min=0, max=MAX_CLOSE_TIMEOUT_S, allow_none=True)
        with self._cond:
            if self._closed:
                pending: list[_Entry[T]] = []
            else:
                self._closed = True
                pending = [e for e in self._heap if not e.dropped and not e.taken]
                self._heap.clear()
                self._live = 0
            self._cond.notify_all()
        error = ClosedError(f"MicroBatcher {self.name!r} was closed before this request ran.")
        for entry in pending:
            if entry.future.set_running_or_notify_cancel():
                entry.future.set_exception(error)
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)

    def stats(self) -> BatcherStats:
        """Return a snapshot of the counters."""
        with self._cond:
            waits = list(self._waits)
            return BatcherStats(
                batches=self._batches,
                items=self._items,
                mean_batch_size=(self._dispatched_items / self._dispatches) if self._dispatches else 0.0,
                max_batch_size=self._max_seen,
                queue_wait_p50_ms=_percentile(waits, 0.50) * 1000.0,
                queue_wait_p95_ms=_percentile(waits, 0.95) * 1000.0,
                failed=self._failed,
                splits=self._splits,
                cancelled=self._cancelled,
                queue_depth=self._live,
            )

    def __enter__(self) -> MicroBatcher[T, R]:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
