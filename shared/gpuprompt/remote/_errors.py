"""HTTP answers and transport failures as gpuprompt's typed errors: the one mapping for every client.

``gpuprompt serve`` turns each core error into a status and an OpenAI error body
(``gpuprompt/server/_errors.py``); :func:`error_from_status` inverts it, so a caller in remote mode
catches the same exceptions as in process::

    status  error.code / error.type                 raised here
    400     context_length_exceeded                 ContextLengthError (prompt_tokens, max_context read
                                                    back from the message)
    400     unsupported_parameter                   UnsupportedFeatureError (field = error.param)
    400     invalid_filter                          FilterError (path read back from the message)
    400     dimension_mismatch / embedder_mismatch  DimensionMismatchError / EmbedderMismatchError
    400/413/422, 409                                InvalidInputError (the request; nothing was stored)
    401/403                                         EngineError naming api_key / GPUPROMPT_API_KEY
    404                                             EngineError naming base_url and the served models
    408/504                                         RequestTimeoutError
    429                                             QueueFullError(retry_after = the Retry-After header)
    503     unavailable                             EngineDeadError (the server's engine died or closed)
    500     a core class name (EngineError,         that class (EngineError when unknown)
            RequestTimeoutError, ModelLoadError,
            DeviceOutOfMemoryError, ...)
    other                                           EngineError
    no answer: connect refused / timed out          EngineDeadError (nothing is listening there)
    no answer: read / write / pool timeout          RequestTimeoutError
    no answer: connection dropped, bad stream       EngineError

401/403 stay ``EngineError`` (not ``ConfigurationError``): the same mapping serves the server's own
remote LLM backend, where a refused key is the server's configuration, never its caller's 400.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpuprompt.errors import (
    ContextLengthError,
    DependencyError,
    DeviceOutOfMemoryError,
    DimensionMismatchError,
    EmbedderMismatchError,
    EngineDeadError,
    EngineError,
    FilterError,
    GPUPromptError,
    InvalidInputError,
    ModelLoadError,
    QualityError,
    QueueFullError,
    RequestTimeoutError,
    SessionStoreError,
    SnapshotError,
    UnsupportedFeatureError,
    VectorStoreError,
)

__all__ = ["api_root", "error_from_event", "error_from_status", "redact", "transport_error"]

# The core errors the server sends as 500 with their class name as the code (the others have a
# status of their own, see the table above).
_SERVER_ERRORS: dict[str, type[GPUPromptError]] = {
    cls.__name__: cls
    for cls in (EngineError, EngineDeadError, RequestTimeoutError, ModelLoadError, QualityError, DependencyError,
                DeviceOutOfMemoryError, SessionStoreError, SnapshotError, VectorStoreError)
}
_CONTEXT_RE = re.compile(r"has (\d+) tokens but the context window of .*? is (\d+) tokens", re.DOTALL)
_FILTER_PATH_RE = re.compile(r"\s*\(at filter path ([^)]*)\)\s*$")


def api_root(base_url: str) -> str:
    """The ``/v1`` root of a server given as ``http://host:port`` or ``http://host:port/v1``."""
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else f"{root}/v1"


def redact(url: str) -> str:
    """``url`` without credentials (``http://user:token@host`` -> ``http://host``), for messages."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rsplit('@', 1)[-1]}{slash}{path}"


def error_from_status(status: int, body: Any, headers: Any = None, url: str = "", *,
                      service: str = "the LLM server") -> Exception:
    """The typed error for an HTTP error answer (OpenAI envelope ``{"error": {...}}`` or text).

    Args:
        status: the HTTP status.
        body: the answer's body (bytes, text or parsed JSON).
        headers: the answer's headers (for ``Retry-After``), or None.
        url: where the request went (credentials are redacted in the message).
        service: what to call the server in the message.

    Returns:
        The exception to raise (see the module's table).
    """
    message, code, param = _parse(body)
    where = f"{service} at {redact(url)}" if url else service
    text = f"{where} answered {status}: {message}"
    if status == 429:
        retry_after = _retry_after(headers)
        suffix = f" (retry after {retry_after:g} s)" if retry_after is not None else ""
        return QueueFullError(text + suffix, retry_after=retry_after)
    if status in (400, 409, 413, 422):
        if code == "context_length_exceeded":
            found = _CONTEXT_RE.search(message)
            tokens, window = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
            return ContextLengthError(text, prompt_tokens=tokens, max_context=window)
        if code == "unsupported_parameter":
            return UnsupportedFeatureError(text, field=param, backend="remote")
        if code == "dimension_mismatch":
            return DimensionMismatchError(text)
        if code == "embedder_mismatch":
            return EmbedderMismatchError(text)
        if code == "invalid_filter":
            found = _FILTER_PATH_RE.search(text)
            return FilterError(text[: found.start()] if found else text, path=found.group(1) if found else "$")
        return InvalidInputError(text)
    if status in (401, 403):
        # The server's configuration or the caller's key, never a client error of the server's own caller.
        return EngineError(f"{text}; pass that server's key as api_key= (GPUPROMPT_API_KEY; for gpuprompt serve "
                           "--llm-api-key / GPUPROMPT_LLM_API_KEY).")
    if status == 404:
        return EngineError(f"{text}; check base_url (the server's API root) and the model it serves.")
    if status in (408, 504):
        return RequestTimeoutError(text)
    if status == 503 and code == "unavailable":
        return EngineDeadError(text)
    if status == 503 and code in ("SessionStoreError", "VectorStoreError"):  # the server's storage is out
        return _SERVER_ERRORS[code](text)
    if status == 500 and isinstance(code, str) and code in _SERVER_ERRORS:
        return _SERVER_ERRORS[code](text)
    return EngineError(text)


def error_from_event(event: Any, url: str = "", *, service: str = "the LLM server") -> Exception:
    """The typed error for an error sent inside a stream (``data: {"error": {...}}``), whose status
    line (200) was already sent: the status is read back from the error's ``type`` and ``code``."""
    error = event.get("error") if isinstance(event, dict) else None
    error = error if isinstance(error, dict) else {}
    code, kind = error.get("code"), error.get("type")
    if isinstance(code, int):
        status = code
    elif kind == "rate_limit_error" or code == "queue_full":
        status = 429
    elif code in ("unavailable", "SessionStoreError", "VectorStoreError"):
        status = 503
    elif kind == "invalid_request_error":
        status = 400
    else:
        status = 500
    return error_from_status(status, event, None, url, service=service)


def transport_error(exc: Exception, url: str, *, service: str = "the server") -> Exception:
    """The typed error for a request that got no (complete) HTTP answer (an ``httpx`` exception)."""
    import httpx

    where = f"{service} at {redact(url)}"
    name = type(exc).__name__
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return EngineDeadError(
            f"could not connect to {where} ({name}); start it (gpuprompt serve) or fix base_url / GPUPROMPT_URL."
        )
    if isinstance(exc, httpx.TimeoutException):
        return RequestTimeoutError(
            f"{where} did not answer in time ({name}); the request was abandoned. Raise read_timeout, or check "
            "the server's load."
        )
    return EngineError(f"{where} failed: {name}: {_short(str(exc))}; the reply may be cut short, retry it.")


def _short(text: str) -> str:
    return text if len(text) <= 300 else text[:297] + "..."


def _parse(body: Any) -> tuple[str, Any, str | None]:
    """``(message, code, param)`` of an error body."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return body.strip()[:1000] or "(no message)", None, None
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            message = str(error.get("message") or error.get("detail") or error)[:2000]
            param = error.get("param")
            return message, error.get("code"), param if isinstance(param, str) else None
        if isinstance(body.get("detail"), (str, list)):
            return str(body["detail"])[:2000], None, None
        return str(error)[:2000], None, None
    return str(body)[:1000], None, None


def _retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after") if headers is not None else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None
