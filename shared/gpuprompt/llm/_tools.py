"""Tool calling types and their validation: :class:`ToolSpec`, :class:`ToolCall`,
:class:`ToolCallDelta`, the ``tool_choice`` normalisation and the chat-message checks.

Plain frozen dataclasses, no heavy imports. The prompt format, the decoding constraint and the
parser that turn these into model text and back live in :mod:`gpuprompt.llm._tool_format`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuprompt.errors import InputTypeError, InvalidInputError, describe
from gpuprompt.validation import check_bool, check_json, check_str, check_text, fail

__all__ = [
    "ANSWER_TOOL",
    "ROLES",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "ToolSpec",
    "check_messages",
    "check_tool_choice",
    "check_tools",
    "new_call_id",
]

ROLES = ("system", "user", "assistant", "tool")
"""The chat roles a message may carry: the one definition, also the roles a stored
:class:`~gpuprompt.ContextCache` turn may carry (a turn the cache accepts always fits a request)."""

ANSWER_TOOL = "__answer__"
"""The reserved pseudo-tool a model under ``tool_choice="auto"`` picks to reply in prose (the
constrained shape of "auto" on models whose chat template knows no tools)."""

ToolChoice = Literal["auto", "required", "none"] | str | Mapping[str, Any]
"""``"auto"`` | ``"required"`` | ``"none"`` | a tool's name | ``{"type": "function", "function":
{"name": ...}}``; normalised to the first three or a tool name."""

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_NAME_PHRASE = "1-64 characters of letters, digits, '_', '.' or '-'"
MAX_TOOLS = 128
"""Most tools one request may carry."""
MAX_DESCRIPTION = 16384
MAX_ID = 256
_EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


def new_call_id() -> str:
    """A fresh tool-call id, ``call_`` and 24 hex digits (OpenAI's shape)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _derived_call_id(where: str, tool: Any, arguments: str) -> str:
    """A stable id, in OpenAI's shape, for a call given without one."""
    import hashlib

    digest = hashlib.sha256(f"{where}\x00{tool}\x00{arguments}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"call_{digest[:24]}"


def _check_name(value: Any, name: str) -> str:
    check_str(value, name)
    if not _NAME.match(value):
        raise fail(name, _NAME_PHRASE, value)
    return value


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: its name, what it does, and the JSON schema of its arguments.

    Example:
        >>> ToolSpec("get_weather", "Weather in a city.",
        ...          {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
        ... # doctest: +ELLIPSIS
        ToolSpec(name='get_weather', ...)

    Attributes:
        name: the tool's name, 1-64 letters, digits, ``_``, ``.`` or ``-``.
        description: what the tool does (shown to the model).
        parameters: the JSON schema of the arguments object (``{"type": "object", ...}``).
        strict: the caller asks for schema-exact arguments; calls are always decoded under the
            schema here, so this only travels (OpenAI's flag).

    Raises:
        InvalidInputError: a bad name, or parameters that are not a JSON object schema.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(_EMPTY_PARAMETERS))
    strict: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name, "tool.name")
        check_str(self.description, f"tools[{self.name}].description", max_length=MAX_DESCRIPTION)
        parameters = self.parameters
        if parameters is None:
            parameters = dict(_EMPTY_PARAMETERS)
        if not isinstance(parameters, Mapping):
            raise fail(f"tools[{self.name}].parameters", "a JSON schema dict", parameters, error=InputTypeError)
        parameters = check_json(parameters, f"tools[{self.name}].parameters")
        kind = parameters.get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            raise fail(
                f"tools[{self.name}].parameters.type", "'object' (a tool takes an object of named arguments)", kind
            )
        parameters.setdefault("type", "object")
        object.__setattr__(self, "parameters", parameters)
        check_bool(self.strict, f"tools[{self.name}].strict")

    @classmethod
    def from_openai(cls, obj: Any, name: str = "tool") -> ToolSpec:
        """Build from ``{"type": "function", "function": {...}}`` or a bare ``{"name", "description",
        "parameters", "strict"}`` dict (``name`` names the value in error messages)."""
        if isinstance(obj, ToolSpec):
            return obj
        if not isinstance(obj, Mapping):
            raise fail(name, "a ToolSpec or an OpenAI tool dict {'type': 'function', 'function': {...}}", obj,
                       error=InputTypeError)
        if "function" in obj:
            if obj.get("type", "function") != "function":
                raise fail(f"{name}.type", "'function'", obj.get("type"))
            obj = obj["function"]
            name = f"{name}.function"  # errors name the field as the request holds it
            if not isinstance(obj, Mapping):
                raise fail(name, "a dict with 'name' and 'parameters'", obj, error=InputTypeError)
        unknown = sorted(str(k) for k in set(obj) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise InvalidInputError(
                f"'{name}' has unknown key(s) {unknown}; a tool takes 'name', 'description', 'parameters', 'strict'."
            )
        if "name" not in obj:
            raise InvalidInputError(f"'{name}.name' is missing; every tool needs a name.")
        strict = obj.get("strict")
        try:
            return cls(
                name=obj["name"],
                description=obj.get("description") or "",
                parameters=obj.get("parameters"),  # type: ignore[arg-type]
                strict=False if strict is None else strict,
            )
        except InvalidInputError as exc:  # the checks name the tool by its name: name it by its place
            message = str(exc).replace("'tool.name'", f"'{name}.name'", 1)
            raise type(exc)(message.replace(f"'tools[{obj['name']}].", f"'{name}.", 1)) from None

    def to_openai(self) -> dict[str, Any]:
        """``{"type": "function", "function": {"name", "description", "parameters", "strict"}}``."""
        function: dict[str, Any] = {"name": self.name, "description": self.description,
                                    "parameters": json.loads(json.dumps(self.parameters))}
        if self.strict:
            function["strict"] = True
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    """A call of a tool by the model (or in a conversation's history).

    Attributes:
        id: the call's id (``call_`` and 24 hex digits when generated here).
        name: the tool's name.
        arguments: the arguments as JSON text of an object.
        incomplete: the reply was cut short (``max_tokens`` or the context window: its
            ``finish_reason`` is ``"length"``) while the model was writing this call, as OpenAI and
            vLLM's server hand such a call out: ``arguments`` is then the text generated so far
            (often not valid JSON, possibly ``""``) and :attr:`args` raises. Only a reply's last
            call can be incomplete; calls in a conversation's history never are.
    """

    id: str
    name: str
    arguments: str
    incomplete: bool = False

    def __post_init__(self) -> None:
        check_str(self.id, "tool_call.id", allow_empty=False, max_length=MAX_ID)
        _check_name(self.name, "tool_call.name")
        check_str(self.arguments, "tool_call.arguments")
        check_bool(self.incomplete, "tool_call.incomplete")
        if self.incomplete:
            return
        try:
            value = json.loads(self.arguments)
        except ValueError:
            raise fail("tool_call.arguments", "JSON text of an object", self.arguments) from None
        if not isinstance(value, dict):
            raise fail("tool_call.arguments", "JSON text of an object", self.arguments)

    @property
    def args(self) -> dict[str, Any]:
        """The arguments, parsed.

        Raises:
            InvalidInputError: the call is :attr:`incomplete` and its arguments are not a whole JSON
                object (a ``ValueError``, as ``json.loads`` raises).
        """
        try:
            value = json.loads(self.arguments)
        except ValueError:
            if not self.incomplete:
                raise
            value = None
        if not isinstance(value, dict):
            raise InvalidInputError(
                f"the arguments of tool call {self.id!r} ({self.name}) were cut short by max_tokens (got "
                f"{describe(self.arguments)}); raise max_tokens, or read the partial text from 'arguments'."
            )
        return value

    def to_openai(self) -> dict[str, Any]:
        """``{"id", "type": "function", "function": {"name", "arguments"}}``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_openai(cls, obj: Any, name: str = "tool_call") -> ToolCall:
        """Build from an OpenAI tool-call dict (``{"id", "type", "function": {"name", "arguments"}}``)
        or a bare ``{"id", "name", "arguments"}`` dict; arguments may be JSON text or a dict; a
        missing id is generated."""
        if isinstance(obj, ToolCall):
            return obj
        if not isinstance(obj, Mapping):
            raise fail(name, "a ToolCall or an OpenAI tool-call dict", obj, error=InputTypeError)
        body = obj.get("function", obj)
        if not isinstance(body, Mapping):
            raise fail(f"{name}.function", "a dict with 'name' and 'arguments'", body, error=InputTypeError)
        arguments = body.get("arguments", {})
        if arguments is None or arguments == "":
            arguments = {}
        if isinstance(arguments, Mapping):
            arguments = json.dumps(check_json(arguments, f"{name}.arguments"), ensure_ascii=False)
        elif not isinstance(arguments, str):
            raise fail(f"{name}.arguments", "JSON text of an object or a dict", arguments, error=InputTypeError)
        # A missing id is derived from where the call sits and what it says, never drawn at random: the
        # same history must render the same prompt every time (prefix cache, seeded sampling).
        call_id = obj.get("id") or _derived_call_id(name, body.get("name"), arguments)
        try:
            return cls(id=call_id, name=body.get("name"), arguments=arguments)  # type: ignore[arg-type]
        except InvalidInputError as exc:
            raise type(exc)(str(exc).replace("'tool_call.", f"'{name}.", 1)) from None


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed tool call.

    Attributes:
        index: which call of the reply (0, 1, ...).
        id: the call's id (on the first delta of an index, else None).
        name: the tool's name (on the first delta of an index, else None).
        arguments: a fragment of the arguments' JSON text; the fragments of one index concatenate
            to the full text.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


# ---------------------------------------------------------------------- request checks
def check_tools(value: Any) -> tuple[ToolSpec, ...]:
    """Validate ``tools``: ToolSpecs or OpenAI tool dicts, unique names, none reserved."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise fail("tools", "a list of ToolSpec or OpenAI tool dicts", value, error=InputTypeError,
                   fix="Wrap a single tool in a list: [tool]." if isinstance(value, Mapping) else "")
    if len(value) > MAX_TOOLS:
        raise InvalidInputError(f"'tools' must hold at most {MAX_TOOLS} tools (got {len(value)}).")
    tools = tuple(ToolSpec.from_openai(tool, f"tools[{i}]") for i, tool in enumerate(value))
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}].function" if isinstance(value[i], Mapping) and "function" in value[i] else f"tools[{i}]"
        if tool.name == ANSWER_TOOL:
            raise InvalidInputError(f"'{where}.name' {ANSWER_TOOL!r} is reserved (the prose-reply pseudo-tool); "
                                    "rename the tool.")
        if tool.name in seen:
            raise InvalidInputError(f"'{where}.name' {tool.name!r} is used by two tools; tool names must be unique.")
        seen.add(tool.name)
    return tools


def check_tool_choice(value: Any, tools: Sequence[ToolSpec]) -> str:
    """Normalise ``tool_choice`` to ``"auto"``, ``"required"``, ``"none"`` or a bound tool's name."""
    names = [tool.name for tool in tools]
    if isinstance(value, Mapping):
        function = value.get("function")
        if value.get("type") != "function" or not isinstance(function, Mapping) or not isinstance(
            function.get("name"), str
        ):
            raise fail("tool_choice", "'auto', 'required', 'none', a tool name or {'type': 'function', 'function': "
                       "{'name': ...}}", value)
        value = function["name"]
    if not isinstance(value, str):
        raise fail("tool_choice", "'auto', 'required', 'none' or a tool name", value, error=InputTypeError)
    if value in ("auto", "none"):
        return value
    if value == "required":
        if not tools:
            raise InvalidInputError("'tool_choice' is 'required' but 'tools' is empty; pass the tools to call.")
        return value
    if value not in names:
        raise InvalidInputError(
            f"'tool_choice' must be 'auto', 'required', 'none' or one of the tools {names} (got {describe(value)})."
        )
    return value


def check_messages(messages: Any) -> tuple[dict[str, Any], ...]:
    """Validate chat messages: system/user turns, assistant turns (optionally with ``tool_calls``),
    and ``tool`` results. Returns detached dicts; assistant tool calls become :class:`ToolCall`."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InputTypeError(
            "'messages' must be a list of {'role': ..., 'content': ...} dicts (got "
            f"{describe(messages)}); for one user turn pass [{{'role': 'user', 'content': text}}]."
        )
    if not messages:
        raise InvalidInputError("'messages' must hold at least one message (got an empty list).")
    return tuple(_check_message(message, index) for index, message in enumerate(messages))


def _check_message(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise InputTypeError(f"'{where}' must be a dict with 'role' and 'content' (got {describe(message)}).")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or role not in ROLES:  # never `in` on an array-like value
        raise InvalidInputError(f"'{where}.role' must be one of {list(ROLES)} (got {describe(role)}).")
    calls = message.get("tool_calls") if role == "assistant" else None
    if content is None and calls:
        content = ""
    if not isinstance(content, str):
        raise InputTypeError(f"'{where}.content' must be a str (got {describe(content)}).")
    check_text(content, f"{where}.content")
    checked: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant" and calls is not None:
        if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
            raise fail(f"{where}.tool_calls", "a list of OpenAI tool-call dicts or ToolCall", calls,
                       error=InputTypeError)
        if len(calls) > MAX_TOOLS:
            raise InvalidInputError(f"'{where}.tool_calls' must hold at most {MAX_TOOLS} calls (got {len(calls)}).")
        if calls:
            checked["tool_calls"] = tuple(
                ToolCall.from_openai(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)
            )
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id is not None:
            checked["tool_call_id"] = check_str(call_id, f"{where}.tool_call_id", allow_empty=False,
                                                max_length=MAX_ID)
        name = message.get("name")
        if name is not None:
            checked["name"] = _check_name(name, f"{where}.name")
    return checked
