"""RemoteClient: the one HTTP client of remote mode (pooled, timeouts, retries, cancellable streams).

Sync calls use a pooled ``httpx.Client`` on the caller's thread. Async calls and every stream run
on one pooled ``httpx.AsyncClient`` that lives on the client's own event-loop thread, so any
caller's loop (the app's, the bridge's, a test's) can await it and none of them owns it.

Retries: only idempotent calls (embeddings, GETs) are retried, after a refused connection or a
429 / 502 / 503 / 504, with exponential backoff and jitter; a ``Retry-After`` header wins.
Generation is never retried here (the engine-level ``CallPolicy`` of the caller decides).

Cancellation: closing a stream (a sync generator's ``close()``, an async generator's ``aclose()``
or a cancelled task) cancels its request task, which closes the HTTP response; the server sees
the disconnect and aborts the generation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from gpuprompt.errors import ClosedError, DependencyError, EngineError
from gpuprompt.remote._config import RemoteConfig
from gpuprompt.wire import error_from_event, error_from_status, redact, transport_error

__all__ = ["RemoteClient", "shared_client"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

SERVICE = "gpuprompt serve"
"""What messages call the server."""
RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers after which an idempotent call is tried again."""
MAX_RETRY_DELAY_S = 30.0
"""The longest wait before a retry (a larger ``Retry-After`` is capped)."""
_CLOSE_TIMEOUT_S = 10.0
_EVENT, _ERROR, _END = "event", "error", "end"


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as exc:
        raise DependencyError("remote mode needs httpx: pip install 'gpuprompt[remote]' (or: pip install httpx)") \
            from exc
    return httpx


class RemoteClient:
    """Pooled sync and async HTTP access to one ``gpuprompt serve`` (or another OpenAI-compatible server).

    Use :func:`shared_client` to share one per server in a process. Nothing connects until the
    first call.

    Example:
        >>> client = shared_client(RemoteConfig(base_url="http://127.0.0.1:8000"))
        >>> client.request("GET", "/models")["data"][0]["id"]
        'HuggingFaceTB/SmolLM2-135M-Instruct'

    Args:
        config: the server and the timeouts, retries and pool size.
    """

    def __init__(self, config: RemoteConfig) -> None:
        if not isinstance(config, RemoteConfig):
            raise TypeError(f"'config' must be a RemoteConfig (got {type(config).__name__}).")
        self.config = config
        self.root = config.root
        self._lock = threading.Lock()
        self._client: Any = None
        self._aclient: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<RemoteClient {redact(self.root)!r}{' closed' if self._closed else ''}>"

    # ------------------------------------------------------------------ set-up
    def url(self, path: str) -> str:
        """The URL of an API path (``/embeddings`` -> ``<root>/embeddings``); ``/health`` and
        ``/metrics`` sit beside the ``/v1`` root."""
        if path in ("/health", "/metrics"):
            return self.root[: -len("/v1")] + path
        return self.root + path

    def _headers(self) -> dict[str, str]:
        from gpuprompt._version import __version__

        headers = {"Accept": "application/json", "User-Agent": f"gpuprompt-remote/{__version__}"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def _options(self, httpx: Any) -> dict[str, Any]:
        config = self.config
        return {
            "headers": self._headers(),
            "timeout": httpx.Timeout(config.read_timeout, connect=config.connect_timeout, pool=None),
            "limits": httpx.Limits(max_connections=config.max_connections,
                                   max_keepalive_connections=min(64, config.max_connections)),
        }

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the client of {redact(self.root)} was closed; create a new one.")

    def _sync_client(self) -> Any:
        self._check_open()
        if self._client is None:
            httpx = _httpx()
            with self._lock:
                self._check_open()
                if self._client is None:
                    self._client = httpx.Client(**self._options(httpx))
        return self._client

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        """The client's loop thread, with its ``httpx.AsyncClient`` (started on first use)."""
        self._check_open()
        loop = self._loop
        if loop is not None:
            return loop
        httpx = _httpx()
        with self._lock:
            self._check_open()
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_run_loop, args=(loop,), name="gpuprompt-remote", daemon=True)
                thread.start()

                async def make() -> Any:
                    return httpx.AsyncClient(**self._options(httpx))

                self._aclient = asyncio.run_coroutine_threadsafe(make(), loop).result(_CLOSE_TIMEOUT_S)
                self._thread, self._loop = thread, loop
            return self._loop

    # ------------------------------------------------------------------ bridging
    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the client's loop and block this thread until it ends (from any
        thread but the client's own). A caller that stops waiting (KeyboardInterrupt) cancels it."""
        try:
            loop = self._ensure_loop()
        except BaseException:
            coroutine.close()
            raise
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("RemoteClient.run() was called on the client's own loop thread; await instead.")
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` on the client's loop from any event loop; cancelling the awaiting
        task cancels it there."""
        try:
            loop = self._ensure_loop()
        except BaseException:
            coroutine.close()
            raise
        if asyncio.get_running_loop() is loop:
            return await coroutine
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))

    # ------------------------------------------------------------------ one-shot requests
    def _delay(self, attempt: int, headers: Any) -> float:
        retry_after = headers.get("retry-after") if headers is not None else None
        try:
            wanted = float(retry_after) if retry_after is not None else None
        except ValueError:
            wanted = None
        if wanted is not None and wanted >= 0:
            return min(wanted, MAX_RETRY_DELAY_S)
        # Full jitter between half and all of the exponential step: retries of many workers spread out.
        return min(self.config.backoff * 2**attempt * random.uniform(0.5, 1.0), MAX_RETRY_DELAY_S)

    def request(self, method: str, path: str, body: Any = None, *, idempotent: bool | None = None) -> Any:
        """One JSON request on this thread; returns the parsed JSON answer.

        Args:
            method: ``"GET"`` or ``"POST"``.
            path: an API path (``/embeddings``, ``/models``, ``/health``).
            body: the JSON body of a POST.
            idempotent: retry after a refused connection or 429/502/503/504 (default: GETs only).

        Raises:
            QueueFullError, InvalidInputError, EngineError, EngineDeadError, RequestTimeoutError:
                the server's answer or the transport's failure, typed (see ``_errors``).
        """
        httpx = _httpx()
        client = self._sync_client()
        url = self.url(path)
        retry = method == "GET" if idempotent is None else idempotent
        attempt = 0
        while True:
            try:
                reply = client.request(method, url, json=body)
            except httpx.HTTPError as exc:
                if retry and attempt < self.config.max_retries and _retry_transport(httpx, exc):
                    time.sleep(self._delay(attempt, None))
                    attempt += 1
                    continue
                raise transport_error(exc, url, service=SERVICE) from exc
            if reply.status_code < 300:
                return _json(reply.content, url)
            if retry and attempt < self.config.max_retries and reply.status_code in RETRY_STATUSES:
                time.sleep(self._delay(attempt, reply.headers))
                attempt += 1
                continue
            raise error_from_status(reply.status_code, reply.content, reply.headers, url, service=SERVICE)

    async def arequest(self, method: str, path: str, body: Any = None, *, idempotent: bool | None = None) -> Any:
        """Async :meth:`request`, from any event loop (the request runs on the client's loop)."""
        return await self.on_loop(self._arequest(method, path, body, idempotent))

    async def _arequest(self, method: str, path: str, body: Any, idempotent: bool | None) -> Any:
        httpx = _httpx()
        url = self.url(path)
        retry = method == "GET" if idempotent is None else idempotent
        attempt = 0
        while True:
            try:
                reply = await self._aclient.request(method, url, json=body)
            except httpx.HTTPError as exc:
                if retry and attempt < self.config.max_retries and _retry_transport(httpx, exc):
                    await asyncio.sleep(self._delay(attempt, None))
                    attempt += 1
                    continue
                raise transport_error(exc, url, service=SERVICE) from exc
            if reply.status_code < 300:
                return _json(reply.content, url)
            if retry and attempt < self.config.max_retries and reply.status_code in RETRY_STATUSES:
                await asyncio.sleep(self._delay(attempt, reply.headers))
                attempt += 1
                continue
            raise error_from_status(reply.status_code, reply.content, reply.headers, url, service=SERVICE)

    # ------------------------------------------------------------------ server-sent events
    async def _events(self, path: str, body: Any, headers: dict[str, str] | None) -> AsyncIterator[dict[str, Any]]:
        """The JSON events of a streamed POST, on the client's loop; ends at ``[DONE]``."""
        httpx = _httpx()
        url = self.url(path)
        try:
            async with self._aclient.stream("POST", url, json=body, headers=headers) as reply:
                if reply.status_code != 200:
                    raise error_from_status(reply.status_code, await reply.aread(), reply.headers, url,
                                            service=SERVICE)
                async for line in reply.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = _json(data, url)
                    if not isinstance(event, dict):
                        raise EngineError(f"{SERVICE} at {redact(url)} sent a stream event that is not a JSON "
                                          f"object: {data[:200]!r}")
                    if "error" in event and not event.get("choices"):
                        raise error_from_event(event, url, service=SERVICE)
                    yield event
        except httpx.HTTPError as exc:
            raise transport_error(exc, url, service=SERVICE) from exc
        raise EngineError(f"{SERVICE} at {redact(url)} ended the stream without [DONE]: the reply may be cut short; "
                          "retry it.")

    async def _pump(self, path: str, body: Any, headers: dict[str, str] | None,
                    emit: Callable[[str, Any], None]) -> None:
        """Forward a stream's events to a consumer on another thread or loop (on the client's loop)."""
        try:
            async for event in self._events(path, body, headers):
                emit(_EVENT, event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, who raises it
            emit(_ERROR, exc)
            return
        emit(_END, None)

    async def astream(self, path: str, body: Any, headers: dict[str, str] | None = None, *,
                      deadline: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Stream a POST's JSON events into any event loop.

        Closing the generator (or cancelling the consuming task) closes the response: the server
        aborts the request.

        Args:
            path: the API path (``/chat/completions``, ``/completions``).
            body: the JSON body (with ``"stream": true``).
            headers: extra request headers (``X-Session-ID``).
            deadline: a ``time.monotonic()`` instant after which the stream is closed and
                ``TimeoutError`` raised.

        Raises:
            TimeoutError: the deadline passed.
            The typed errors of :meth:`request`.
        """
        loop = self._ensure_loop()
        caller = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(kind: str, value: Any) -> None:
            try:
                caller.call_soon_threadsafe(events.put_nowait, (kind, value))
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                pass

        if caller is loop:
            task: Any = loop.create_task(self._pump(path, body, headers, emit))
        else:
            task = asyncio.run_coroutine_threadsafe(self._pump(path, body, headers, emit), loop)
        try:
            while True:
                if deadline is None:
                    kind, value = await events.get()
                else:
                    try:
                        kind, value = await asyncio.wait_for(events.get(), max(0.0, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        raise TimeoutError from None
                if kind == _EVENT:
                    yield value
                elif kind == _ERROR:
                    raise value
                else:
                    return
        finally:
            task.cancel()

    def stream(self, path: str, body: Any, headers: dict[str, str] | None = None, *,
               deadline: float | None = None) -> Iterator[dict[str, Any]]:
        """Sync :meth:`astream`: works on any thread (but the client's own) and needs no event
        loop; ``close()`` on the generator closes the response."""
        loop = self._ensure_loop()
        if threading.current_thread() is self._thread:
            raise RuntimeError("RemoteClient.stream() was called on the client's own loop thread; use astream().")
        events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        future = asyncio.run_coroutine_threadsafe(
            self._pump(path, body, headers, lambda kind, value: events.put((kind, value))), loop
        )
        return self._iterate(events, future, deadline)

    @staticmethod
    def _iterate(events: queue.SimpleQueue[tuple[str, Any]], future: Any, deadline: float | None) -> Iterator[Any]:
        try:
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                try:
                    if remaining is not None and remaining <= 0:
                        raise queue.Empty
                    kind, value = events.get(timeout=remaining)
                except queue.Empty:
                    raise TimeoutError from None
                if kind == _EVENT:
                    yield value
                elif kind == _ERROR:
                    raise value
                else:
                    return
        finally:
            future.cancel()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Close both pools and stop the loop thread; open streams are closed. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            client, aclient, loop, thread = self._client, self._aclient, self._loop, self._thread
            self._client = self._aclient = self._loop = self._thread = None
        if client is not None:
            client.close()
        if loop is not None and not loop.is_closed():

            async def shutdown() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                if tasks:
                    await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT_S)
                if aclient is not None:
                    await aclient.aclose()

            try:
                asyncio.run_coroutine_threadsafe(shutdown(), loop).result(_CLOSE_TIMEOUT_S * 2)
            except Exception:  # closing must go on
                logger.exception("error while closing the remote client of %s", redact(self.root))
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None and thread is not threading.current_thread():
                thread.join(_CLOSE_TIMEOUT_S)
            if not loop.is_running():
                loop.close()


_shared: dict[RemoteConfig, RemoteClient] = {}
_shared_lock = threading.Lock()


def shared_client(config: RemoteConfig) -> RemoteClient:
    """The process's one :class:`RemoteClient` for ``config`` (equal configs share one pool)."""
    with _shared_lock:
        client = _shared.get(config)
        if client is None or client._closed:
            client = _shared[config] = RemoteClient(config)
        return client


def _retry_transport(httpx: Any, exc: Exception) -> bool:
    # Refused or never opened: the request did not reach the server. A keep-alive connection the
    # server had closed fails the same way (RemoteProtocolError before any answer).
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError))


def _json(content: bytes | str, url: str) -> Any:
    try:
        return json.loads(content)
    except ValueError as exc:
        text = content if isinstance(content, str) else content[:200].decode("utf-8", "replace")
        raise EngineError(f"{SERVICE} at {redact(url)} did not answer JSON ({text[:200]!r}); is base_url the "
                          "server's address?") from exc


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()
