"""Type translation for GPUPromptLLM: LlamaIndex chat messages, tools and tool calls <-> the core's.

Only conversion lives here. The prompt format of tools, the parser of calls and the constrained
decoding that makes a forced call well-formed are the core's (:mod:`gpuprompt.llm`).

Where LlamaIndex keeps tool calls: an assistant ``ChatMessage`` holds one ``ToolCallBlock`` per call
in ``blocks`` (what ``llama-index-llms-openai`` writes and reads first) and the same calls as
OpenAI-shaped dicts in ``additional_kwargs["tool_calls"]`` (what older integrations and
``process_streaming_objects`` read). A tool result is a ``MessageRole.TOOL`` message whose
``additional_kwargs["tool_call_id"]`` names the call it answers (what ``FunctionAgent`` writes).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import InputTypeError, InvalidInputError, describe
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.llms.utils import parse_partial_json
from llama_index.core.tools.types import BaseTool

if TYPE_CHECKING:
    from gpuprompt.llm import StreamDelta, ToolSpec

__all__ = [
    "ToolCallAccumulator",
    "assistant_message",
    "check_messages",
    "resolve_tool_choice",
    "to_core_messages",
    "to_tool_specs",
    "tool_selections",
]

# The core's roles; LlamaIndex has aliases of them. FUNCTION is the legacy name of a tool result.
_ROLE_MAP = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}

# (id, name, arguments as JSON text) of one call: the form both directions share.
Call = tuple[str, str, str]


# ------------------------------------------------------------------ messages -> core
def check_messages(messages: Any) -> None:
    """Refuse anything but a list of ``ChatMessage`` (a bare str or message would be iterated)."""
    if isinstance(messages, (str, ChatMessage)) or not isinstance(messages, Sequence):
        raise InputTypeError(f"'messages' must be a list of ChatMessage (got {describe(messages)}).")
    for i, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise InputTypeError(f"'messages[{i}]' must be a ChatMessage (got {describe(message)}).")


def to_core_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The core's message dicts for a LlamaIndex conversation (text, tool calls, tool results).

    Raises:
        InputTypeError: ``messages`` is not a list of ChatMessage.
        InvalidInputError: non-text content, a tool call outside an assistant message, or a tool
            result whose ``additional_kwargs["tool_call_id"]`` is not a str.
    """
    check_messages(messages)
    converted = []
    for i, message in enumerate(messages):
        role = _ROLE_MAP.get(MessageRole(message.role), "user")
        other = sorted(
            {type(b).__name__ for b in message.blocks if not isinstance(b, (TextBlock, ToolCallBlock))}
        )
        if other:
            raise InvalidInputError(
                f"'messages[{i}]' must hold text only (got {other}); this model reads text, so pass the "
                "other content as text or drop it."
            )
        text = "".join(block.text for block in message.blocks if isinstance(block, TextBlock))
        calls = _message_calls(message, i)
        if calls and role != "assistant":
            raise InvalidInputError(
                f"'messages[{i}]' holds tool calls but its role is {MessageRole(message.role).value!r}: only an "
                "assistant message can call tools; send the results as role='tool' messages."
            )
        if role == "tool":
            converted.append(_tool_result(message, i, text))
        elif calls:
            converted.append(
                {
                    "role": "assistant",
                    "content": text or None,
                    "tool_calls": [_openai_call(call_id, name, args) for call_id, name, args in calls],
                }
            )
        else:
            converted.append({"role": role, "content": text})
    return converted


def _tool_result(message: ChatMessage, index: int, text: str) -> dict[str, Any]:
    extra = message.additional_kwargs
    call_id = extra.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidInputError(
            f"'messages[{index}].additional_kwargs[\"tool_call_id\"]' must be the str id of the call this tool "
            f"result answers (got {describe(call_id)}); copy it from the ToolSelection.tool_id you ran."
        )
    result: dict[str, Any] = {"role": "tool", "content": text}
    if call_id:
        result["tool_call_id"] = call_id
    name = extra.get("name") or extra.get("tool_name")
    if isinstance(name, str) and name:
        result["name"] = name
    return result


def _message_calls(message: ChatMessage, index: int) -> list[Call]:
    """The calls an assistant message holds: its ToolCallBlocks, else ``additional_kwargs["tool_calls"]``."""
    blocks = [block for block in message.blocks if isinstance(block, ToolCallBlock)]
    if blocks:
        return [(b.tool_call_id or "", b.tool_name, _arguments_text(b.tool_kwargs, index)) for b in blocks]
    raw = message.additional_kwargs.get("tool_calls")
    if not raw:
        return []
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Sequence):
        raise InvalidInputError(
            f"'messages[{index}].additional_kwargs[\"tool_calls\"]' must be a list of tool calls (got {describe(raw)})."
        )
    return [_call_from_openai(call, index) for call in raw]


def _call_from_openai(call: Any, index: int) -> Call:
    """One call in OpenAI's shape, as a dict or as the ``openai`` SDK's object."""
    if isinstance(call, Mapping):
        function = call.get("function") or {}
        call_id, name, args = call.get("id"), function.get("name"), function.get("arguments")
    else:
        function = getattr(call, "function", None)
        call_id, name, args = getattr(call, "id", None), getattr(function, "name", None), getattr(function, "arguments", None)
    if not isinstance(name, str):
        raise InvalidInputError(
            f"'messages[{index}].additional_kwargs[\"tool_calls\"]' must hold OpenAI tool calls "
            f"({{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}); got {describe(call)}."
        )
    return (call_id if isinstance(call_id, str) else "", name, _arguments_text(args, index))


def _arguments_text(arguments: Any, index: int) -> str:
    if isinstance(arguments, str):
        return arguments or "{}"
    if arguments is None:
        return "{}"
    if isinstance(arguments, Mapping):
        return json.dumps(dict(arguments), ensure_ascii=False)
    raise InvalidInputError(
        f"the tool call arguments in 'messages[{index}]' must be a JSON object or its text (got {describe(arguments)})."
    )


def _openai_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ------------------------------------------------------------------ tools -> core
def to_tool_specs(tools: Any, strict: bool | None = None, *, name: str = "tools") -> list[ToolSpec]:
    """The core's ``ToolSpec`` for each LlamaIndex tool (``BaseTool``), OpenAI tool dict or ToolSpec.

    Args:
        tools: the tools.
        strict: when not None, set on every spec (schema-constrained arguments or not).
        name: the argument's name in error messages.

    Raises:
        InputTypeError: ``tools`` is not a list of tools.
        InvalidInputError: a tool's name or schema is refused by the core.
    """
    from gpuprompt.llm import ToolSpec

    if isinstance(tools, (str, bytes, Mapping, BaseTool)) or not isinstance(tools, Sequence):
        raise InputTypeError(f"'{name}' must be a list of tools (got {describe(tools)}).")
    specs = []
    for i, tool in enumerate(tools):
        if isinstance(tool, BaseTool):
            spec = ToolSpec.from_openai(tool.metadata.to_openai_tool(skip_length_check=True))
        elif isinstance(tool, ToolSpec):
            spec = tool
        elif isinstance(tool, Mapping):
            spec = ToolSpec.from_openai(tool)
        else:
            raise InputTypeError(
                f"'{name}[{i}]' must be a LlamaIndex tool (BaseTool), an OpenAI tool dict or a gpuprompt.ToolSpec "
                f"(got {describe(tool)})."
            )
        if strict is not None and spec.strict != strict:
            spec = dataclasses.replace(spec, strict=strict)
        specs.append(spec)
    return specs


def resolve_tool_choice(tool_choice: Any, tool_required: bool) -> Any:
    """LlamaIndex's two knobs as one core ``tool_choice``: an explicit choice wins, else
    ``"required"`` when a call is required, else ``"auto"``. The core validates the value."""
    if tool_choice is None:
        return "required" if tool_required else "auto"
    return tool_choice


# ------------------------------------------------------------------ core -> LlamaIndex
def assistant_message(text: str, calls: Sequence[Call]) -> ChatMessage:
    """The assistant's reply: its text, plus each call as a ToolCallBlock and an OpenAI dict."""
    if not calls:
        return ChatMessage(role=MessageRole.ASSISTANT, content=text)
    blocks: list[Any] = [TextBlock(text=text)]
    blocks += [ToolCallBlock(tool_call_id=call_id, tool_name=name, tool_kwargs=args) for call_id, name, args in calls]
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        blocks=blocks,
        additional_kwargs={"tool_calls": [_openai_call(*call) for call in calls]},
    )


def tool_selections(message: ChatMessage) -> list[ToolSelection]:
    """The calls of an assistant message as ``ToolSelection``s (partial JSON arguments, as in a
    stream, are parsed as far as they go)."""
    return [
        ToolSelection(tool_id=call_id, tool_name=name, tool_kwargs=_parse_arguments(args))
        for call_id, name, args in _message_calls(message, 0)
    ]


def _parse_arguments(arguments: str) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        try:
            parsed = parse_partial_json(arguments)
        except (ValueError, TypeError):
            parsed = {}
    return parsed if isinstance(parsed, dict) else {}


class ToolCallAccumulator:
    """Joins a stream's tool-call deltas into whole calls, by index."""

    def __init__(self) -> None:
        self._calls: dict[int, list[str]] = {}

    def add(self, delta: StreamDelta) -> None:
        """Fold one stream delta's tool-call fragments in."""
        for fragment in delta.tool_calls:
            call = self._calls.setdefault(fragment.index, ["", "", ""])
            if fragment.id:
                call[0] = fragment.id
            if fragment.name:
                call[1] = fragment.name
            call[2] += fragment.arguments

    @property
    def calls(self) -> list[Call]:
        """The calls so far (the last one's arguments may still be partial)."""
        return [(c[0], c[1], c[2]) for _, c in sorted(self._calls.items())]
