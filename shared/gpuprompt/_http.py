"""HttpClient: the one HTTP client of gpuprompt (pooled, timeouts, retries, cancellable streams).

Remote mode's :class:`~gpuprompt.remote.RemoteClient` and the engine's OpenAI-HTTP backend (a
vLLM fleet) are both one of these.

Sync calls use a pooled ``httpx.Client`` on the caller's thread (or, when the client was given an
async transport such as ``httpx.ASGITransport(app)``, the async pool on the client's loop). Async calls and every stream run
on one pooled ``httpx.AsyncClient`` that lives on the client's own event-loop thread, so any
caller's loop (the app's, the bridge's, a test's) can await it and none of them owns it.

Retries: idempotent calls (embeddings, GETs) are retried after a refused connection or a
429 / 502 / 503 / 504, with exponential backoff and jitter; a ``Retry-After`` header wins. Any
other call is retried after a 429 only: the server refused it before doing anything (the
admission gate, or a full queue before the work began), so a retry cannot apply it twice.
Generation is never retried here (the engine-level ``CallPolicy`` of the caller decides).

Fork: a process forked from one that used a client (gunicorn ``--preload``, celery prefork,
``multiprocessing`` with ``fork``) gets fresh pools in the child on its first call; the parent's
connections are never shared, so no process reads another's answers. (A ``transport`` given to the
client is the caller's and is kept: an ``httpx.HTTPTransport`` passed in holds its own pool, which a
child would share.)

Cancellation: closing a stream (a sync generator's ``close()``, an async generator's ``aclose()``
or a cancelled task) cancels its request task, which closes the HTTP response; the server sees
the disconnect and aborts the generation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import random
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from gpuprompt._version import __version__
from gpuprompt.bridge import LoopThread
from gpuprompt.errors import ClosedError, ConfigurationError, DependencyError, EngineError
from gpuprompt.wire import (
    DETOKENIZE,
    HEALTH,
    METRICS,
    RETRY_STATUSES,
    TOKENIZE,
    error_from_event,
    error_from_status,
    redact,
    transport_error,
)

__all__ = ["HttpClient"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

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


_LIVE: weakref.WeakSet[HttpClient] = weakref.WeakSet()
_INHERITED: list[Any] = []


def _retryable(status: int, idempotent: bool) -> bool:
    """Whether an answer of ``status`` may be retried: a 429 always (refused before any work), the
    other :data:`RETRY_STATUSES` for idempotent calls only."""
    return status == 429 or (idempotent and status in RETRY_STATUSES)


def _reset_after_fork() -> None:
    for client in list(_LIVE):
        client._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class HttpClient:
    """Pooled sync and async HTTP access to one server's API root.

    Nothing connects until the first call. Every request honours the timeouts: ``read_timeout``
    is the most seconds between two pieces of an answer, so a server that accepts a connection
    and never answers fails the call with ``RequestTimeoutError`` after that long (a timed-out
    call is never retried: the server may still be working on it).

    Args:
        root: the API root (``http://host:port/v1``); paths are appended to it.
        api_key: sent as ``Authorization: Bearer ...``; None for none.
        connect_timeout: most seconds to open a connection (a refused one fails at once).
        read_timeout: most seconds between two pieces of an answer.
        max_retries: further attempts of an idempotent call after a refused connection or
            429 / 502 / 503 / 504, and of any call after a 429 (refused before any work).
        backoff: seconds before the first retry, doubled for each further one (with jitter).
        max_connections: most open connections of the pool.
        service: what messages call the server.
        transport: an ``httpx`` transport to send requests through instead of the network, such as
            ``httpx.ASGITransport(app)`` for an app in this process (an async transport serves
            sync calls too, through the client's loop).
        name: the loop thread's name.
    """

    def __init__(
        self,
        root: str,
        *,
        api_key: str | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_retries: int = 0,
        backoff: float = 0.25,
        max_connections: int = 256,
        service: str = "the server",
        transport: Any = None,
        name: str = "gpuprompt-http",
    ) -> None:
        self.root = root.rstrip("/")
        self.api_key = api_key
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_connections = max_connections
        self.service = service
        self._transport = transport
        self._async_transport = transport is not None and hasattr(transport, "handle_async_request") \
            and not hasattr(transport, "handle_request")
        if transport is not None and not (hasattr(transport, "handle_async_request")
                                          or hasattr(transport, "handle_request")):
            raise ConfigurationError(f"'transport' must be an httpx transport (got a {type(transport).__name__}).")
        self._name = name
        self._lock = threading.Lock()
        self._client: Any = None
        self._aclient: Any = None
        self._loop = LoopThread(name)
        self._closed = False
        _LIVE.add(self)

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's pools and loop thread (their sockets are the
        parent's too); the next call builds this process's own. The old pools are kept referenced,
        never closed or collected here, so nothing is sent on the parent's connections."""
        _INHERITED.append((self._client, self._aclient, self._loop))
        self._lock = threading.Lock()
        self._client = self._aclient = None
        self._loop = LoopThread(self._name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {redact(self.root)!r}{' closed' if self._closed else ''}>"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def loop_thread(self) -> LoopThread:
        """The client's event-loop thread (where async calls and streams run)."""
        return self._loop

    # ------------------------------------------------------------------ set-up
    def url(self, path: str) -> str:
        """The URL of an API path (``/embeddings`` -> ``<root>/embeddings``); ``/health``,
        ``/metrics``, ``/tokenize`` and ``/detokenize`` sit beside the ``/v1`` root."""
        if path in (HEALTH, METRICS, TOKENIZE, DETOKENIZE) and self.root.endswith("/v1"):
            return self.root[: -len("/v1")] + path
        return self.root + path

    def headers(self) -> dict[str, str]:
        """The headers of every request (accept JSON, user agent, the key)."""
        headers = {"Accept": "application/json", "User-Agent": f"gpuprompt/{__version__}"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def timeout(self, read: float | None = None) -> Any:
        """The ``httpx.Timeout`` of a request (``read`` overrides :attr:`read_timeout`)."""
        return _httpx().Timeout(self.read_timeout if read is None else read, connect=self.connect_timeout, pool=None)

    def _options(self, httpx: Any) -> dict[str, Any]:
        return {
            "headers": self.headers(),
            "timeout": self.timeout(),
            "limits": httpx.Limits(max_connections=self.max_connections,
                                   max_keepalive_connections=min(64, self.max_connections)),
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
                    options = self._options(httpx)
                    if self._transport is not None:
                        options["transport"] = self._transport
                    self._client = httpx.Client(**options)
        return self._client

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        """The client's loop thread, with its ``httpx.AsyncClient`` (started on first use)."""
        self._check_open()
        if self._aclient is not None and self._loop.running:
            return self._loop.start()
        httpx = _httpx()
        with self._lock:
            self._check_open()
            loop = self._loop.start()
            if self._aclient is None:

                async def make() -> Any:
                    options = self._options(httpx)
                    if self._transport is not None:
                        options["transport"] = self._transport
                    return httpx.AsyncClient(**options)

                self._aclient = asyncio.run_coroutine_threadsafe(make(), loop).result(_CLOSE_TIMEOUT_S)
            return loop

    @property
    def aclient(self) -> Any:
        """The pooled ``httpx.AsyncClient`` (use it on :attr:`loop_thread` only)."""
        self._ensure_loop()
        return self._aclient

    # ------------------------------------------------------------------ bridging
    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the client's loop and block this thread until it ends (from any
        thread but the client's own). A caller that stops waiting (KeyboardInterrupt) cancels it."""
        try:
            self._ensure_loop()
        except BaseException:
            coroutine.close()
            raise
        return self._loop.run(coroutine)

    async def on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` on the client's loop from any event loop; cancelling the awaiting
        task cancels it there."""
        try:
            self._ensure_loop()
        except BaseException:
            coroutine.close()
            raise
        return await self._loop.run_async(coroutine)

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
        return min(self.backoff * 2**attempt * random.uniform(0.5, 1.0), MAX_RETRY_DELAY_S)

    def request(self, method: str, path: str, body: Any = None, *, idempotent: bool | None = None,
                timeout: float | None = None) -> Any:
        """One JSON request on this thread; returns the parsed JSON answer.

        Args:
            method: ``"GET"``, ``"POST"`` or ``"DELETE"``.
            path: an API path (``/embeddings``, ``/models``, ``/health``).
            body: the JSON body of a POST.
            idempotent: retry after a refused connection or 429/502/503/504 (default: GETs only);
                any call is retried after a 429 (nothing was done).
            timeout: the read timeout of this request (default :attr:`read_timeout`).

        Raises:
            QueueFullError, InvalidInputError, EngineError, EngineDeadError, RequestTimeoutError:
                the server's answer or the transport's failure, typed (see :mod:`gpuprompt.wire`).
        """
        if self._async_transport:
            return self.run(self._arequest(method, path, body, idempotent, timeout))
        httpx = _httpx()
        client = self._sync_client()
        url = self.url(path)
        retry = method == "GET" if idempotent is None else idempotent
        attempt = 0
        while True:
            try:
                reply = client.request(method, url, json=body, timeout=self.timeout(timeout))
            except httpx.HTTPError as exc:
                if retry and attempt < self.max_retries and _retry_transport(httpx, exc):
                    time.sleep(self._delay(attempt, None))
                    attempt += 1
                    continue
                raise transport_error(exc, url, service=self.service) from exc
            if reply.status_code < 300:
                return _json(reply.content, url, self.service)
            if attempt < self.max_retries and _retryable(reply.status_code, retry):
                time.sleep(self._delay(attempt, reply.headers))
                attempt += 1
                continue
            raise error_from_status(reply.status_code, reply.content, reply.headers, url, service=self.service)

    async def arequest(self, method: str, path: str, body: Any = None, *, idempotent: bool | None = None,
                       timeout: float | None = None) -> Any:
        """Async :meth:`request`, from any event loop (the request runs on the client's loop)."""
        return await self.on_loop(self._arequest(method, path, body, idempotent, timeout))

    async def _arequest(self, method: str, path: str, body: Any, idempotent: bool | None,
                        timeout: float | None = None) -> Any:
        httpx = _httpx()
        url = self.url(path)
        retry = method == "GET" if idempotent is None else idempotent
        attempt = 0
        while True:
            try:
                reply = await self._aclient.request(method, url, json=body, timeout=self.timeout(timeout))
            except httpx.HTTPError as exc:
                if retry and attempt < self.max_retries and _retry_transport(httpx, exc):
                    await asyncio.sleep(self._delay(attempt, None))
                    attempt += 1
                    continue
                raise transport_error(exc, url, service=self.service) from exc
            if reply.status_code < 300:
                return _json(reply.content, url, self.service)
            if attempt < self.max_retries and _retryable(reply.status_code, retry):
                await asyncio.sleep(self._delay(attempt, reply.headers))
                attempt += 1
                continue
            raise error_from_status(reply.status_code, reply.content, reply.headers, url, service=self.service)

    # ------------------------------------------------------------------ server-sent events
    async def events(self, path: str, body: Any, headers: dict[str, str] | None = None,
                     *, on_open: Callable[[], None] | None = None,
                     read_timeout: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """The JSON events of a streamed POST, on the client's loop; ends at ``[DONE]``.

        Args:
            path: the API path.
            body: the JSON body (with ``"stream": true``).
            headers: extra request headers.
            on_open: called once the answer's status line (200) arrived.
            read_timeout: most seconds between two events (default :attr:`read_timeout`).

        Raises:
            EngineError: the stream ended without ``[DONE]`` or sent something that is not JSON.
            The typed errors of :meth:`request` (an error event inside the stream included).
        """
        httpx = _httpx()
        url = self.url(path)
        service = self.service
        try:
            async with self._aclient.stream("POST", url, json=body, headers=headers,
                                            timeout=self.timeout(read_timeout)) as reply:
                if reply.status_code != 200:
                    raise error_from_status(reply.status_code, await reply.aread(), reply.headers, url,
                                            service=service)
                if on_open is not None:
                    on_open()
                async for line in reply.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = _json(data, url, service)
                    if not isinstance(event, dict):
                        raise EngineError(f"{service} at {redact(url)} sent a stream event that is not a JSON "
                                          f"object: {data[:200]!r}")
                    if "error" in event and not event.get("choices"):
                        raise error_from_event(event, url, service=service)
                    yield event
        except httpx.HTTPError as exc:
            raise transport_error(exc, url, service=service) from exc
        raise EngineError(f"{service} at {redact(url)} ended the stream without [DONE]: the reply may be cut short; "
                          "retry it.")

    async def _pump(self, path: str, body: Any, headers: dict[str, str] | None,
                    emit: Callable[[str, Any], None], read_timeout: float | None = None) -> None:
        """Forward a stream's events to a consumer on another thread or loop (on the client's loop)."""
        try:
            async for event in self.events(path, body, headers, read_timeout=read_timeout):
                emit(_EVENT, event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, who raises it
            emit(_ERROR, exc)
            return
        emit(_END, None)

    async def astream(self, path: str, body: Any, headers: dict[str, str] | None = None, *,
                      deadline: float | None = None, read_timeout: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Stream a POST's JSON events into any event loop.

        Closing the generator (or cancelling the consuming task) closes the response: the server
        aborts the request.

        Args:
            path: the API path (``/chat/completions``, ``/completions``).
            body: the JSON body (with ``"stream": true``).
            headers: extra request headers (``X-Session-ID``).
            deadline: a ``time.monotonic()`` instant after which the stream is closed and
                ``TimeoutError`` raised.
            read_timeout: most seconds between two events (default :attr:`read_timeout`).

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
            task: Any = loop.create_task(self._pump(path, body, headers, emit, read_timeout))
        else:
            task = asyncio.run_coroutine_threadsafe(self._pump(path, body, headers, emit, read_timeout), loop)
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
               deadline: float | None = None, read_timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Sync :meth:`astream`: works on any thread (but the client's own) and needs no event
        loop; ``close()`` on the generator closes the response."""
        loop = self._ensure_loop()
        if self._loop.in_loop_thread():
            raise RuntimeError("HttpClient.stream() was called on the client's own loop thread; use astream().")
        events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        future = asyncio.run_coroutine_threadsafe(
            self._pump(path, body, headers, lambda kind, value: events.put((kind, value)), read_timeout), loop
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
            client, aclient = self._client, self._aclient
            self._client = self._aclient = None
        if client is not None:
            client.close()

        async def close_pool() -> None:
            if aclient is not None:
                await aclient.aclose()

        self._loop.stop(close_pool, timeout=_CLOSE_TIMEOUT_S)


def _retry_transport(httpx: Any, exc: Exception) -> bool:
    # Refused or never opened: the request did not reach the server. A keep-alive connection the
    # server had closed fails the same way (RemoteProtocolError before any answer).
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError))


def _json(content: bytes | str, url: str, service: str) -> Any:
    try:
        return json.loads(content)
    except ValueError as exc:
        text = content if isinstance(content, str) else content[:200].decode("utf-8", "replace")
        raise EngineError(f"{service} at {redact(url)} did not answer JSON ({text[:200]!r}); is base_url the "
                          "server's address?") from exc
