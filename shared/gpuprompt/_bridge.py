"""The one sync-to-async bridge of gpuprompt: a long-lived background event loop.

Sync entry points that need the async core (``RAGPipeline.answer``, ``ChatGPUPrompt.batch``, an
engine call with a timeout, ...) hand their coroutine to this loop and block on the result. No
per-call threads or event loops: one daemon thread runs the loop for the life of the process.
The caller's context variables (tracing parents, configs) travel with the coroutine, and a caller
that stops waiting (timeout, KeyboardInterrupt) cancels it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["bridge_loop", "run_sync"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def bridge_loop() -> asyncio.AbstractEventLoop:
    """The background loop (started on first use; a daemon thread named ``gpuprompt-bridge``)."""
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=run, name="gpuprompt-bridge", daemon=True)
            thread.start()
            ready.wait()
            _loop, _thread = loop, thread
        return _loop


def run_sync(coroutine: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
    """Run ``coroutine`` on the background loop and block until it ends; return or raise its result.

    Works on any thread, whether or not that thread runs an event loop of its own (which is
    never used or blocked by the coroutine). Called from a coroutine already running on the
    bridge loop, it would wait on itself: then it runs the coroutine on a private loop instead.

    Args:
        coroutine: the work to run.
        timeout: most seconds to wait; then the coroutine is cancelled and ``TimeoutError`` raised.
    """
    loop = bridge_loop()
    if threading.current_thread() is _thread:
        return _run_private(coroutine, timeout)
    context = contextvars.copy_context()
    future: Future[T] = Future()

    def start() -> None:
        if not future.set_running_or_notify_cancel():
            coroutine.close()
            return
        task = context.run(loop.create_task, coroutine)

        def done(finished: asyncio.Task[T]) -> None:
            if finished.cancelled():
                if not future.done():
                    future.set_exception(asyncio.CancelledError())
                return
            error = finished.exception()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(finished.result())

        task.add_done_callback(done)
        tasks[0] = task

    tasks: list[asyncio.Task[T] | None] = [None]
    loop.call_soon_threadsafe(start)
    try:
        return future.result(timeout)
    except BaseException:
        # Timed out or interrupted: stop the work instead of leaving it running for nobody.
        if not future.cancel():
            loop.call_soon_threadsafe(_cancel, tasks)
        raise


def _run_private(coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
    # A sync call made from inside a coroutine on the bridge loop: the loop cannot wait on itself.
    context = contextvars.copy_context()
    outcome: Future[T] = Future()

    def runner() -> None:
        try:
            outcome.set_result(context.run(asyncio.run, asyncio.wait_for(coroutine, timeout)))
        except BaseException as exc:  # handed to the caller
            outcome.set_exception(exc)

    threading.Thread(target=runner, name="gpuprompt-bridge-nested", daemon=True).start()
    return outcome.result()


def _cancel(tasks: list[asyncio.Task[Any] | None]) -> None:
    task = tasks[0]
    if task is not None and not task.done():
        task.cancel()
