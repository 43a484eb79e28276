"""Pydantic models of the generating OpenAI routes: ``/v1/chat/completions`` and ``/v1/completions``.

Every field that changes the output is either passed to the core or refused with a 400 naming it;
only fields that change nothing here (``user``, ``metadata``, ``store``, ...) are accepted and
ignored. Unknown fields are ignored, as vLLM's server does (builders send vendor extras), except
vLLM's own output-changing fields this server does not run, refused unless they carry their default.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from gpuprompt.server.schemas.base import (
    MAX_STOP,
    Choices,
    JSONObject,
    ModelName,
    Priority,
    Seed,
    Temperature,
    Text,
    TokenCount,
    TopP,
    UsageModel,
    _int,
    _number,
    _OpenAIRequest,
    _run,
)
from gpuprompt.validation import check_number
from gpuprompt.wire import EXTRA_SAMPLING, MAX_STOP_TOKEN_IDS, MAX_TOKENS_LIMIT

__all__ = [
    "MAX_LOGIT_BIAS",
    "MAX_TOOLS",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatMessage",
    "ChatUsage",
    "CompletionRequest",
    "CompletionResponse",
]

MAX_TOOLS = 128
"""Most tool definitions per request (OpenAI's limit)."""
MAX_LOGIT_BIAS = 1024
"""Most ``logit_bias`` entries per request."""
MAX_TOKEN_ID = 2**31 - 1
"""The largest token id accepted in ``logit_bias`` (the engine checks it against its vocabulary)."""

TokenId = _int(0, MAX_TOKEN_ID)
"""A token id of the served model's tokenizer (the engine checks it against its vocabulary)."""
MinTokens = _int(0, MAX_TOKENS_LIMIT)
"""A number of tokens to generate at least."""
TopK = _int(-1, MAX_TOKEN_ID)
"""Sample from the ``k`` most likely tokens; 0 or -1 (vLLM's spelling) turns it off."""
MinP = _number(0.0, 1.0)
"""Drop tokens below ``min_p`` times the most likely token's probability; 0 turns it off."""
Penalty = _number(-2.0, 2.0)
"""OpenAI's presence / frequency penalty range."""
RepetitionPenalty = Annotated[float, Field(gt=0.0, le=10.0), BeforeValidator(_run(check_number, min=0.0, max=10.0))]
"""Multiplicative repetition penalty (1 turns it off; HF / vLLM semantics)."""
StopText = Annotated[Text, Field(min_length=1)]
Bias = Annotated[float, BeforeValidator(_run(check_number, min=-100.0, max=100.0))]
"""A ``logit_bias`` value: added to the token's logit, in [-100, 100]."""


class StreamOptions(_OpenAIRequest):
    """Streaming options."""

    include_usage: StrictBool = False
    """Send a last chunk with the usage (and empty ``choices``)."""


class JSONSchemaSpec(_OpenAIRequest):
    """OpenAI's ``json_schema`` response format body."""

    name: Text | None = None
    description: Text | None = None
    schema_: JSONObject = Field(alias="schema")
    strict: StrictBool | None = None


class StructuredOutputs(_OpenAIRequest):
    """vLLM's ``structured_outputs`` (0.10+; the ``guided_*`` fields are its older spelling)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)  # grammar etc.: refused
    schema_: JSONObject | Text | None = Field(None, alias="json")
    """``json``: a JSON schema (an object, or its JSON text) the output must match."""
    regex: Annotated[Text, Field(min_length=1, max_length=65536)] | None = None
    """A regular expression the output must match."""
    choice: list[Annotated[Text, Field(min_length=1)]] | None = Field(None, min_length=1, max_length=1024)
    """The output is exactly one of these strings."""
    json_object: StrictBool | None = None
    """True: the output is a JSON object (any)."""
    disable_any_whitespace: StrictBool | None = None
    """Accepted either way: guided JSON here is always written compactly (vLLM's ``true``)."""

    @field_validator("schema_")
    @classmethod
    def _schema_object(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:  # the checks of a schema given as an object: depth, int64, finite numbers
            return _SCHEMA_TEXT.validate_json(value)
        except ValidationError as exc:
            problem = exc.errors()[0].get("msg", "not a JSON object")
            raise ValueError(f"must be a JSON schema, as an object or its JSON text ({problem})") from None

    def constraint(self) -> dict[str, Any]:
        """The one constraint it holds, as ``{"json": schema}``, ``{"regex": ...}``, ``{"choice": [...]}``
        or ``{"json_object": True}``.

        Raises:
            ValueError: none, or more than one.
        """
        given = {k: v for k, v in (("json", self.schema_), ("regex", self.regex), ("choice", self.choice),
                                   ("json_object", self.json_object or None)) if v is not None}
        if len(given) != 1:
            raise ValueError("'structured_outputs' must hold exactly one of 'json', 'regex', 'choice' or "
                             f"'json_object' (got {list(given) or 'none'})")
        return given


_SCHEMA_TEXT: TypeAdapter[dict[str, Any]] = TypeAdapter(JSONObject)


class ResponseFormat(_OpenAIRequest):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema': {'name': ..., 'schema': {...}}")
        return self

    def core(self) -> dict[str, Any]:
        """The ``response_format`` of the core request."""
        if self.type == "json_object":
            return {"type": "json_object"}
        return self.model_dump(by_alias=True, exclude_none=True)


_VLLM_OFF: dict[str, tuple[Any, ...]] = {
    "spaces_between_special_tokens": (True,),
    "bad_words": ([],),
    "allowed_token_ids": (),
    "truncate_prompt_tokens": (),
    "prompt_logprobs": (),
    "use_beam_search": (False,),
    "length_penalty": (1, 1.0),
    "guided_grammar": (),
    "guided_whitespace_pattern": (),
    "structural_tag": (),
    "logits_processors": ([],),
    "return_tokens_as_token_ids": (False,),
    "continue_final_message": (False,),
    "add_generation_prompt": (True,),
    "chat_template": (),
    "echo": (False,),
    "documents": ([],),
    "vllm_xargs": ({},),
}
"""vLLM's own request fields that change the output and that this server does not run, each with the
values that ask for nothing (``null`` always does). Sent with another value, the field is refused
(400 naming it) rather than ignored: a ``bad_words`` list or ``allowed_token_ids`` would otherwise
silently get something else."""


class _Sampling(_OpenAIRequest):
    """Sampling fields shared by chat and text completions (each reaches the core or is refused)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # extras are read for vLLM's fields only

    temperature: Temperature = 1.0
    """0 for greedy decoding."""
    top_p: TopP = 1.0
    """Nucleus sampling mass."""
    top_k: TopK = 0
    """Most likely tokens to sample from (0 or -1: off)."""
    min_p: MinP = 0.0
    """Minimum probability relative to the most likely token (0: off)."""
    presence_penalty: Penalty = 0.0
    """Penalise tokens that appeared at all (OpenAI semantics)."""
    frequency_penalty: Penalty = 0.0
    """Penalise tokens by how often they appeared (OpenAI semantics)."""
    repetition_penalty: RepetitionPenalty = 1.0
    """Multiplicative penalty of repeated tokens (1: off)."""
    logit_bias: dict[str, Bias] | None = None
    """Token id (as a JSON key) -> bias in [-100, 100] added to its logit."""
    seed: Seed | None = None
    """Sampling seed."""
    stop: StopText | list[StopText] | None = None
    """Up to 16 non-empty strings that end generation."""
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    """vLLM extension: token ids that end generation as the end-of-sequence token does (not shown)."""
    min_tokens: MinTokens = 0
    """vLLM extension: tokens generated before the end of sequence, a ``stop_token_ids`` token or a
    stop string may end the reply."""
    ignore_eos: StrictBool = False
    """vLLM extension: generate past the end-of-sequence token, until ``max_tokens`` (what
    ``vllm bench serve --ignore-eos`` sends); not with an output constraint or tools."""
    include_stop_str_in_output: StrictBool = False
    """vLLM extension: keep the stop string (or stop token's text) that ended the reply."""
    skip_special_tokens: StrictBool = True
    """vLLM extension: false keeps the tokenizer's special tokens in the text."""
    response_format: ResponseFormat | None = None
    """Constrain the output to JSON (guided decoding)."""
    guided_json: JSONObject | None = None
    """vLLM extension: a JSON schema the output must match."""
    guided_regex: Annotated[Text, Field(min_length=1, max_length=65536)] | None = None
    """vLLM extension: a regular expression the output must match."""
    guided_choice: list[Annotated[Text, Field(min_length=1)]] | None = Field(None, min_length=1, max_length=1024)
    """vLLM extension: the output is exactly one of these strings."""
    structured_outputs: StructuredOutputs | None = None
    """vLLM's current spelling of the three above: ``{"json": schema}``, ``{"regex": ...}`` or
    ``{"choice": [...]}`` (``grammar`` and ``structural_tag`` are refused)."""
    priority: Priority = 0
    """gpuprompt / vLLM extension: lower is served first when the engine is busy."""
    truncate: Literal["error", "left"] = "error"
    """gpuprompt extension: ``"error"`` refuses a prompt that does not fit the window (400,
    ``context_length_exceeded``); ``"left"`` drops the oldest turns until the prompt leaves room for
    ``max_tokens`` (the system messages and the last user turn are kept; a text prompt loses its
    first tokens), as the in-process engine's ``truncate="left"``."""
    user: Text | None = None
    """Ignored (an end-user id for abuse monitoring)."""
    metadata: JSONObject | None = None
    """Ignored (OpenAI stores it with the completion; nothing is stored here)."""
    store: StrictBool | None = None
    """Ignored (nothing is stored)."""
    service_tier: Text | None = None
    """Ignored (one tier)."""

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > MAX_STOP:
            raise ValueError(f"must hold at most {MAX_STOP} strings (got {len(value)})")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"must hold at most {MAX_LOGIT_BIAS} entries (got {len(value)})")
        for key in value:
            if not (key.isascii() and key.isdigit() and len(key) <= 10 and int(key) <= MAX_TOKEN_ID):
                shown = repr(key[:40])
                raise ValueError(
                    f"keys must be token ids of the served model's tokenizer written as whole numbers, e.g. "
                    f"{{'50256': -100}} (got key {shown})"
                )
        return value

    def _older_constraint(self) -> dict[str, Any] | None:
        """The constraint of the ``guided_*`` / ``response_format`` fields, in :meth:`StructuredOutputs.constraint`'s
        form (None without one; a json_schema ``response_format`` as its schema)."""
        if self.guided_json is not None:
            return {"json": self.guided_json}
        if self.guided_regex is not None:
            return {"regex": self.guided_regex}
        if self.guided_choice is not None:
            return {"choice": list(self.guided_choice)}
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            return {"json_object": True}
        if fmt is not None and fmt.type == "json_schema":
            return {"json": fmt.core().get("json_schema", {}).get("schema")}
        return None

    def refused_vllm_field(self) -> tuple[str, Any] | None:
        """The first of vLLM's fields this server does not run (:data:`_VLLM_OFF`) that the request
        sent with a value asking for something, as ``(name, value)``; None when there is none."""
        for name, value in (self.model_extra or {}).items():
            if name in _VLLM_OFF and value is not None and not any(
                    type(value) is type(off) and value == off for off in _VLLM_OFF[name]):
                return name, value
        return None

    def sampling_options(self) -> dict[str, Any]:
        """The :class:`~gpuprompt.llm.GenerationRequest` keywords of these fields (seed excluded)."""
        guided: dict[str, Any] = {}
        if self.response_format is not None and self.response_format.type != "text":
            guided["response_format"] = self.response_format.core()
        if self.guided_json is not None:
            guided["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "guided_json", "schema": self.guided_json}}
        if self.guided_regex is not None:
            guided["guided_regex"] = self.guided_regex
        if self.guided_choice is not None:
            guided["guided_choice"] = list(self.guided_choice)
        options: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": [self.stop] if isinstance(self.stop, str) else list(self.stop or ()),
            "priority": self.priority,
            **guided,
        }
        if self.truncate != "error":
            options["truncate"] = self.truncate
        # Only non-default values are passed: a backend refuses (400) what it cannot honour, and a
        # default value asks for nothing, so a client that always sends the defaults (Dify) works.
        if self.top_k not in (0, -1):
            options["top_k"] = self.top_k
        if self.logit_bias:
            options["logit_bias"] = {int(k): float(v) for k, v in self.logit_bias.items()}
        if self.stop_token_ids:
            options["stop_token_ids"] = list(self.stop_token_ids)
        for name, off in EXTRA_SAMPLING.items():  # the other sampling fields are spelled as in the core
            if name not in ("top_k", "logit_bias", "stop_token_ids") and getattr(self, name) != off:
                options[name] = getattr(self, name)
        return options

    def max_tokens_or(self, requested: int | None, default: int) -> int:
        """``max_tokens`` of the core request: the one ``requested``, else the server's ``default``
        raised to ``min_tokens`` (vLLM's default is the whole room; the engine caps it by the room)."""
        return requested or max(default, self.min_tokens)

    @model_validator(mode="after")
    def _one_constraint(self) -> _Sampling:
        if self.structured_outputs is not None:  # vLLM's current spelling, read as the guided_* fields
            wanted = self.structured_outputs.constraint()
            older = self._older_constraint()
            if older is not None and older != wanted:
                raise ValueError(f"'structured_outputs' asks for {sorted(wanted)[0]!r} but the request also asks for "
                                 f"{sorted(older)[0]!r} (guided_* or response_format): give one output constraint, "
                                 "or the same one in both spellings")
            if older is None:
                kind, value = next(iter(wanted.items()))
                if kind == "json_object":
                    self.response_format = ResponseFormat(type="json_object")
                else:
                    setattr(self, {"json": "guided_json", "regex": "guided_regex", "choice": "guided_choice"}[kind],
                            value)
            self.structured_outputs = None
        given = [k for k in ("guided_json", "guided_regex", "guided_choice") if getattr(self, k) is not None]
        if self.response_format is not None and self.response_format.type != "text":
            given.insert(0, "response_format")
        if len(given) > 1:
            raise ValueError(f"'{given[1]}' cannot be combined with '{given[0]}': give at most one output constraint")
        return self


# ---------------------------------------------------------------------- tools
class FunctionDefinition(_OpenAIRequest):
    """``tools[i].function``: the tool's name, description and JSON schema of its arguments."""

    name: Annotated[Text, Field(min_length=1, max_length=64)]
    description: Text | None = None
    parameters: JSONObject | None = None
    strict: StrictBool | None = None


class ToolDefinition(_OpenAIRequest):
    """``{"type": "function", "function": {...}}``."""

    type: Literal["function"] = "function"
    function: FunctionDefinition

    def core(self) -> dict[str, Any]:
        """The OpenAI form the core's ``ToolSpec.from_openai`` reads."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


class NamedFunction(_OpenAIRequest):
    name: Annotated[Text, Field(min_length=1, max_length=64)]


class NamedToolChoice(_OpenAIRequest):
    """``{"type": "function", "function": {"name": ...}}``: force a call of this tool."""

    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCall(_OpenAIRequest):
    """The called function of an assistant's tool call."""

    name: Annotated[Text, Field(min_length=1, max_length=64)]
    arguments: Text | JSONObject = "{}"
    """JSON text of the arguments (an object is accepted and serialised)."""


class ToolCallIn(_OpenAIRequest):
    """One tool call of an earlier assistant message."""

    id: Annotated[Text, Field(min_length=1, max_length=256)]
    type: Literal["function"] = "function"
    function: FunctionCall

    def core(self) -> dict[str, Any]:
        arguments = self.function.arguments
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": arguments}}


# ---------------------------------------------------------------------- chat
class ChatMessage(_OpenAIRequest):
    """One chat message (``developer`` counts as ``system``)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    """Who said it."""
    content: Text | list[JSONObject] | None = None
    """The text, or a list of ``{"type": "text", "text": ...}`` parts; None on an assistant
    message that only calls tools."""
    name: Text | None = None
    """A participant's name (ignored), or the tool's name on a ``tool`` message."""
    tool_calls: list[ToolCallIn] | None = Field(None, max_length=MAX_TOOLS)
    """An assistant message's tool calls."""
    tool_call_id: Annotated[Text, Field(min_length=1, max_length=256)] | None = None
    """On a ``tool`` message: the id of the call this is the result of."""

    @field_validator("content")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        if isinstance(value, list):
            for index, part in enumerate(value):
                kind = part.get("type")
                if kind != "text" or not isinstance(part.get("text"), str):
                    shown = repr(kind) if isinstance(kind, str) and len(kind) <= 40 else type(kind).__name__
                    raise ValueError(
                        f"part [{index}] must be {{'type': 'text', 'text': str}} (got type {shown}); "
                        "this server takes text only"
                    )
        return value

    @model_validator(mode="after")
    def _roles(self) -> ChatMessage:
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a 'tool' message needs 'tool_call_id': the id of the assistant's call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only an 'assistant' message may hold 'tool_calls' (got role {self.role!r})")
        return self

    def text(self) -> str:
        """The content as one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part["text"] for part in self.content)

    def core(self) -> dict[str, Any]:
        """The message as the core's :class:`~gpuprompt.llm.GenerationRequest` takes it."""
        if self.role in ("system", "developer"):
            return {"role": "system", "content": self.text()}
        if self.role == "tool":
            message = {"role": "tool", "content": self.text(), "tool_call_id": self.tool_call_id}
            if self.name is not None:
                message["name"] = self.name
            return message
        if self.role == "assistant" and self.tool_calls:
            return {"role": "assistant", "content": None if self.content is None else self.text(),
                    "tool_calls": [call.core() for call in self.tool_calls]}
        return {"role": self.role, "content": self.text()}


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    model: ModelName | None = None
    """The chat model (see ``GET /v1/models``); None for the served one."""
    messages: list[ChatMessage] = Field(min_length=1)
    """The conversation so far."""
    max_tokens: TokenCount | None = None
    """Most tokens to generate (deprecated by OpenAI in favour of ``max_completion_tokens``)."""
    max_completion_tokens: TokenCount | None = None
    """Most tokens to generate; wins over ``max_tokens``."""
    n: Choices = 1
    """Choices to generate (1 when streaming)."""
    stream: StrictBool = False
    """Answer with server-sent events."""
    stream_options: StreamOptions | None = None
    """``{"include_usage": true}`` for a usage chunk at the end of a stream."""
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)
    """Functions the model may call."""
    tool_choice: Literal["auto", "required", "none"] | NamedToolChoice | None = None
    """``auto`` (default with tools), ``required``, ``none`` or one named tool."""
    parallel_tool_calls: StrictBool | None = None
    """False: at most one call per reply (default True)."""
    logprobs: StrictBool | None = None
    """Refused when true (no log-probabilities here)."""
    top_logprobs: int | None = None
    """Refused when given."""
    functions: list[JSONObject] | None = None
    """Refused: the deprecated form of ``tools``."""
    function_call: Text | JSONObject | None = None
    """Refused: the deprecated form of ``tool_choice``."""
    modalities: list[Text] | None = None
    """Only ``["text"]``."""
    audio: JSONObject | None = None
    """Refused (text only)."""
    prediction: JSONObject | None = None
    """Ignored (a latency hint of OpenAI's; the output does not depend on it)."""

    @model_validator(mode="after")
    def _forced_needs_tools(self) -> ChatCompletionRequest:
        if not self.tools and (isinstance(self.tool_choice, NamedToolChoice) or self.tool_choice == "required"):
            raise ValueError("'tool_choice' forces a tool call but 'tools' is empty: send the tool definitions")
        return self

    def core_tools(self) -> dict[str, Any]:
        """The tool keywords of the core request (empty without tools)."""
        if not self.tools:
            return {}
        choice: Any = self.tool_choice or "auto"
        if isinstance(choice, NamedToolChoice):
            choice = {"type": "function", "function": {"name": choice.function.name}}
        return {
            "tools": [tool.core() for tool in self.tools],
            "tool_choice": choice,
            "parallel_tool_calls": True if self.parallel_tool_calls is None else self.parallel_tool_calls,
        }


class ChatUsage(UsageModel):
    """Token counts of a generation, with the prompt tokens the prefix cache served."""

    prompt_tokens_details: dict[str, int] = Field(default_factory=lambda: {"cached_tokens": 0})
    """``{"cached_tokens": n}``: prompt tokens read from the prefix cache (vLLM's or the transformers backend's)."""


class ToolCallOut(BaseModel):
    """A tool call in a reply."""

    id: str
    type: Literal["function"] = "function"
    function: dict[str, str]
    """``{"name": ..., "arguments": JSON text}`` (partial text for a call cut by ``max_tokens``)."""


class ChatChoiceMessage(BaseModel):
    """The generated message."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    """The text; None when the reply only calls tools."""
    refusal: None = None
    tool_calls: list[ToolCallOut] | None = Field(None, exclude_if=lambda v: v is None)
    """The calls, when the model called tools (``finish_reason`` is then ``"tool_calls"``; or
    ``"length"`` when ``max_tokens`` cut the last call short: its ``arguments`` are then the text
    generated so far, as vLLM's server and OpenAI return a cut call)."""


class ChatChoice(BaseModel):
    """One choice."""

    index: int
    message: ChatChoiceMessage
    finish_reason: str
    logprobs: None = None
    stop_reason: int | str | None = None
    """vLLM's field: the ``stop_token_ids`` token or stop string that ended a ``"stop"`` reply
    (null for the end-of-sequence token and every other finish)."""


class ChatCompletionResponse(BaseModel):
    """The answer to a non-streaming ``POST /v1/chat/completions``."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    system_fingerprint: str | None = None


# ---------------------------------------------------------------------- completions
class CompletionRequest(_Sampling):
    """``POST /v1/completions``: raw text continuation (no chat template)."""

    model: ModelName | None = None
    """The chat model (see ``GET /v1/models``); None for the served one."""
    prompt: Text | list[Text] | list[int] | list[list[int]]
    """A text, or a list of texts (one choice each); token-id prompts are refused."""
    max_tokens: TokenCount | None = None
    """Most tokens to generate per prompt (default: the server's ``--default-max-tokens``)."""
    n: Choices = 1
    """Must be 1: send a prompt several times (a list) for several continuations."""
    best_of: Choices | None = None
    """Must be None or 1."""
    stream: StrictBool = False
    """Answer with server-sent events (one prompt only)."""
    stream_options: StreamOptions | None = None
    """``{"include_usage": true}`` for a usage chunk at the end of a stream."""
    echo: StrictBool = False
    """Put the prompt before the generated text."""
    logprobs: int | None = None
    """Refused when given (no log-probabilities here)."""
    suffix: Text | None = None
    """Refused when non-empty (no fill-in-the-middle)."""

    @field_validator("prompt")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("must hold at least one prompt (got an empty list)")
            if len(value) > 64:
                raise ValueError(f"must hold at most 64 prompts (got {len(value)}); split the request")
        return value


class CompletionChoice(BaseModel):
    """One continuation."""

    index: int
    text: str
    logprobs: None = None
    finish_reason: str
    stop_reason: int | str | None = None
    """vLLM's field: the stop token id or stop string that ended a ``"stop"`` reply."""


class CompletionResponse(BaseModel):
    """The answer to a non-streaming ``POST /v1/completions``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: ChatUsage
    system_fingerprint: str | None = None
