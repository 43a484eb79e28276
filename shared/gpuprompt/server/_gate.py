"""The ASGI gate in front of every route: API key (401), body size (413), admission (429), HTTP metrics.

It runs before FastAPI parses anything, so a refused request costs no JSON parsing and no model
time. The body is read here under the size limit (whatever Content-Length says, and also for
chunked bodies) and replayed to the app.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gpuprompt.server._metrics import Metrics
from gpuprompt.server.errors import error_body

__all__ = ["Gate"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_OPEN_PATHS = frozenset({"/health"})
# Reading (and dropping) this much of an oversized body before answering lets the client see
# the 413 instead of a reset connection; beyond it the connection is simply closed after the 413.
_DRAIN_LIMIT = 4 * 1024 * 1024


class Gate:
    """Pure ASGI middleware: auth, body limit, admission control and HTTP metrics.

    Args:
        app: the wrapped ASGI app.
        api_key: the required key, or None for no auth.
        max_body_bytes: the largest body accepted.
        max_in_flight: most concurrent ``POST`` requests (every model route, ``/v1/...`` and the
            unversioned ``/rerank``, ``/v2/rerank``, ``/score``, ``/tokenize``, ``/detokenize``).
        retry_after_s: the ``Retry-After`` of a 429.
        metrics: where HTTP counters go.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        max_body_bytes: int,
        max_in_flight: int,
        retry_after_s: int,
        metrics: Metrics,
    ) -> None:
        self.app = app
        self._key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self._handle(scope, receive, send_tracked)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or ("refused" if status["code"] in (401, 413, 429) else "unmatched")
            self.metrics.http_requests.labels(scope["method"], label, str(status["code"])).inc()
            self.metrics.http_latency.labels(label).observe(time.perf_counter() - started)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if self._key is not None and path not in _OPEN_PATHS and not self._authorized(scope):
            self.metrics.rejected.labels("unauthorized").inc()
            await _reply(
                send,
                401,
                "missing or wrong API key; send 'Authorization: Bearer <key>' (the key the server was started "
                "with via --api-key or $GPUPROMPT_API_KEY).",
                "authentication_error",
                "invalid_api_key",
                {"WWW-Authenticate": "Bearer"},
            )
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self._read_body(scope, receive, send)
            if body is None:
                return
            receive = _replay(body, receive)
        if scope["method"] == "POST":  # every model route, /v1/... and the unversioned ones (/rerank, /score, ...)
            if self.in_flight >= self.max_in_flight:
                self.metrics.rejected.labels("overloaded").inc()
                await _reply(
                    send,
                    429,
                    f"the server is at its limit of {self.max_in_flight} concurrent model requests; retry after "
                    f"{self.retry_after_s} s.",
                    "rate_limit_error",
                    "too_many_requests",
                    {"Retry-After": str(self.retry_after_s)},
                )
                return
            self.in_flight += 1
            self.metrics.http_in_flight.inc()
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_flight -= 1
                self.metrics.http_in_flight.dec()
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        assert self._key is not None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key):
                    return True
            elif name in (b"api-key", b"x-api-key") and hmac.compare_digest(value.strip(), self._key):
                return True
        return False

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None after answering 413 (or when the client went away)."""
        limit = self.max_body_bytes
        declared: int | None = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _reply(send, 400, f"bad Content-Length header {value.decode(errors='replace')!r}.",
                                 "invalid_request_error", "invalid_header")
                    return None
        chunks: list[bytes] = []
        size = 0
        dropped = 0  # bytes read after the body was known to be too big
        too_big = declared is not None and declared > limit
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if too_big:
                dropped += len(chunk)
            elif size > limit:
                too_big = True
                chunks.clear()
            else:
                chunks.append(chunk)
            if not message.get("more_body", False) or dropped > _DRAIN_LIMIT:
                break
        if too_big:
            self.metrics.rejected.labels("body_too_large").inc()
            got = declared if declared is not None and declared > size else size
            await _reply(
                send,
                413,
                f"the request body must be at most {limit} bytes (got {got} bytes); send fewer or shorter items "
                "per request, or start the server with a larger --max-body-bytes.",
                "invalid_request_error",
                "request_too_large",
            )
            return None
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        # After the body, the real channel: it reports the client's disconnect.
        return await receive()

    return replay


async def _reply(
    send: Send, status: int, message: str, type: str, code: str, headers: dict[str, str] | None = None
) -> None:
    payload = json.dumps(error_body(message, type, None, code)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw.extend((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
