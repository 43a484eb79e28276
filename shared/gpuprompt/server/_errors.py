"""The one place where errors become HTTP responses, with OpenAI-style error bodies.

Mapping::

    InvalidInputError (FilterError, ContextLengthError, ...)  -> 400 invalid_request_error
    ConfigurationError (a feature this deployment lacks)      -> 400 invalid_request_error
    request validation (pydantic)                             -> 422, the message names the field
    malformed JSON body                                       -> 400
    QueueFullError                                            -> 429 + Retry-After
    ClosedError, EngineDeadError                              -> 503
    any other error                                           -> 500 (details logged, not sent)
    ApiError (unknown model/collection 404, bad chat fields 400)  -> its own status

The gate middleware (``_gate.py``) answers before any handler runs: 401 (API key), 413 (body
size) and 429 + Retry-After (too many requests in flight), with the same error body.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    ContextLengthError,
    EngineDeadError,
    FilterError,
    GPUPromptError,
    InvalidInputError,
    QueueFullError,
)

__all__ = ["ApiError", "error_body", "error_response", "install_error_handlers", "validation_message"]

logger = logging.getLogger("gpuprompt.server")

_PARAM_RE = re.compile(r"^'([A-Za-z_][\w.\[\]]*)'")


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


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error envelope ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _param_of(message: str) -> str | None:
    # Core messages start with the quoted name of the argument at fault: 'name' must be ...
    match = _PARAM_RE.match(message)
    return match.group(1) if match else None


def _describe_error(exc: BaseException, retry_after_s: int) -> ApiError:
    """Translate any exception into the ApiError to send."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, QueueFullError):
        return ApiError(
            429,
            f"the server is busy: {exc}",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(retry_after_s)},
        )
    if isinstance(exc, (ClosedError, EngineDeadError)):
        return ApiError(503, f"the model is not available: {exc}", type="server_error", code="unavailable")
    if isinstance(exc, ContextLengthError):
        return ApiError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, FilterError):
        return ApiError(400, str(exc), param="filter", code="invalid_filter")
    if isinstance(exc, (InvalidInputError, ConfigurationError)):
        message = str(exc)
        return ApiError(400, message, param=_param_of(message), code="invalid_value")
    if isinstance(exc, GPUPromptError):
        logger.error("request failed: %r", exc)
        return ApiError(500, f"the model failed: {exc}", type="server_error", code=type(exc).__name__)
    logger.error("unexpected error while serving a request", exc_info=exc)
    return ApiError(500, "internal server error; the server log has the details.", type="server_error")


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


def _show(value: Any) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    kind = {dict: "an object", list: "a list", str: "a str", bool: "a bool", int: "an int", float: "a float"}
    return f"{text} that is {kind.get(type(value), 'a ' + type(value).__name__)}"


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None, bool]:
    """Render pydantic errors as one message naming each field.

    Returns:
        ``(message, param, malformed_json)``: ``param`` is the first field at fault;
        ``malformed_json`` is True when the body was not JSON at all (a 400, not a 422).
    """
    if not errors:
        return "the request is invalid.", None, False
    first = errors[0]
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        where = first.get("loc", ("body",))[-1]
        return (
            f"the request body is not valid JSON ({ctx.get('error', 'decode error')} at character {where}); "
            "send a JSON object with Content-Type: application/json.",
            None,
            True,
        )
    if tuple(first.get("loc", ())) == ("body",) and isinstance(first.get("input"), (bytes, str)):
        # FastAPI hands over the raw bytes when the Content-Type is not JSON.
        raw = first["input"]
        try:
            json.loads(raw)
            problem = "it was not sent as JSON"
        except ValueError as exc:
            problem = f"it is not valid JSON ({exc.msg} at character {exc.pos})"
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
        if error.get("type") == "missing":
            parts.append(f"'{path}' is required (got nothing).")
        elif path == "body" and error.get("type") in ("model_attributes_type", "dict_type"):
            parts.append(f"the request body must be a JSON object (got {_show(error.get('input'))}).")
        elif "input" in error and error.get("type") != "value_error":
            parts.append(f"'{path}': {msg} (got {_show(error['input'])}).")
        else:
            parts.append(f"'{path}': {msg}")
        if len(parts) == 5:
            break
    return " ".join(parts), _field_path(first.get("loc", ())), False


def install_error_handlers(app: FastAPI, retry_after_s: int) -> None:
    """Register the handlers that turn every error into an OpenAI-style body."""

    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, malformed = validation_message(exc.errors())
        if malformed:
            return JSONResponse(error_body(message, "invalid_request_error", None, "invalid_json"), 400)
        return JSONResponse(error_body(message, "invalid_request_error", param, "invalid_value"), 422)

    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see GET /docs for the API."
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}."
        else:
            message = str(exc.detail)
        return JSONResponse(
            error_body(message, "invalid_request_error", None, str(exc.status_code)),
            exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, retry_after_s)

    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http)  # type: ignore[arg-type]
    app.add_exception_handler(ApiError, on_error)
    app.add_exception_handler(GPUPromptError, on_error)
    app.add_exception_handler(Exception, on_error)
