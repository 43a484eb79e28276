"""The one sync/async bridge of gpuprompt, both ways.

Sync to async (:func:`run_sync`): a long-lived background event loop.

Sync entry points that need the async core (``RAGPipeline.answer``, ``ChatGPUPrompt.batch``, an
engine call with a timeout, ...) hand their coroutine to this loop and block on the result. No
per-call threads or event loops: one daemon thread runs the loop for the life of the process.
The caller's context variables (tracing parents, configs) travel with the coroutine, and a caller
that stops waiting (timeout, KeyboardInterrupt) cancels it.

Async to blocking (:func:`off_loop`): blocking core work (index writes, saves, loads) awaited from
a coroutine runs in the loop's thread pool, and a cancelled caller never leaves it half done.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["bridge_loop", "off_loop", "run_sync"]

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


class _Gate:
    """Decides, once, whether a queued call runs or was cancelled before it started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = False
        self.cancelled = False

    def start(self) -> bool:
        with self._lock:
            self.started = not self.cancelled
            return self.started

    def cancel(self) -> bool:
        """Mark the call cancelled; True if it had not started (then it never will)."""
        with self._lock:
            self.cancelled = True
            return not self.started


async def off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` in the event loop's default thread pool and return its result.

    The loop keeps running while ``fn`` does (it may wait on the index's locks and do CPU work);
    context variables travel with the call, as with :func:`asyncio.to_thread`.

    Cancellation never leaves ``fn`` half-done behind the caller's back: a call that has not
    started yet is dropped and never runs; one that is running cannot be interrupted, so the
    cancellation waits (without blocking the loop) until it has finished. When ``CancelledError``
    reaches the caller, the call's effects are therefore complete, or absent.
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    gate = _Gate()

    def call() -> Any:
        if not gate.start():
            return None  # cancelled while queued: never run
        return context.run(fn, *args, **kwargs)

    future = loop.run_in_executor(None, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if not gate.cancel():
            while not future.done():
                try:
                    await asyncio.wait({future})
                except asyncio.CancelledError:
                    continue  # cancelled again: still wait, the call is running
        future.add_done_callback(_consume)
        raise


def _consume(future: asyncio.Future[Any]) -> None:
    """Mark the result of an abandoned call as seen (its caller was cancelled)."""
    if not future.cancelled():
        future.exception()
