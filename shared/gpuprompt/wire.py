"""The HTTP contract of ``gpuprompt serve``, written once and imported by both sides of the wire:
the server (:mod:`gpuprompt.server`) and every client of it (:mod:`gpuprompt.remote`, the engine's
OpenAI-HTTP backend).

What it holds::

    paths          the routes under the ``/v1`` root (and /health, /metrics beside it)
    headers        X-Session-ID (a conversation's affinity), the API-key headers, Retry-After
    limits         items per request, id and name lengths, the token cap
    sampling       the OpenAI / vLLM body fields of a GenerationRequest, with the defaults at which
                   each may be left out (one table: the engine, the server and the clients read it)
    vectors        float32 rows as base64 of their little-endian bytes, both ways
    errors         core error -> (status, type, code, param) for the server, and its inverse for
                   clients, so a caller in remote mode catches the same exceptions as in process

The error table, both ways::
    ``gpuprompt serve`` turns each core error into a status and an OpenAI error body
    (``gpuprompt/server/errors.py``); :func:`error_from_status` inverts it, so a caller in remote mode
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

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
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
    StorageError,
    UnsupportedFeatureError,
    VectorStoreError,
)
from gpuprompt.llm._types import MAX_STOP_TOKEN_IDS, MAX_TOKENS_LIMIT
from gpuprompt.validation import check_json

if TYPE_CHECKING:
    from gpuprompt.llm._types import GenerationRequest

__all__ = [
    "API_KEY_HEADERS",
    "CACHE",
    "CACHE_CLEAR",
    "CACHE_LOOKUP",
    "CACHE_UPDATE",
    "CHAT_COMPLETIONS",
    "COLLECTIONS",
    "COLLECTION_NAME_PATTERN",
    "COMPLETIONS",
    "DETOKENIZE",
    "EMBEDDINGS",
    "EXTRA_SAMPLING",
    "HEALTH",
    "MAX_ANSWER_BYTES",
    "MAX_DOCUMENTS_PER_REQUEST",
    "MAX_EMBEDDING_INPUTS",
    "MAX_IDS_PER_REQUEST",
    "MAX_RECORDS_PER_REQUEST",
    "MAX_RECORD_ID_LENGTH",
    "MAX_RERANK_DOCUMENTS",
    "MAX_SEARCHES_PER_REQUEST",
    "MAX_STOP_TOKEN_IDS",
    "MAX_TOKENS_LIMIT",
    "MAX_TURNS_PER_REQUEST",
    "METRICS",
    "MODELS",
    "RERANK",
    "RETRY_STATUSES",
    "SCORE",
    "SESSIONS",
    "SESSION_HEADER",
    "TOKENIZE",
    "V1",
    "WireError",
    "api_root",
    "check_answer",
    "collection_path",
    "decode_vectors",
    "describe_error",
    "encode_vectors",
    "error_from_event",
    "error_from_status",
    "guided_body",
    "redact",
    "request_body",
    "sampling_body",
    "transport_error",
    "wire_stop_reason",
]

# ---------------------------------------------------------------------------------------- paths
MODELS = "/models"
EMBEDDINGS = "/embeddings"
CHAT_COMPLETIONS = "/chat/completions"
COMPLETIONS = "/completions"
RERANK = "/rerank"
SCORE = "/score"
HEALTH = "/health"
"""Beside the ``/v1`` root, as :data:`METRICS`."""
TOKENIZE = "/tokenize"
"""vLLM's tokenizer route, beside the ``/v1`` root (as :data:`DETOKENIZE`)."""
DETOKENIZE = "/detokenize"
METRICS = "/metrics"
V1 = "/v1"
"""The server's API root: every path here sits below it (but :data:`HEALTH` and :data:`METRICS`)."""
SESSIONS = "/sessions"
"""``/sessions`` and ``/sessions/{id}/turns|window`` (the id percent-encoded as one segment)."""
CACHE = "/cache"
CACHE_LOOKUP = "/cache/lookup"
CACHE_UPDATE = "/cache/update"
CACHE_CLEAR = "/cache/clear"
COLLECTIONS = "/collections"
"""``/collections/{name}/...``: documents, query and chat (the server embeds), records (the client does)."""
COLLECTION_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""Collection names: 1-64 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or digit."""


def collection_path(name: str, *parts: str) -> str:
    """``/collections/{name}/...`` (``name`` must match :data:`COLLECTION_NAME_PATTERN`: nothing to escape)."""
    return "/".join((COLLECTIONS, name, *parts))


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


# ---------------------------------------------------------------------------------------- headers
SESSION_HEADER = "X-Session-ID"
"""Carries ``GenerationRequest.session_id``: the server passes it to its engine and on to a fleet,
whose router (vllm-router ``consistent_hash``) keeps a conversation on one replica."""
API_KEY_HEADERS = ("authorization", "api-key", "x-api-key")
"""Where a client may send the server's key (``Authorization: Bearer KEY`` or the bare key)."""
RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers after which an idempotent call may be tried again."""

# ---------------------------------------------------------------------------------------- limits
MAX_EMBEDDING_INPUTS = 2048
"""Most texts per ``/v1/embeddings`` request; clients split more."""
MAX_DOCUMENTS_PER_REQUEST = 2048
"""Most documents per collection upsert."""
MAX_RECORDS_PER_REQUEST = 2048
"""Most records (vectors) per collection upsert; clients split bigger adds."""
MAX_IDS_PER_REQUEST = 100_000
"""Most ids per get or delete request; clients split more."""
MAX_SEARCHES_PER_REQUEST = 1024
"""Most searches (each one or more query vectors) per search request."""
MAX_RECORD_ID_LENGTH = 4096
"""Longest record id (Milvus's limit, so one id works with either index)."""
MAX_RERANK_DOCUMENTS = 1000
"""Most documents per rerank request (and pairs per score request); clients split more."""
MAX_TURNS_PER_REQUEST = 2048
"""Most turns appended to a session in one request."""
MAX_ANSWER_BYTES = 1024 * 1024
"""Largest cached answer (``/v1/cache``), as compact UTF-8 JSON (far above any one model reply; it
bounds the server cache's memory)."""
MAX_BODY_BYTES = 16 * 1024 * 1024
"""The server's default body limit (``--max-body-bytes``); clients aim well under it."""



def check_answer(value: Any, name: str) -> Any:
    """Return a detached JSON copy of ``value`` if it can be cached remotely: JSON other than null
    (a null would read back as a miss), nested at most 32 deep, at most :data:`MAX_ANSWER_BYTES`
    as compact JSON. The one rule of both ends: this client and the server's ``/v1/cache/update``.

    Raises:
        InvalidInputError: anything else (the message names the part at fault).
    """
    answer = check_json(value, name)
    if answer is None:
        raise InvalidInputError(f"'{name}' must be a JSON value other than null (got None): a cached null would "
                                "read back as a miss; cache a value such as {\"answer\": null} instead.")
    size = len(json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > MAX_ANSWER_BYTES:
        raise InvalidInputError(f"'{name}' must be at most {MAX_ANSWER_BYTES} bytes as JSON (got {size} bytes); "
                                "cache a shorter answer or a reference to it.")
    return answer


# ---------------------------------------------------------------------------------------- sampling
EXTRA_SAMPLING: dict[str, Any] = {
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "stop_token_ids": (),
    "min_tokens": 0,
    "ignore_eos": False,
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,
}
"""The sampling fields beyond temperature and top_p, each with the value at which it is off: the
engine refuses any other value on a backend that cannot honour it, the server reads them from the
body, and clients send them only when set."""
GUIDED_FIELDS = {"json": "response_format", "json_object": "response_format", "regex": "guided_regex",
                 "choice": "guided_choice"}
"""The request field that asks for each kind of guided decoding."""


def sampling_body(request: GenerationRequest) -> dict[str, Any]:
    """The sampling fields of ``request`` as OpenAI / vLLM body fields (those off are left out)."""
    body: dict[str, Any] = {"temperature": request.temperature, "top_p": request.top_p}
    if request.seed is not None:
        body["seed"] = request.seed
    if request.priority:
        body["priority"] = request.priority
    for name, default in EXTRA_SAMPLING.items():
        value = getattr(request, name)
        if name == "logit_bias":
            if value:
                body[name] = {str(token): bias for token, bias in value.items()}
        elif name == "stop_token_ids":
            if value:
                body[name] = list(value)
        elif value != default:
            body[name] = value
    return body


def wire_stop_reason(value: Any) -> int | str | None:
    """A choice's ``stop_reason`` as a server sent it (vLLM's and gpuprompt's: the stop token id
    or stop string that ended the reply), or None for anything else."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


def guided_body(guided: Mapping[str, Any] | None, *, structured_outputs: bool = False) -> dict[str, Any]:
    """A guided-decoding constraint as body fields: ``response_format`` for JSON (or vLLM's
    ``guided_json`` with ``structured_outputs``), ``guided_regex``, ``guided_choice``.

    Args:
        guided: ``{"json": schema}``, ``{"json_object": True}``, ``{"regex": ...}`` or ``{"choice": [...]}``.
        structured_outputs: also send vLLM 0.32's ``structured_outputs`` (compact JSON, as in
            process) and the schema as ``guided_json``: for a raw-prompt ``/v1/completions`` call,
            which takes no ``response_format`` schema. Each server ignores the other's fields.
    """
    if guided is None:
        return {}
    body: dict[str, Any] = {}
    if structured_outputs:
        body["structured_outputs"] = {**guided, "disable_any_whitespace": True}
    if "json" in guided:
        if structured_outputs:
            body["guided_json"] = guided["json"]
        else:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "response",
                                                                              "schema": dict(guided["json"])}}
    elif "json_object" in guided:
        body["response_format"] = {"type": "json_object"}
    elif "regex" in guided:
        body["guided_regex"] = guided["regex"]
    elif "choice" in guided:
        body["guided_choice"] = list(guided["choice"])
    return body


def _chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A checked core message (``GenerationRequest.messages``) in OpenAI's shape."""
    out: dict[str, Any] = {"role": message["role"], "content": message["content"]}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [call.to_openai() for call in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def request_body(request: GenerationRequest, model: str | None = None) -> tuple[str, dict[str, Any]]:
    """The API path and streamed JSON body that ask ``gpuprompt serve`` for what ``request`` asks
    the engine in process (``/chat/completions`` for messages, ``/completions`` for a prompt).

    Every field that changes the output is sent; the server honours it or refuses it (400 naming
    it, raised by the client as the typed error). ``truncate="left"`` travels as gpuprompt's
    ``truncate`` extension field (the server drops the oldest turns as the engine does in process;
    a vLLM server ignores the field and refuses a prompt that does not fit).
    """
    body: dict[str, Any] = {"max_tokens": request.max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if request.truncate != "error":
        body["truncate"] = request.truncate
    if model is not None:
        body["model"] = model
    if request.messages is not None:
        path = CHAT_COMPLETIONS
        body["messages"] = [_chat_message(message) for message in request.messages]
        if request.tools:
            body["tools"] = [tool.to_openai() for tool in request.tools]
            choice = request.tool_choice
            body["tool_choice"] = choice if choice in ("auto", "required", "none") else {
                "type": "function", "function": {"name": choice}}
            body["parallel_tool_calls"] = request.parallel_tool_calls
    else:
        path = COMPLETIONS
        body["prompt"] = request.prompt
    if request.stop:
        body["stop"] = list(request.stop)
    body.update(sampling_body(request))
    body.update(guided_body(request.guided))
    return path, body


# ---------------------------------------------------------------------------------------- vectors
def encode_vectors(matrix: Any) -> str:
    """Rows of float32 as base64 of their little-endian bytes (``n * dim * 4`` bytes)."""
    return base64.b64encode(np.ascontiguousarray(matrix, dtype="<f4").tobytes()).decode("ascii")


def decode_vectors(value: str, dim: int | None = None, *, name: str = "vectors") -> np.ndarray:
    """:func:`encode_vectors` read back: an ``(n, dim)`` float32 array (a flat one without ``dim``).

    Raises:
        InvalidInputError: not base64, or not a whole number of rows.
    """
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInputError(
            f"'{name}' must be base64 of little-endian float32 values, or a list of lists of numbers "
            f"(got a str that is not base64: {exc})."
        ) from exc
    if len(raw) % 4 or (dim is not None and len(raw) % (4 * dim)):
        what = f"rows of {dim} float32 values ({4 * dim} bytes each)" if dim else "float32 values (4 bytes each)"
        raise InvalidInputError(f"'{name}' must hold whole {what} (got {len(raw)} bytes).")
    flat = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    return flat if dim is None else flat.reshape(-1, dim)


# ---------------------------------------------------------------------------------------- errors
@dataclass(frozen=True)
class WireError:
    """How the server answers an error: a status and OpenAI's error body fields.

    Attributes:
        status: the HTTP status.
        message: ``error.message``.
        type: ``error.type`` (``invalid_request_error``, ``rate_limit_error``, ``server_error``).
        param: ``error.param``: the request field at fault, or None.
        code: ``error.code``: what the client maps back to a class.
        retry: whether the answer carries ``Retry-After`` (429 and storage outages).
    """

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry: bool = False


_PARAM_RE = re.compile(r"^'([A-Za-z_][\w.\[\]]*)'")
# Refusals a client maps back to their own class.
_CODES: dict[type, str] = {DimensionMismatchError: "dimension_mismatch", EmbedderMismatchError: "embedder_mismatch"}


def param_of(message: str) -> str | None:
    """The argument a core message names first (core messages start ``'name' must be ...``)."""
    match = _PARAM_RE.match(message)
    return match.group(1) if match else None


def describe_error(exc: GPUPromptError) -> WireError:
    """The server's answer to a core error (the server direction of the table)."""
    if isinstance(exc, QueueFullError):
        return WireError(429, f"the server is busy: {exc}", "rate_limit_error", code="queue_full", retry=True)
    if isinstance(exc, (SessionStoreError, VectorStoreError)):
        return WireError(503, f"a storage backend is unavailable: {exc}", "server_error", code=type(exc).__name__,
                         retry=True)
    if isinstance(exc, (ClosedError, EngineDeadError)):
        return WireError(503, f"the model is not available: {exc}", "server_error", code="unavailable")
    if isinstance(exc, ContextLengthError):
        return WireError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, UnsupportedFeatureError):
        return WireError(400, str(exc), param=exc.field or param_of(str(exc)), code="unsupported_parameter")
    if isinstance(exc, FilterError):
        return WireError(400, str(exc), param="filter", code="invalid_filter")
    if isinstance(exc, (InvalidInputError, ConfigurationError)):
        message = str(exc)
        return WireError(400, message, param=param_of(message), code=_CODES.get(type(exc), "invalid_value"))
    return WireError(500, f"the model failed: {exc}", "server_error", code=type(exc).__name__)


# The core errors the server sends as 500 with their class name as the code (the others have a
# status of their own, see the table above).
_SERVER_ERRORS: dict[str, type[GPUPromptError]] = {
    cls.__name__: cls
    for cls in (EngineError, EngineDeadError, RequestTimeoutError, ModelLoadError, QualityError, DependencyError,
                DeviceOutOfMemoryError, SessionStoreError, SnapshotError, StorageError, VectorStoreError)
}
_CONTEXT_RE = re.compile(r"has (\d+) tokens but the context window of .*? is (\d+) tokens", re.DOTALL)
_FILTER_PATH_RE = re.compile(r"\s*\(at filter path ([^)]*)\)\s*$")


def error_from_status(status: int, body: Any, headers: Any = None, url: str = "", *,
                      service: str = "the LLM server") -> Exception:
    """The typed error for an HTTP error answer (OpenAI envelope ``{"error": {...}}`` or text); its
    ``status`` attribute holds the HTTP status.

    Args:
        status: the HTTP status.
        body: the answer's body (bytes, text or parsed JSON).
        headers: the answer's headers (for ``Retry-After``), or None.
        url: where the request went (credentials are redacted in the message).
        service: what to call the server in the message.

    Returns:
        The exception to raise (see the module's table).
    """
    error = _typed_error(status, body, headers, url, service)
    error.status = status  # type: ignore[attr-defined]
    return error


def _typed_error(status: int, body: Any, headers: Any, url: str, service: str) -> Exception:
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
        return EngineError(f"{text.rstrip('.')}; pass that server's key as api_key= (GPUPROMPT_API_KEY is read only "
                           "with GPUPROMPT_URL; a gpuprompt serve --llm-url takes --llm-api-key / GPUPROMPT_LLM_API_KEY).")
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
