"""The LLM engine's request, result and stream types (plain frozen dataclasses, no heavy imports).

A :class:`GenerationRequest` is validated when it is built, so a bad request fails at the caller's
line with a message that names the field, before anything is queued.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuprompt._validate import INT64_MAX, INT64_MIN, check_int, check_json, check_str, check_text
from gpuprompt.batching import check_priority
from gpuprompt.errors import InputTypeError, InvalidInputError, describe

__all__ = [
    "EngineStats",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "StreamDelta",
    "Timings",
    "Usage",
    "ROLES",
]

FinishReason = Literal["stop", "length", "abort"]
"""Why generation ended: a stop string or end-of-sequence token, the token budget, or a cancel."""

MAX_TOKENS_LIMIT = 2**31 - 1
"""The largest ``max_tokens`` accepted (the context window caps it further)."""

ROLES = ("system", "user", "assistant")
"""The chat roles a message may carry: the one definition, also the roles a stored
:class:`~gpuprompt.ContextCache` turn may carry (a turn the cache accepts always fits a request).
Tool results travel as ``"user"`` turns in every adapter until the core models tool calls."""


@dataclass(frozen=True)
class Usage:
    """Token counts of one request, from the model's own tokenizer.

    Attributes:
        prompt_tokens: tokens of the rendered prompt (chat template applied, after truncation).
        completion_tokens: tokens the model generated, the end-of-sequence token included.
        total_tokens: their sum.
    """

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class Timings:
    """Where one request's time went, in seconds.

    Attributes:
        queued_s: from submission until the engine started computing it.
        ttft_s: from submission until the first generated token was available.
        total_s: from submission until the last token.
    """

    queued_s: float
    ttft_s: float
    total_s: float


@dataclass(frozen=True)
class GenerationResult:
    """The outcome of one :class:`GenerationRequest`.

    Attributes:
        text: the generated text (a matched stop string is not included).
        finish_reason: ``"stop"`` (stop string or end of sequence), ``"length"`` (``max_tokens`` or
            the context window reached) or ``"abort"`` (cancelled).
        usage: token counts.
        timings: queue wait, time to first token, total time.
        model: the engine's model name.
        request_id: the request's id (the caller's, or a generated one).
    """

    text: str
    finish_reason: str
    usage: Usage
    timings: Timings
    model: str
    request_id: str


@dataclass(frozen=True)
class StreamDelta:
    """One piece of a streamed generation; the last one carries ``finish_reason`` and ``usage``.

    Attributes:
        text: new text since the previous delta (may be empty on the last delta).
        finish_reason: None until the last delta.
        usage: None until the last delta.
    """

    text: str
    finish_reason: str | None = None
    usage: Usage | None = None


@dataclass(frozen=True)
class EngineStats:
    """Counters of an :class:`~gpuprompt.LLMEngine`.

    Attributes:
        requests: requests accepted (after validation).
        completed: requests that ended with ``"stop"`` or ``"length"``.
        aborted: requests cancelled by their caller (or by :meth:`close`).
        failed: requests that ended with an error.
        in_flight: requests accepted and not yet ended (queued or running in the backend).
        prompt_tokens: prompt tokens over every finished request.
        completion_tokens: generated tokens over every finished request.
    """

    requests: int
    completed: int
    aborted: int
    failed: int
    in_flight: int
    prompt_tokens: int
    completion_tokens: int


def _number(name: str, value: Any, *, low: float, high: float | None = None, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInputError(f"'{name}' must be a finite number (got {describe(value)}).")
    if value < low or (low_open and value == low) or (high is not None and value > high):
        bound = f"> {low}" if low_open else f">= {low}"
        if high is not None:
            bound += f" and <= {high}"
        raise InvalidInputError(f"'{name}' must be a number {bound} (got {describe(value)}).")
    return float(value)


def _normalize_response_format(value: Any) -> Mapping[str, Any] | None:
    """Accept a bare JSON schema or the OpenAI wrappers; return ``{"json": schema}`` or
    ``{"json_object": True}`` (the only two shapes the backends see)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InputTypeError(
            f"'response_format' must be None or a JSON schema dict (got {describe(value)}); for example "
            "{'type': 'object', 'properties': {'name': {'type': 'string'}}}."
        )
    kind = value.get("type")
    if kind == "json_object" and set(value) <= {"type"}:
        return {"json_object": True}
    if kind == "json_schema" and isinstance(value.get("json_schema"), Mapping):
        schema = value["json_schema"].get("schema")
        if not isinstance(schema, Mapping):
            raise InvalidInputError(
                "'response_format' in the OpenAI form needs {'type': 'json_schema', 'json_schema': "
                f"{{'schema': {{...}}}}}} (got {describe(dict(value))})."
            )
        value = schema
    return {"json": check_json(value, "response_format")}


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """One generation: chat ``messages`` or a raw ``prompt``, plus sampling options.

    Example:
        >>> GenerationRequest(messages=[{"role": "user", "content": "Hi!"}], max_tokens=16)
        ... # doctest: +ELLIPSIS
        GenerationRequest(messages=({'role': 'user', 'content': 'Hi!'},), prompt=None, max_tokens=16, ...)

    Attributes:
        messages: chat turns ``{"role": "system" | "user" | "assistant", "content": str}``; the
            model's chat template is applied and a generation prompt added.
        prompt: a raw prompt, sent as is (no template). Exactly one of ``messages`` / ``prompt``.
        max_tokens: most new tokens (also capped by the room left in the context window).
        temperature: 0 for greedy decoding; higher samples more freely.
        top_p: nucleus sampling mass (used when ``temperature > 0``).
        seed: a sampling seed for reproducible sampled output.
        stop: strings that end generation; the matched string is not part of the text. A bare str
            counts as one stop string.
        priority: lower is served first when the engine is busy.
        response_format: a JSON schema (or OpenAI's ``{"type": "json_schema", ...}`` /
            ``{"type": "json_object"}``) to constrain the output (guided decoding; vLLM backend).
        truncate: ``"error"`` raises ``ContextLengthError`` when the prompt does not fit;
            ``"left"`` drops the oldest turns (keeping system messages and the last turn) or, for
            a raw prompt, its oldest tokens.
        request_id: an id to find the request in logs; generated when None.

    Raises:
        InvalidInputError: a field is out of range (the message names it and what was got).
        InputTypeError: a field has the wrong type.
    """

    messages: Sequence[Mapping[str, str]] | None = None
    prompt: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()
    priority: int = 0
    response_format: Mapping[str, Any] | None = None
    truncate: Literal["error", "left"] = "error"
    request_id: str | None = None
    _guided: Mapping[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise InvalidInputError(
                "a GenerationRequest needs exactly one of 'messages' or 'prompt' (got "
                f"{'both' if self.messages is not None else 'neither'})."
            )
        check_str(self.prompt, "prompt", allow_none=True)
        if self.messages is not None:
            object.__setattr__(self, "messages", _check_messages(self.messages))
        object.__setattr__(self, "max_tokens", check_int(self.max_tokens, "max_tokens", min=1, max=MAX_TOKENS_LIMIT))
        object.__setattr__(self, "temperature", _number("temperature", self.temperature, low=0.0, high=100.0))
        object.__setattr__(self, "top_p", _number("top_p", self.top_p, low=0.0, high=1.0, low_open=True))
        # int64, as vLLM's OpenAI server and torch's generators take it.
        object.__setattr__(self, "seed", check_int(self.seed, "seed", min=INT64_MIN, max=INT64_MAX, allow_none=True))
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is None:
            stop = ()
        if not isinstance(stop, Sequence):
            raise InputTypeError(f"'stop' must be a list of str (got {describe(stop)}).")
        for index, item in enumerate(stop):
            if not isinstance(item, str) or not item:
                raise InvalidInputError(f"'stop[{index}]' must be a non-empty str (got {describe(item)}).")
            check_text(item, f"stop[{index}]")
        object.__setattr__(self, "stop", tuple(stop))
        object.__setattr__(self, "priority", check_priority(self.priority))
        if not isinstance(self.truncate, str) or self.truncate not in ("error", "left"):
            raise InvalidInputError(f"'truncate' must be 'error' or 'left' (got {describe(self.truncate)}).")
        if self.request_id is not None and (not isinstance(self.request_id, str) or not self.request_id):
            raise InvalidInputError(f"'request_id' must be None or a non-empty str (got {describe(self.request_id)}).")
        check_str(self.request_id, "request_id", allow_none=True)
        object.__setattr__(self, "_guided", _normalize_response_format(self.response_format))

    @property
    def guided(self) -> Mapping[str, Any] | None:
        """The normalised constraint: ``{"json": schema}``, ``{"json_object": True}`` or None."""
        return self._guided


def _check_messages(messages: Any) -> tuple[dict[str, str], ...]:
    if isinstance(messages, (str, bytes)) or isinstance(messages, Mapping) or not isinstance(messages, Sequence):
        raise InputTypeError(
            "'messages' must be a list of {'role': ..., 'content': ...} dicts (got "
            f"{describe(messages)}); for one user turn pass [{{'role': 'user', 'content': text}}]."
        )
    if not messages:
        raise InvalidInputError("'messages' must hold at least one message (got an empty list).")
    checked: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InputTypeError(
                f"'messages[{index}]' must be a dict with 'role' and 'content' (got {describe(message)})."
            )
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or role not in ROLES:  # never `in` on an array-like value
            raise InvalidInputError(
                f"'messages[{index}].role' must be one of {list(ROLES)} (got {describe(role)})."
            )
        if not isinstance(content, str):
            raise InputTypeError(f"'messages[{index}].content' must be a str (got {describe(content)}).")
        check_text(content, f"messages[{index}].content")
        checked.append({"role": role, "content": content})
    return tuple(checked)
