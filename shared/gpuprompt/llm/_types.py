"""The LLM engine's request, result and stream types (plain frozen dataclasses, no heavy imports).

A :class:`GenerationRequest` is validated when it is built, so a bad request fails at the caller's
line with a message that names the field, before anything is queued.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuprompt.batching import check_priority
from gpuprompt.errors import InputTypeError, InvalidInputError, describe
from gpuprompt.llm._tools import (
    ROLES,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
    check_messages,
    check_tool_choice,
    check_tools,
)
from gpuprompt.validation import (
    INT64_MAX,
    INT64_MIN,
    check_bool,
    check_int,
    check_json,
    check_number,
    check_str,
    check_text,
    fail,
)

__all__ = [
    "ROLES",
    "EngineStats",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "StreamDelta",
    "Timings",
    "Usage",
]

FinishReason = Literal["stop", "length", "abort", "tool_calls"]
"""Why generation ended: a stop string or end-of-sequence token, the token budget, a cancel, or
the model called tools."""

MAX_TOKENS_LIMIT = 2**31 - 1
"""The largest ``max_tokens`` accepted (the context window caps it further)."""

MAX_LOGIT_BIAS = 4096
"""Most entries in ``logit_bias``."""
MAX_CHOICES = 4096
"""Most options in ``guided_choice``."""
MAX_STOP_TOKEN_IDS = 1024
"""Most ids in ``stop_token_ids``."""
_SESSION_ID = re.compile(r"[!-~](?:[ -~]{0,254}[!-~])?")


def affinity_key(session_id: str) -> str:
    """A ``GenerationRequest.session_id`` for any conversation id: the id itself when it can travel in
    an HTTP header, else a stable digest of it (a router only needs the same key for every turn)."""
    if _SESSION_ID.fullmatch(session_id):
        return session_id
    import hashlib

    return "sha256-" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


@dataclass(frozen=True)
class Usage:
    """Token counts of one request, from the model's own tokenizer.

    Attributes:
        prompt_tokens: tokens of the rendered prompt (chat template applied, after truncation).
        completion_tokens: tokens the model generated, the end-of-sequence token included.
        total_tokens: their sum.
        cached_tokens: prompt tokens served from the prefix cache (vLLM's ``num_cached_tokens``;
            on transformers, the tokens whose keys and values a kept prompt prefix supplied).
    """

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0


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
            the context window reached), ``"abort"`` (cancelled) or ``"tool_calls"`` (the reply
            is tool calls).
        usage: token counts.
        timings: queue wait, time to first token, total time.
        model: the engine's model name.
        request_id: the request's id (the caller's, or a generated one).
        tool_calls: the tool calls of the reply (then ``text`` holds only the prose besides them,
            often ``""``). When ``max_tokens`` cut a call short (``finish_reason`` ``"length"``),
            it is the last one, with the argument text generated so far and
            :attr:`~gpuprompt.llm.ToolCall.incomplete` set, as OpenAI and vLLM's server return it.
        stop_reason: what ended a ``"stop"`` reply other than the end-of-sequence token, as vLLM's
            ``stop_reason``: the ``stop_token_ids`` token (an int) or the stop string (a str);
            None otherwise.
    """

    text: str
    finish_reason: str
    usage: Usage
    timings: Timings
    model: str
    request_id: str
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: int | str | None = None


@dataclass(frozen=True)
class StreamDelta:
    """One piece of a streamed generation; the last one carries ``finish_reason`` and ``usage``.

    Attributes:
        text: new text since the previous delta (may be empty on the last delta).
        finish_reason: None until the last delta.
        usage: None until the last delta.
        tool_calls: pieces of tool calls (the first delta of an index carries its id and name;
            the ``arguments`` fragments of an index concatenate to the call's JSON arguments, or,
            for a call ``max_tokens`` cut short, to the text generated so far: it comes last, with
            ``finish_reason`` ``"length"``).
        stop_reason: on the last delta, the result's :attr:`GenerationResult.stop_reason`.
    """

    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    stop_reason: int | str | None = None

    @classmethod
    def closing(cls, result: GenerationResult) -> StreamDelta:
        """The last delta of a stream whose whole reply is ``result`` (its end, no new text)."""
        return cls("", finish_reason=result.finish_reason, usage=result.usage, stop_reason=result.stop_reason)


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
    # (math.isfinite overflows on an int past float's range: ints are finite, compared exactly below)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
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
    """One generation: chat ``messages`` or a raw ``prompt``, plus sampling, tools and constraints.

    Example:
        >>> GenerationRequest(messages=[{"role": "user", "content": "Hi!"}], max_tokens=16)
        ... # doctest: +ELLIPSIS
        GenerationRequest(messages=({'role': 'user', 'content': 'Hi!'},), prompt=None, max_tokens=16, ...)

    Attributes:
        messages: chat turns ``{"role": "system" | "user" | "assistant" | "tool", "content": str}``;
            an assistant turn may carry ``"tool_calls"`` (OpenAI tool-call dicts or
            :class:`ToolCall`; its content may then be None), a tool turn ``"tool_call_id"`` and
            ``"name"``. The model's chat template is applied and a generation prompt added.
        prompt: a raw prompt, sent as is (no template). Exactly one of ``messages`` / ``prompt``.
        max_tokens: most new tokens (also capped by the room left in the context window).
        temperature: 0 for greedy decoding; higher samples more freely.
        top_p: nucleus sampling mass (used when ``temperature > 0``).
        top_k: sample among the ``top_k`` likeliest tokens (0: off; used when ``temperature > 0``).
        min_p: drop tokens less likely than ``min_p`` times the likeliest (0: off).
        presence_penalty: subtracted from the logit of every token already generated, in [-2, 2].
        frequency_penalty: subtracted once per earlier occurrence in the output, in [-2, 2].
        repetition_penalty: > 1 discourages tokens of the prompt and output (1: off).
        logit_bias: token id -> bias in [-100, 100] added to its logit.
        seed: a sampling seed for reproducible sampled output.
        stop: strings that end generation; the matched string is not part of the text. A bare str
            counts as one stop string.
        stop_token_ids: token ids that end generation as the end-of-sequence token does (the
            token is not part of the text), as vLLM's ``stop_token_ids``.
        min_tokens: generate at least this many tokens before the end-of-sequence token, a
            ``stop_token_ids`` token or a stop string may end the reply (vLLM's ``min_tokens``;
            a constrained output may still end sooner when its grammar allows nothing else).
            At most ``max_tokens``; not with both stop strings and tools.
        ignore_eos: keep generating past the end-of-sequence token, until ``max_tokens``, a
            ``stop_token_ids`` token or a stop string (vLLM's ``ignore_eos``: what throughput
            benchmarks send to get replies of a fixed length). Not with an output constraint or
            tools, whose end is the end of sequence.
        include_stop_str_in_output: keep the stop string that ended the reply (and a
            ``stop_token_ids`` token's text) in the text (vLLM's field). Not with tools.
        skip_special_tokens: leave the tokenizer's special tokens out of the text (True, as
            vLLM); False keeps them (what a reasoning model's markers may need). Not with tools.
        priority: lower is served first when the engine is busy.
        response_format: a JSON schema (or OpenAI's ``{"type": "json_schema", ...}`` /
            ``{"type": "json_object"}``) to constrain the output (guided decoding).
        guided_regex: constrain the output to match this regular expression.
        guided_choice: constrain the output to exactly one of these strings.
        tools: tools the model may call (:class:`ToolSpec` or OpenAI tool dicts); chat only.
        tool_choice: ``"auto"`` (prose or calls), ``"required"`` (at least one call), ``"none"``
            (no call), or a tool's name / ``{"type": "function", "function": {"name": ...}}``
            (a call of that tool).
        parallel_tool_calls: allow several calls in one reply (False: at most one).
        truncate: ``"error"`` raises ``ContextLengthError`` when the prompt does not fit;
            ``"left"`` drops the oldest turns (keeping system messages and the last turn, and an
            assistant's tool calls together with their results) or, for a raw prompt, its oldest
            tokens.
        request_id: an id to find the request in logs; generated when None.
        session_id: the conversation this request belongs to (visible ASCII, at most 256
            characters); the remote backend sends it in its session header so a router keeps
            the conversation on one replica. Other backends ignore it.

    Raises:
        InvalidInputError: a field is out of range (the message names it and what was got).
        InputTypeError: a field has the wrong type.
    """

    messages: Sequence[Mapping[str, Any]] | None = None
    prompt: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None
    seed: int | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: int = 0
    response_format: Mapping[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: Sequence[str] | None = None
    tools: Sequence[ToolSpec | Mapping[str, Any]] = ()
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    truncate: Literal["error", "left"] = "error"
    request_id: str | None = None
    session_id: str | None = None
    _guided: Mapping[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise InvalidInputError(
                "a GenerationRequest needs exactly one of 'messages' or 'prompt' (got "
                f"{'both' if self.messages is not None else 'neither'})."
            )
        check_str(self.prompt, "prompt", allow_none=True)
        if self.messages is not None:
            object.__setattr__(self, "messages", check_messages(self.messages))
        set_ = object.__setattr__
        set_(self, "max_tokens", check_int(self.max_tokens, "max_tokens", min=1, max=MAX_TOKENS_LIMIT))
        set_(self, "temperature", _number("temperature", self.temperature, low=0.0, high=100.0))
        set_(self, "top_p", _number("top_p", self.top_p, low=0.0, high=1.0, low_open=True))
        set_(self, "top_k", check_int(self.top_k, "top_k", min=0, max=MAX_TOKENS_LIMIT))
        set_(self, "min_p", check_number(self.min_p, "min_p", min=0.0, max=1.0))
        set_(self, "presence_penalty", check_number(self.presence_penalty, "presence_penalty", min=-2.0, max=2.0))
        set_(self, "frequency_penalty", check_number(self.frequency_penalty, "frequency_penalty", min=-2.0, max=2.0))
        set_(self, "repetition_penalty", _number("repetition_penalty", self.repetition_penalty, low=0.0, high=100.0,
                                                 low_open=True))
        set_(self, "logit_bias", _check_logit_bias(self.logit_bias))
        # int64, as vLLM's OpenAI server and torch's generators take it.
        set_(self, "seed", check_int(self.seed, "seed", min=INT64_MIN, max=INT64_MAX, allow_none=True))
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
        set_(self, "stop", tuple(stop))
        set_(self, "stop_token_ids", _check_token_ids(self.stop_token_ids))
        set_(self, "min_tokens", check_int(self.min_tokens, "min_tokens", min=0, max=MAX_TOKENS_LIMIT))
        if self.min_tokens > self.max_tokens:
            raise InvalidInputError(
                f"'min_tokens' must be at most 'max_tokens' ({self.max_tokens}) (got {self.min_tokens}); raise "
                "max_tokens or lower min_tokens."
            )
        set_(self, "ignore_eos", check_bool(self.ignore_eos, "ignore_eos"))
        set_(self, "include_stop_str_in_output", check_bool(self.include_stop_str_in_output,
                                                            "include_stop_str_in_output"))
        set_(self, "skip_special_tokens", check_bool(self.skip_special_tokens, "skip_special_tokens"))
        set_(self, "priority", check_priority(self.priority))
        if not isinstance(self.truncate, str) or self.truncate not in ("error", "left"):
            raise InvalidInputError(f"'truncate' must be 'error' or 'left' (got {describe(self.truncate)}).")
        if self.request_id is not None and (not isinstance(self.request_id, str) or not self.request_id):
            raise InvalidInputError(f"'request_id' must be None or a non-empty str (got {describe(self.request_id)}).")
        check_str(self.request_id, "request_id", allow_none=True)
        if self.session_id is not None and (
            not isinstance(self.session_id, str) or not _SESSION_ID.fullmatch(self.session_id)
        ):
            raise InvalidInputError(
                "'session_id' must be None or 1 to 256 visible ASCII characters (inner spaces allowed; it travels "
                f"in an HTTP header) (got {describe(self.session_id)})."
            )
        tools = check_tools(self.tools)
        set_(self, "tools", tools)
        set_(self, "tool_choice", check_tool_choice(self.tool_choice, tools))
        set_(self, "parallel_tool_calls", check_bool(self.parallel_tool_calls, "parallel_tool_calls"))
        if tools and self.messages is None:
            raise InvalidInputError("'tools' need chat 'messages' (got a raw 'prompt'); send the turns as messages.")
        guided = [g for g in (
            _normalize_response_format(self.response_format),
            _normalize_regex(self.guided_regex),
            _normalize_choice(self.guided_choice),
        ) if g is not None]
        if len(guided) > 1:
            raise InvalidInputError(
                "pass at most one of 'response_format', 'guided_regex' and 'guided_choice' (got "
                f"{len(guided)}); they are alternative constraints on the same output."
            )
        if guided and self.forces_tool_call:
            raise InvalidInputError(
                f"'tool_choice' {self.tool_choice!r} forces a tool call, so the reply cannot also follow "
                "'response_format'/'guided_regex'/'guided_choice'; use tool_choice='auto' (the constraint then "
                "shapes the prose answer) or drop the constraint."
            )
        for name, asked in (("include_stop_str_in_output", self.include_stop_str_in_output),
                            ("skip_special_tokens", not self.skip_special_tokens)):
            if asked and self.uses_tools:
                raise InvalidInputError(
                    f"'{name}' cannot be combined with tools: a reply with tools is parsed into prose and "
                    f"calls, which would carry the model's raw markers; drop '{name}' or the tools."
                )
        if self.min_tokens and self.stop and self.uses_tools:
            raise InvalidInputError(
                "'min_tokens' cannot be combined with 'stop' and tools: a reply with tools meets its stop strings "
                "in the parsed prose, where tokens are not counted; drop min_tokens, the stop strings or the tools."
            )
        if self.ignore_eos and (guided or self.uses_tools):
            raise InvalidInputError(
                "'ignore_eos' cannot be combined with an output constraint or tools: a constrained reply ends "
                "with the end-of-sequence token once complete, so nothing could follow it; drop ignore_eos (or "
                "use min_tokens) or drop the constraint."
            )
        set_(self, "_guided", guided[0] if guided else None)

    @property
    def guided(self) -> Mapping[str, Any] | None:
        """The normalised output constraint: ``{"json": schema}``, ``{"json_object": True}``,
        ``{"regex": str}``, ``{"choice": [str, ...]}`` or None (tool calls are constrained
        separately, see :mod:`gpuprompt.llm._tool_format`)."""
        return self._guided

    @property
    def uses_tools(self) -> bool:
        """Whether tools are in play (some tools bound and ``tool_choice`` is not ``"none"``)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def forces_tool_call(self) -> bool:
        """Whether the reply must be tool calls (``"required"`` or a named tool)."""
        return bool(self.tools) and self.tool_choice not in ("auto", "none")


def _normalize_regex(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    check_str(value, "guided_regex", allow_empty=False, max_length=65536)
    try:
        re.compile(value)
    except re.error as exc:
        raise InvalidInputError(f"'guided_regex' must be a valid regular expression (got {value!r}: {exc}).") from None
    return {"regex": value}


def _normalize_choice(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise fail("guided_choice", "a list of str", value, error=InputTypeError,
                   fix="Wrap a single option in a list: [option]." if isinstance(value, str) else "")
    if not value or len(value) > MAX_CHOICES:
        raise fail("guided_choice", f"a list of 1 to {MAX_CHOICES} str", value)
    for index, item in enumerate(value):
        check_str(item, f"guided_choice[{index}]", allow_empty=False, max_length=65536)
    return {"choice": list(dict.fromkeys(value))}


def _check_token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise fail("stop_token_ids", "a list of token ids (int)", value, error=InputTypeError)
    if len(value) > MAX_STOP_TOKEN_IDS:
        raise InvalidInputError(f"'stop_token_ids' must hold at most {MAX_STOP_TOKEN_IDS} ids (got {len(value)}).")
    return tuple(dict.fromkeys(check_int(token, f"stop_token_ids[{index}]", min=0, max=MAX_TOKENS_LIMIT)
                               for index, token in enumerate(value)))


def _check_logit_bias(value: Any) -> Mapping[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise fail("logit_bias", "None or a dict of token id -> bias", value, error=InputTypeError)
    if len(value) > MAX_LOGIT_BIAS:
        raise InvalidInputError(f"'logit_bias' must hold at most {MAX_LOGIT_BIAS} entries (got {len(value)}).")
    checked: dict[int, float] = {}
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 12 else key
        token = check_int(token, "logit_bias key", min=0, max=MAX_TOKENS_LIMIT)
        checked[token] = check_number(bias, f"logit_bias[{token}]", min=-100.0, max=100.0)
    return checked or None
