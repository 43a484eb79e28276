"""One thread for the process's CPU tensor work (embedder forward passes, index searches and writes).

Why: torch on the CPU runs its parallel regions with OpenMP, and GNU OpenMP gives every thread
that starts one a team of its own. Once the process has more OpenMP threads than cores, it
throttles their spin-waits to almost nothing, so every parallel region pays futex wake-ups. One
index search on the index's worker thread (a second team beside the embedder's) slowed the
embedder by ~17% on 2 cores; a lone embedding took twice as long after the main thread had run
one matrix product. Running all of gpuprompt's CPU tensor work on this one thread keeps it to one
team. The work is serialised, which costs nothing here: on the CPU the batches would compete for
the same cores anyway, and each batch is short.

The transformers LLM backend keeps its own thread: one ``generate`` call lasts seconds and would
hold up every embedding behind it. CUDA work does not go through here (its kernels are
asynchronous and it uses no OpenMP teams).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["on_compute_thread", "run_on_compute_thread"]

T = TypeVar("T")

_jobs: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_start_lock = threading.Lock()


def _serve() -> None:
    while True:
        future, fn, args = _jobs.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # delivered to the caller; the thread serves on
            future.set_exception(exc)


def on_compute_thread() -> bool:
    """Whether the calling thread is the compute thread."""
    return _thread is not None and threading.current_thread() is _thread


def run_on_compute_thread(fn: Callable[..., T], *args: Any) -> T:
    """Call ``fn(*args)`` on the compute thread and return its result (or raise its exception).

    Called from the compute thread itself, ``fn`` runs at once (no deadlock on nested calls). The
    thread is a daemon started on first use; it never holds a lock of its own while ``fn`` runs.
    """
    global _thread
    if on_compute_thread():
        return fn(*args)
    if _thread is None:
        with _start_lock:
            if _thread is None:
                thread = threading.Thread(target=_serve, name="gpuprompt-cpu-compute", daemon=True)
                thread.start()
                _thread = thread
    future: Future = Future()
    _jobs.put((future, fn, args))
    return future.result()
