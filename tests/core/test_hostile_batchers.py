"""Hostile items against every batcher in the package: the caller gets a typed error, the shared
worker lives on, and every other caller is served.

Regression for: ``embed(["x"], priority="high")`` during a bulk embed killed the embedder's worker
(heap comparison TypeError), after which every call in the process hung; ``max_wait_ms=inf`` did the
same to the search worker.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gpuprompt import VectorIndex
from gpuprompt.batching import MicroBatcher
from gpuprompt.errors import ConfigurationError, EngineError, GPUPromptError, InvalidInputError

pytestmark = pytest.mark.timeout(120)

BAD_PRIORITIES = ["high", None, 1.5, float("nan"), float("inf"), 10**30, -(10**30), [1], True, b"1", object()]


class Boom(BaseException):
    """Not an Exception: what a KeyboardInterrupt-like escape from the batch function looks like."""


def _alive(batcher: MicroBatcher) -> None:
    assert batcher.submit(20).result(timeout=10) == 40


@pytest.mark.parametrize("priority", BAD_PRIORITIES, ids=repr)
def test_unorderable_priority_fails_its_caller_alone(priority: object) -> None:
    with MicroBatcher(lambda xs: [x * 2 for x in xs], name="double") as batcher:
        gate = threading.Event()
        slow = MicroBatcher(lambda xs: (gate.wait(5), [x for x in xs])[1], name="slow")
        try:
            pending = [slow.submit(i) for i in range(4)]  # a busy queue, as during a bulk embed
            with pytest.raises(InvalidInputError, match="'priority' must be an int"):
                slow.submit(99, priority=priority)  # type: ignore[arg-type]
            gate.set()
            assert [f.result(timeout=10) for f in pending] == [0, 1, 2, 3]
            assert slow.submit(7).result(timeout=10) == 7
        finally:
            slow.close()
        with pytest.raises(InvalidInputError):
            batcher.submit_many([1, 2], priority=priority)  # type: ignore[arg-type]
        assert batcher.queue_depth == 0
        _alive(batcher)


@pytest.mark.parametrize(
    "options",
    [
        {"max_wait_ms": float("inf")},
        {"max_wait_ms": float("nan")},
        {"max_wait_ms": -1},
        {"max_wait_ms": "5"},
        {"max_batch_size": 0},
        {"max_batch_size": True},
        {"max_batch_size": 2.0},
        {"max_queue": -3},
        {"max_batch_cost": 0, "cost": len},
    ],
    ids=repr,
)
def test_bad_options_are_refused_at_construction(options: dict) -> None:
    with pytest.raises(ConfigurationError):
        MicroBatcher(lambda xs: xs, **options)


def test_a_raising_cost_function_fails_that_caller_typed() -> None:
    def cost(item: object) -> int:
        return len(item)  # type: ignore[arg-type]

    with MicroBatcher(lambda xs: [len(x) for x in xs], cost=cost, max_batch_cost=100) as batcher:
        with pytest.raises(EngineError, match="pricing an item failed"):
            batcher.submit(3)
        assert batcher.submit("abc").result(timeout=10) == 3


@pytest.mark.parametrize(
    "result",
    [None, 5, "xx", [1, 2, 3], iter([])],
    ids=["None", "int", "str-of-wrong-length", "too-many", "iterator"],
)
def test_a_batch_function_returning_garbage_fails_typed_and_the_worker_lives(result: object) -> None:
    calls = {"n": 0}

    def fn(xs: list[int]) -> object:
        calls["n"] += 1
        if 13 in xs:
            return result
        return [x * 2 for x in xs]

    with MicroBatcher(fn, name="garbage") as batcher:
        with pytest.raises(EngineError):
            batcher.submit(13).result(timeout=10)
        _alive(batcher)


def test_a_base_exception_from_the_batch_function_fails_the_batch_and_the_worker_lives() -> None:
    def fn(xs: list[int]) -> list[int]:
        if 13 in xs:
            raise Boom()
        return [x * 2 for x in xs]

    with MicroBatcher(fn, name="boom") as batcher:
        with pytest.raises(Boom):
            batcher.submit(13).result(timeout=10)
        _alive(batcher)
        # Under concurrency too: the poisoned item fails alone, everyone else is served.
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(lambda i=i: batcher.submit(i).result(timeout=10)) for i in range(40)]
            outcomes = []
            for i, future in enumerate(futures):
                try:
                    outcomes.append(future.result())
                except Boom:
                    outcomes.append("boom")
        assert outcomes[13] == "boom"
        assert [o for i, o in enumerate(outcomes) if i != 13] == [2 * i for i in range(40) if i != 13]


def test_embedder_bad_priority_during_bulk_embed(embedder) -> None:
    texts = [f"bulk text number {i} about red dresses" for i in range(300)]
    with ThreadPoolExecutor(1) as pool:
        bulk = pool.submit(embedder.embed, texts)
        time.sleep(0.05)
        for priority in BAD_PRIORITIES:
            with pytest.raises(InvalidInputError, match="'priority'"):
                embedder.embed(["x"], priority=priority)
        vectors = bulk.result(timeout=120)
    assert vectors.shape == (300, embedder.dim)
    again = embedder.embed(["x"])
    assert again.shape == (1, embedder.dim) and np.isfinite(again).all()


async def test_embedder_async_bad_priority_leaves_the_worker_alive(embedder) -> None:
    with pytest.raises(InvalidInputError):
        await embedder.aembed(["x"], priority="high")  # type: ignore[arg-type]
    assert (await embedder.aembed(["x"])).shape == (1, embedder.dim)


@pytest.mark.parametrize("texts", [["ok", "bad \ud800 surrogate"], "abc", [b"bytes"], [None]], ids=repr)
def test_embedder_refuses_hostile_texts_typed(embedder, texts: object) -> None:
    with pytest.raises(InvalidInputError):
        embedder.embed(texts)  # type: ignore[arg-type]
    assert embedder.embed(["still fine"]).shape == (1, embedder.dim)


@pytest.mark.parametrize("max_wait_ms", [float("inf"), float("nan"), -1.0, "2"], ids=repr)
def test_index_refuses_a_wait_that_would_kill_its_search_worker(max_wait_ms: object) -> None:
    with pytest.raises(ConfigurationError, match="max_wait_ms"):
        VectorIndex(4, max_wait_ms=max_wait_ms)  # type: ignore[arg-type]


def test_index_search_worker_survives_hostile_queries_under_concurrency() -> None:
    rng = np.random.default_rng(0)
    index = VectorIndex(8, metric="cosine")
    vectors = rng.normal(size=(50, 8)).astype("float32")
    index.add([f"id{i}" for i in range(50)], vectors)
    bad_queries: list[object] = [
        np.full((1, 8), np.nan, dtype="float32"),
        np.zeros((1, 3), dtype="float32"),
        [["a"] * 8],
        [[1j] * 8],
        "query",
        None,
    ]
    errors: list[BaseException] = []

    def good(i: int) -> str:
        return index.search(vectors[i % 50 : i % 50 + 1], 1)[0][0].id

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(good, i) for i in range(200)]
        for query in bad_queries:
            try:
                index.search(query, 3)
            except GPUPromptError as exc:
                errors.append(exc)
        results = [f.result(timeout=60) for f in futures]
    assert len(errors) == len(bad_queries)
    assert results == [f"id{i % 50}" for i in range(200)]
    for k in (0, -1, True, 2.0, "3", None):
        with pytest.raises(InvalidInputError):
            index.search(vectors[:1], k)  # type: ignore[arg-type]
    assert len(index.search(vectors[:1], 10**30)[0]) == 50  # a huge k is a correct "all of them"
    assert index.search(vectors[:1], 1)[0][0].id == "id0"
    index.close()


@pytest.mark.parametrize(
    "fields",
    [
        {"priority": "high"},
        {"priority": 10**30},
        {"priority": math.nan},
        {"seed": 2**70},
        {"seed": -(2**70)},
        {"seed": 1.5},
        {"max_tokens": 0},
        {"max_tokens": 10**30},
        {"max_tokens": True},
        {"temperature": math.inf},
        {"stop": ["\udc80"]},
        {"messages": [{"role": "user", "content": "hi \ud800"}]},
    ],
    ids=repr,
)
def test_generation_request_refuses_values_the_engine_cannot_take(fields: dict) -> None:
    from gpuprompt.llm import GenerationRequest

    base = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    base.update(fields)
    with pytest.raises(InvalidInputError):
        GenerationRequest(**base)


def test_llm_worker_lives_after_hostile_requests(tf_engine) -> None:
    from gpuprompt.llm import GenerationRequest

    ok = GenerationRequest(messages=[{"role": "user", "content": "Say hi."}], max_tokens=3)
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(tf_engine.generate, [ok]) for _ in range(4)]
        for bad in ({"priority": "high"}, {"seed": 2**70}):
            with pytest.raises(InvalidInputError):
                tf_engine.generate([GenerationRequest(messages=ok.messages, max_tokens=3, **bad)])
        for garbage in ("not a request", ["not a request"], [None], ok):
            with pytest.raises(InvalidInputError):
                tf_engine.generate(garbage)  # type: ignore[arg-type]
        results = [r for f in futures for r in f.result(timeout=120)]
    assert all(r.usage.completion_tokens >= 1 for r in results)
    assert tf_engine.generate([ok])[0].usage.completion_tokens >= 1
