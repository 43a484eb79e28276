"""The one place where errors become HTTP responses, with OpenAI-style error bodies.

Mapping (every body is ``{"error": {"message", "type", "param", "code"}}``)::

    request validation (pydantic), any field       -> 400 invalid_request_error, code invalid_value,
                                                      param = the field's path (OpenAI and vLLM answer
                                                      400 here, not FastAPI's 422)
    malformed JSON body, or not sent as JSON       -> 400 invalid_request_error, code invalid_json
    InvalidInputError, ConfigurationError          -> 400 invalid_request_error, code invalid_value
                                                      (dimension_mismatch, embedder_mismatch for those),
                                                      param from the message's leading 'name'
      FilterError                                  -> 400, param "filter", code invalid_filter
      UnsupportedFeatureError                      -> 400, param = its .field (a sampling field or
                                                      constraint the backend cannot honour), code
                                                      unsupported_parameter
      ContextLengthError                           -> 400, param "messages", code context_length_exceeded
    QueueFullError                                 -> 429 rate_limit_error + Retry-After, code queue_full
    ClosedError, EngineDeadError                   -> 503 server_error, code unavailable
    SessionStoreError, VectorStoreError            -> 503 server_error + Retry-After, code = the class name
                                                      (Redis / Milvus down or stalled: an outage, not a bug)
    other GPUPromptError (EngineError, ...)        -> 500 server_error, code = the class name
    any other exception                            -> 500 server_error (details logged, not sent)
    ApiError                                       -> its own status: 404 unknown model/collection/route,
                                                      400 refused fields (code unsupported_parameter), 409 collection limits

Every one of these keeps the client's keep-alive connection open: handled errors are answered by
their handlers, and :class:`CatchAll` answers any exception that escapes the routes with a JSON
500 instead of letting it reach uvicorn (which would close the connection). Only a failure after
a response has started (a stream) still ends the connection, since the response cannot be
completed.

The gate middleware (``_gate.py``) answers before any handler runs: 401 (API key), 413 (body
size) and 429 + Retry-After (too many requests in flight), with the same error body.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuprompt.errors import ContextLengthError, GPUPromptError
from gpuprompt.wire import describe_error, param_of

__all__ = [
    "ApiError",
    "CatchAll",
    "context_length_error",
    "error_body",
    "error_response",
    "install_error_handlers",
    "validation_message",
]

logger = logging.getLogger("gpuprompt.server")

# Core checks run by the schemas name their argument '$'; the renderer puts the field's path there.
_CHECK_NAME_RE = re.compile(r"'\$(?=['.\[ ])")
_PARSE_ERROR = "There was an error parsing the body"  # FastAPI's detail for a body json.loads refused

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ApiError(Exception):
    """An HTTP error raised by the server itself (not by the core).

    Args:
        status: the HTTP status.
        message: what was wrong, what was got, how to fix it.
        type: the OpenAI error type (``invalid_request_error``, ``authentication_error``, ...).
        param: the request field at fault, if any.
        code: a short machine-readable code.
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})


def _clean(text: str | None) -> str | None:
    # Messages quote the request (a field path may hold a JSON key with a lone surrogate): escape
    # what UTF-8 cannot encode, or rendering the error response would itself fail.
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error envelope ``{"error": {"message", "type", "param", "code"}}`` (always UTF-8 safe)."""
    return {"error": {"message": _clean(message), "type": type, "param": _clean(param), "code": code}}


def context_length_error(exc: ContextLengthError, param: str = "messages") -> ApiError:
    """A prompt past the window, told in the server's terms: the library's own message offers
    ``truncate='left'`` and ``max_model_len=``, which an HTTP client cannot pass."""
    return ApiError(
        400,
        f"the prompt has {exc.prompt_tokens} tokens but the context window of the served model is "
        f"{exc.max_context} tokens (the prompt may take at most {exc.max_context - 1}, leaving room for one new token); shorten the "
        "prompt (drop the oldest turns), or start the server with a larger --max-model-len.",
        param=param,
        code="context_length_exceeded",
    )


def _describe_error(exc: BaseException, retry_after_s: int) -> ApiError:
    """Translate any exception into the ApiError to send (core errors by the wire's one table)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextLengthError):
        return context_length_error(exc)
    if not isinstance(exc, GPUPromptError):
        logger.error("unexpected error while serving a request", exc_info=exc)
        return ApiError(500, "internal server error; the server log has the details.", type="server_error")
    wire = describe_error(exc)
    if wire.status == 503 and wire.retry:
        logger.warning("a storage backend failed: %s", exc)
    elif wire.status == 500:
        logger.error("request failed: %r", exc)
    return ApiError(wire.status, wire.message, type=wire.type, param=wire.param, code=wire.code,
                    headers={"Retry-After": str(retry_after_s)} if wire.retry else None)


def error_response(exc: BaseException, retry_after_s: int = 1) -> JSONResponse:
    """The JSON response for ``exc`` (any exception), OpenAI-style."""
    err = _describe_error(exc, retry_after_s)
    return JSONResponse(error_body(err.message, err.type, err.param, err.code), err.status, headers=err.headers)


def error_event(exc: BaseException, retry_after_s: int = 1) -> dict[str, Any]:
    """The error body to send as an SSE event when a stream fails after it started."""
    err = _describe_error(exc, retry_after_s)
    return error_body(err.message, err.type, err.param, err.code)


def _field_path(loc: Sequence[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            # pydantic names union members (str, list[...], function-after[...]) in the path
            if "[" in str(part) or str(part) in ("str", "int", "float", "bool", "dict", "list"):
                continue
            path += ("." if path else "") + str(part)
    return path or "body"


def _preview(value: Any, depth: int = 0) -> str:
    """A short JSON-like rendering; bounded in depth and width, so hostile input cannot blow it up."""
    if isinstance(value, str):
        return repr(value[:80])
    if value is None or isinstance(value, (bool, float)):
        return json.dumps(value)
    if isinstance(value, int):
        # str() of an int past 4300 digits raises; such a value is only described by its size.
        return str(value) if value.bit_length() < 256 else f"an int of {value.bit_length()} bits"
    if isinstance(value, Mapping):
        if depth >= 2:
            return "{...}"
        items = [f"{json.dumps(str(k)[:40])}: {_preview(v, depth + 1)}" for k, v in list(value.items())[:4]]
        return "{" + ", ".join(items) + (", ..." if len(value) > 4 else "") + "}"
    if isinstance(value, (list, tuple)):
        if depth >= 2:
            return "[...]"
        items = [_preview(v, depth + 1) for v in value[:4]]
        return "[" + ", ".join(items) + (", ..." if len(value) > 4 else "") + "]"
    return type(value).__name__


def _show(value: Any) -> str:
    text = _preview(value)
    if len(text) > 80:
        text = text[:77] + "..."
    kind = {dict: "an object", list: "a list", str: "a str", bool: "a bool", int: "an int", float: "a float"}
    return f"{text} that is {kind.get(type(value), 'a ' + type(value).__name__)}"


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None, bool]:
    """Render pydantic errors as one message naming each field.

    Returns:
        ``(message, param, malformed_json)``: ``param`` is the first field at fault;
        ``malformed_json`` is True when the body was not JSON at all.
    """
    if not errors:
        return "the request is invalid.", None, False
    first = errors[0]
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        loc = tuple(first.get("loc") or ())  # FastAPI: ("body", offset); model_validate_json: ()
        where = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
        return (
            (
                f"the request body is not valid JSON ({ctx.get('error', 'decode error')}{where}); "
                "send a JSON object with Content-Type: application/json."
            ),
            None,
            True,
        )
    if (
        tuple(first.get("loc", ())) == ("body",)
        and isinstance(first.get("input"), (bytes, str))
        and first.get("type") != "string_unicode"
    ):
        # FastAPI hands over the raw bytes when the Content-Type is not JSON.
        raw = first["input"]
        try:
            json.loads(raw)
            problem = "it was not sent as JSON"
        except json.JSONDecodeError as exc:
            problem = f"it is not valid JSON ({exc.msg} at character {exc.pos})"
        except (ValueError, RecursionError) as exc:  # not UTF-8, nested too deep, a huge int
            problem = f"it is not readable JSON ({type(exc).__name__})"
        return (
            f"the request body must be a JSON object sent with Content-Type: application/json, but {problem}.",
            None,
            True,
        )
    seen: set[str] = set()
    parts: list[str] = []
    for error in errors:
        path = _field_path(error.get("loc", ()))
        if path in seen:
            continue  # one line per field, even when several union members failed
        seen.add(path)
        msg = str(error.get("msg", "is invalid")).removeprefix("Value error, ")
        if error.get("type") == "string_unicode":
            # pydantic could not read a str (or a key) holding a lone surrogate, e.g. from "\ud800".
            where = "the request body" if path == "body" else f"'{path}'"
            parts.append(
                f"{where} must hold valid Unicode text only (got a lone surrogate in {_show(error.get('input'))}); "
                "JSON escapes \\ud800-\\udfff must come in valid pairs."
            )
        elif error.get("type") == "value_error" and msg.startswith("'$"):
            # A core check's message: name the field where the check named its argument '$'.
            parts.append(_CHECK_NAME_RE.sub(lambda _, field=path: f"'{field}", msg))
        elif error.get("type") == "value_error" and path == "body" and param_of(msg):
            parts.append(msg)  # a check across fields names its field itself: 'ids' must hold ...
        elif error.get("type") == "missing":
            parts.append(f"'{path}' is required (got nothing).")
        elif path == "body" and error.get("type") in ("model_attributes_type", "dict_type"):
            parts.append(f"the request body must be a JSON object (got {_show(error.get('input'))}).")
        elif "input" in error and error.get("type") != "value_error":
            parts.append(f"'{path}': {msg} (got {_show(error['input'])}).")
        else:
            parts.append(f"'{path}': {msg}")
        if len(parts) == 5:
            break
    param = _field_path(first.get("loc", ()))
    if param == "body" and first.get("type") == "value_error":
        param = param_of(str(first.get("msg", "")).removeprefix("Value error, ")) or param
    return " ".join(parts), param, False


def install_error_handlers(app: FastAPI, retry_after_s: int) -> None:
    """Register the handlers that turn every error into an OpenAI-style body."""

    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, malformed = validation_message(exc.errors())
        if malformed:
            return JSONResponse(error_body(message, "invalid_request_error", None, "invalid_json"), 400)
        return JSONResponse(error_body(message, "invalid_request_error", param, "invalid_value"), 400)

    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = str(exc.status_code)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see GET /docs for the API."
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}."
        elif exc.status_code == 400 and exc.detail == _PARSE_ERROR:
            # json.loads refused the body for a reason other than syntax: nesting past the
            # recursion limit, an int of more than 4300 digits, or bytes that are not UTF-8.
            cause = exc.__cause__
            why = f"{type(cause).__name__}: {cause}" if cause is not None else "unreadable"
            message = (
                f"the request body could not be read as JSON ({why[:200]}); send UTF-8 JSON without "
                "extreme nesting or numbers of thousands of digits."
            )
            code = "invalid_json"
        else:
            message = str(exc.detail)
        return JSONResponse(
            error_body(message, "invalid_request_error", None, code),
            exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, retry_after_s)

    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http)  # type: ignore[arg-type]
    app.add_exception_handler(ApiError, on_error)
    app.add_exception_handler(GPUPromptError, on_error)
    # No handler for Exception: Starlette would run it in ServerErrorMiddleware, which re-raises
    # after answering, and uvicorn then closes the connection. CatchAll answers instead.


class CatchAll:
    """Pure ASGI middleware: any exception that escapes the app becomes a JSON 500 (or the mapped
    status of a core error), and the connection stays open for the client's next request.

    Starlette's own last-resort handler re-raises after answering so that servers can log it; uvicorn
    then closes the keep-alive connection of the client, which costs it a reconnect after every
    server bug. Here the exception is logged and swallowed once a complete response is sent. A
    failure after the response started (mid-stream) cannot be answered: it is re-raised, and the
    connection ends, which is the only honest signal left.

    Args:
        app: the wrapped ASGI app.
        retry_after_s: the ``Retry-After`` of a 429 produced by a core error.
    """

    def __init__(self, app: ASGIApp, *, retry_after_s: int = 1) -> None:
        self.app = app
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as exc:
            if started:
                raise
            response = error_response(exc, self.retry_after_s)
            await response(scope, receive, send)
