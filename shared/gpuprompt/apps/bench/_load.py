"""The one way scenarios drive concurrent callers: threads or asyncio tasks, one call per input,
returning throughput, latency percentiles and the results in input order; and the callers' questions
(:func:`queries`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Load", "compare", "in_thread", "queries", "task_load", "thread_load"]

T = TypeVar("T")

_PRODUCTS = ["dress", "jeans", "sweater", "rain jacket", "sneakers", "scarf", "t-shirt", "chinos"]
_COLOURS = ["red", "navy", "olive", "black", "white", "mustard", "grey", "teal"]


def queries(n: int, salt: str = "") -> list[str]:
    """``n`` distinct short customer questions (deterministic; ``salt`` makes another distinct set)."""
    out = []
    for i in range(n):
        product, colour = _PRODUCTS[i % len(_PRODUCTS)], _COLOURS[(i // 8) % len(_COLOURS)]
        out.append(f"{salt}Does the {colour} {product} #{i} shrink after a 40 degree wash?")
    return out


@dataclass(frozen=True)
class Load:
    """What one burst of concurrent calls measured.

    Attributes:
        per_s: calls completed per second of wall time.
        p50_s: median latency of one call, in seconds.
        p95_s: 95th-percentile latency, in seconds.
        results: each call's return value, in input order.
    """

    per_s: float
    p50_s: float
    p95_s: float
    results: list[Any]


def _load(latencies: list[float], results: list[Any], wall: float) -> Load:
    ordered = sorted(latencies)
    p50 = ordered[len(ordered) // 2] if len(ordered) % 2 else sum(ordered[len(ordered) // 2 - 1 : len(ordered) // 2 + 1]) / 2
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return Load(per_s=len(latencies) / wall, p50_s=p50, p95_s=p95, results=results)


def thread_load(call: Callable[[T], Any], inputs: Sequence[T], threads: int) -> Load:
    """``threads`` threads, each calling ``call`` on one input at a time until all are done."""

    def one(item: T) -> tuple[float, Any]:
        started = time.perf_counter()
        result = call(item)
        return time.perf_counter() - started, result

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        done = list(pool.map(one, inputs))
    wall = time.perf_counter() - started
    return _load([seconds for seconds, _ in done], [result for _, result in done], wall)


def task_load(call: Callable[[T], Awaitable[Any]], inputs: Sequence[T], concurrency: int | None = None) -> Load:
    """asyncio tasks on a fresh event loop, at most ``concurrency`` (default: all) in flight."""

    async def burst() -> list[tuple[float, Any]]:
        gate = asyncio.Semaphore(concurrency or max(1, len(inputs)))

        async def one(item: T) -> tuple[float, Any]:
            async with gate:
                started = time.perf_counter()
                result = await call(item)
                return time.perf_counter() - started, result

        return list(await asyncio.gather(*(one(item) for item in inputs)))

    started = time.perf_counter()
    done = asyncio.run(burst())
    wall = time.perf_counter() - started
    return _load([seconds for seconds, _ in done], [result for _, result in done], wall)


def in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a short-lived thread of its own and return its result.

    The stock side's torch work goes through this. A thread that ran torch work keeps an OpenMP
    team, and on 2 cores that slowed torch in gpuprompt's long-lived worker threads by 15-30%
    for the rest of the process (measured for the embedder and the transformers engine). A thread
    that ends with the call leaves nothing behind; the stock's own speed is unchanged. In a real
    deployment only one of the two stacks is in the process.
    """
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def compare(stock: Load, ours: Load, unit: str = "answers_per_s") -> dict[str, float]:
    """The side-by-side figures of one run: both throughputs (named ``stock_<unit>`` /
    ``ours_<unit>``), both latency p50/p95, ``throughput_ratio`` (ours / stock, higher is better)
    and ``p95_ratio`` (ours / stock, lower is better)."""
    return {
        f"stock_{unit}": stock.per_s,
        f"ours_{unit}": ours.per_s,
        "throughput_ratio": ours.per_s / stock.per_s,
        "stock_p50_s": stock.p50_s,
        "ours_p50_s": ours.p50_s,
        "stock_p95_s": stock.p95_s,
        "ours_p95_s": ours.p95_s,
        "p95_ratio": ours.p95_s / stock.p95_s,
    }
