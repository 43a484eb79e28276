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

__all__ = ["LoopThread", "bridge_loop", "off_loop", "run_sync"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

_CLOSE_TIMEOUT_S = 30.0


class LoopThread:
    """One private event loop on a daemon thread, started on first use and stopped once.

    Every private loop of gpuprompt is one of these: the bridge's (:func:`run_sync`), the remote
    HTTP client's, and the vLLM and OpenAI-HTTP engine backends'. Any thread may hand it work;
    :meth:`stop` cancels what still runs there, awaits it (bounded), runs a last clean-up
    coroutine, then stops and joins the thread.

    Example:
        >>> loop = LoopThread("gpuprompt-example")
        >>> async def answer() -> int:
        ...     return 42
        >>> loop.run(answer())
        42
        >>> loop.stop()

    Args:
        name: the thread's name (``gpuprompt-...``).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running" if self.running else "not started"
        return f"<LoopThread {self.name!r} {state}>"

    @property
    def running(self) -> bool:
        """Whether the thread runs its loop now."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self._loop is not None and not self._loop.is_closed()

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread (None before the start)."""
        return self._thread

    def in_loop_thread(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def start(self) -> asyncio.AbstractEventLoop:
        """The running loop, started now if needed (also again after its thread died).

        Raises:
            RuntimeError: the loop was stopped (create a new LoopThread).
        """
        loop = self._loop
        if loop is not None and self.running:
            return loop
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"the event loop {self.name!r} was stopped")
            if self._loop is None or not self.running:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(target=_run_forever, args=(loop, ready), name=self.name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            assert self._loop is not None
            return self._loop

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Schedule ``fn(*args)`` on the loop from any thread; False when the loop is gone."""
        loop = self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:  # the loop is closed
            return False

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Start ``coroutine`` on the loop (started if needed); its concurrent future."""
        try:
            loop = self.start()
        except BaseException:
            coroutine.close()
            raise
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coroutine`` on the loop and block until it ends (from any thread but the loop's).

        A caller that stops waiting (a timeout, KeyboardInterrupt) cancels the coroutine.

        Raises:
            RuntimeError: called on the loop's own thread (await the coroutine instead).
            TimeoutError: ``timeout`` passed; the coroutine was cancelled.
        """
        if self.in_loop_thread():
            coroutine.close()
            raise RuntimeError(f"LoopThread.run() was called on {self.name!r}'s own thread; await instead.")
        future = self.submit(coroutine)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    async def run_async(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` on the loop from any event loop; cancelling the awaiting task cancels it there."""
        try:
            loop = self.start()
        except BaseException:
            coroutine.close()
            raise
        if asyncio.get_running_loop() is loop:
            return await coroutine
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))

    def stop(self, cleanup: Callable[[], Coroutine[Any, Any, None]] | None = None, *,
             timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Cancel every task on the loop and await them (at most ``timeout`` s), await ``cleanup()``,
        then stop the loop and join its thread. Safe to call twice; never raises."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            loop, thread = self._loop, self._thread
        if loop is None or loop.is_closed():
            return

        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)
            if cleanup is not None:
                await cleanup()

        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            try:
                asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout * 2)
            except Exception:  # stopping must go on
                logger.exception("error while stopping the event loop %s", self.name)
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:
            pass
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if not loop.is_running() and not loop.is_closed():
            loop.close()


def _run_forever(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    try:
        loop.run_forever()
    finally:
        try:  # tasks still pending when the loop stopped: cancel them, so none warns at exit
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        except Exception:  # best effort at teardown
            pass


_BRIDGE = LoopThread("gpuprompt-bridge")


def bridge_loop() -> asyncio.AbstractEventLoop:
    """The background loop (started on first use; a daemon thread named ``gpuprompt-bridge``)."""
    return _BRIDGE.start()


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
    if _BRIDGE.in_loop_thread():
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
