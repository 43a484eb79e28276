"""The CPU compute thread: results and errors reach the caller, nested calls run inline, and the
embedder's forward passes and the index's searches and writes on the CPU all run on it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gpuprompt import VectorIndex
from gpuprompt._compute import on_compute_thread, run_on_compute_thread

NAME = "gpuprompt-cpu-compute"


def test_results_errors_and_nested_calls() -> None:
    assert run_on_compute_thread(lambda a, b: a + b, 40, 2) == 42
    with pytest.raises(ValueError, match="bad item"):
        run_on_compute_thread(lambda: (_ for _ in ()).throw(ValueError("bad item")))
    # The thread serves on after an error, and a call made from it runs inline (no deadlock).
    inner = run_on_compute_thread(lambda: run_on_compute_thread(lambda: (threading.current_thread().name, on_compute_thread())))
    assert inner == (NAME, True)
    assert not on_compute_thread()


def test_concurrent_callers_get_their_own_results() -> None:
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: run_on_compute_thread(lambda: i * i), range(200)))
    assert results == [i * i for i in range(200)]


def test_cpu_embedder_forward_passes_run_on_the_compute_thread(embedder) -> None:
    seen: list[str] = []
    hook = embedder._model.register_forward_pre_hook(lambda *_: seen.append(threading.current_thread().name))
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: embedder.embed([f"compute thread check {i}"]), range(24)))
    finally:
        hook.remove()
    assert seen and set(seen) == {NAME}


def test_cpu_index_searches_and_writes_run_on_the_compute_thread() -> None:
    index = VectorIndex(16, backend="torch", device="cpu")
    seen: dict[str, set[str]] = {"search": set(), "write": set()}

    def spy(kind: str, fn):
        def run(*args):
            seen[kind].add(threading.current_thread().name)
            return fn(*args)

        return run

    index._run_batch = spy("search", index._run_batch)  # type: ignore[method-assign]
    index._upsert = spy("write", index._upsert)  # type: ignore[method-assign]
    index._delete = spy("write", index._delete)  # type: ignore[method-assign]
    vectors = np.random.default_rng(0).standard_normal((100, 16)).astype(np.float32)
    index.add([f"v{i}" for i in range(100)], vectors)
    with ThreadPoolExecutor(8) as pool:
        hits = list(pool.map(lambda i: index.search(vectors[i], 1)[0][0].id, range(32)))
    assert index.delete(["v0", "v1"]) == 2
    assert hits == [f"v{i}" for i in range(32)]
    assert seen == {"search": {NAME}, "write": {NAME}}
    index.close()
