"""Type translation for :class:`~langchain_gpuprompt.ChatGPUPrompt`: LangChain messages, tools and
tool choices to the core's request fields, and core results / stream deltas back to LangChain
messages. No prompt format and no parser here: both live in the core (``gpuprompt.llm``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import InputTypeError, InvalidInputError, describe
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.utils.function_calling import convert_to_json_schema

if TYPE_CHECKING:
    from gpuprompt.llm import GenerationResult, StreamDelta, Usage

__all__ = [
    "PROVIDER",
    "chat_result",
    "core_messages",
    "core_tool_choice",
    "delta_chunk",
    "json_schema",
    "message_text",
    "usage_metadata",
]

PROVIDER = "gpuprompt"
"""``response_metadata["model_provider"]`` of every reply."""


def message_text(message: BaseMessage, position: int) -> str:
    """The text of ``message``; tool-call and reasoning blocks are skipped, images refused."""
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, Mapping) and block.get("type") in ("tool_use", "tool_call", "reasoning", "thinking"):
            continue  # carried by tool_calls / not part of the visible text
        else:
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise InvalidInputError(
                f"'messages[{position}]' holds a {kind!r} content block; this chat model takes text only "
                "(send the text, or describe the image/file in words)."
            )
    return "".join(parts)


def core_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as core chat messages: AI tool calls become assistant ``tool_calls``,
    a ``ToolMessage`` a ``"tool"`` turn with its ``tool_call_id``."""
    core: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        if not isinstance(message, BaseMessage):
            raise InputTypeError(f"'messages[{position}]' must be a BaseMessage (got {describe(message)}).")
        text = message_text(message, position)
        if isinstance(message, SystemMessage):
            core.append({"role": "system", "content": text})
        elif isinstance(message, HumanMessage):
            core.append({"role": "user", "content": text})
        elif isinstance(message, AIMessage):
            turn: dict[str, Any] = {"role": "assistant", "content": text}
            if message.tool_calls:
                turn["tool_calls"] = [
                    {"id": call.get("id"), "type": "function",
                     "function": {"name": call["name"], "arguments": call.get("args") or {}}}
                    for call in message.tool_calls
                ]
            core.append(turn)
        elif isinstance(message, ToolMessage):
            turn = {"role": "tool", "content": text, "tool_call_id": message.tool_call_id}
            if message.name:
                turn["name"] = message.name
            core.append(turn)
        elif isinstance(message, ChatMessage) and message.role in ("system", "user", "assistant"):
            core.append({"role": message.role, "content": text})
        else:
            raise InvalidInputError(
                f"'messages[{position}]' must be a system, human, AI or tool message (got a {type(message).__name__})."
            )
    return core


def core_tool_choice(tool_choice: Any) -> Any:
    """LangChain's ``tool_choice`` spellings in the core's terms (the core validates the result):
    None/``"auto"`` -> ``"auto"``; ``"any"``/``"required"``/True -> ``"required"``;
    ``"none"``/False -> ``"none"``; a tool name or an OpenAI/Anthropic-style dict -> the name."""
    if tool_choice is None:
        return "auto"
    if tool_choice is True or tool_choice == "any":
        return "required"
    if tool_choice is False:
        return "none"
    if isinstance(tool_choice, Mapping) and "function" not in tool_choice and isinstance(tool_choice.get("name"), str):
        return tool_choice["name"]  # {"type": "tool", "name": ...}
    return tool_choice


def json_schema(schema: Mapping[str, Any] | type) -> dict[str, Any]:
    """The JSON schema of a pydantic class, TypedDict, OpenAI tool/function dict or schema dict."""
    if isinstance(schema, Mapping) and "function" in schema and schema.get("type") == "function":
        return dict(schema["function"].get("parameters") or {})
    converted = convert_to_json_schema(schema)
    if "parameters" in converted and "properties" not in converted:
        return dict(converted["parameters"])  # an OpenAI function dict
    return converted


def usage_metadata(usage: Usage | None) -> UsageMetadata | None:
    """Core token counts as LangChain usage; prefix-cache hits as ``input_token_details.cache_read``."""
    if usage is None:
        return None
    metadata = UsageMetadata(
        input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens
    )
    cached = getattr(usage, "cached_tokens", 0)
    if cached > 0:
        metadata["input_token_details"] = InputTokenDetails(cache_read=cached)
    return metadata


def _metadata(model: str, finish_reason: str | None) -> dict[str, Any]:
    return {"model_provider": PROVIDER, "model_name": model, "finish_reason": finish_reason}


def chat_result(result: GenerationResult) -> ChatResult:
    """A core result as one ``ChatGeneration``: text, typed tool calls, usage and metadata.

    A call cut short by ``max_tokens`` (``finish_reason`` ``"length"``; the core marks it
    ``incomplete``) goes to ``invalid_tool_calls`` with its partial argument text, as
    langchain-openai files a call whose arguments do not parse."""
    metadata = _metadata(result.model, result.finish_reason)
    calls, invalid = [], []
    for call in getattr(result, "tool_calls", ()):
        try:
            calls.append({"name": call.name, "args": call.args, "id": call.id, "type": "tool_call"})
        except ValueError as exc:  # a cut call (or a foreign engine's unparsable arguments)
            invalid.append({"name": call.name, "args": call.arguments, "id": call.id, "error": str(exc),
                            "type": "invalid_tool_call"})
    message = AIMessage(
        content=result.text,
        tool_calls=calls,
        invalid_tool_calls=invalid,
        usage_metadata=usage_metadata(result.usage),
        response_metadata=metadata,
    )
    return ChatResult(generations=[ChatGeneration(message=message, generation_info=dict(metadata))])


def delta_chunk(delta: StreamDelta, model: str) -> ChatGenerationChunk:
    """A core stream delta as a chunk: text, ``tool_call_chunks`` (one per call index; the
    argument fragments concatenate when chunks are added), and on the last one usage and metadata.

    A call cut short by ``max_tokens`` arrives as chunks with its partial argument text, as
    langchain-openai streams it; LangChain's chunk merge then parses partial JSON as far as it goes
    (the last chunk's ``finish_reason`` is ``"length"``)."""
    chunks = [
        {"name": part.name, "args": part.arguments, "id": part.id, "index": part.index, "type": "tool_call_chunk"}
        for part in getattr(delta, "tool_calls", ())
    ]
    if delta.finish_reason is None:
        return ChatGenerationChunk(
            message=AIMessageChunk(content=delta.text, tool_call_chunks=chunks,
                                   response_metadata={"model_provider": PROVIDER})
        )
    metadata = _metadata(model, delta.finish_reason)
    return ChatGenerationChunk(
        message=AIMessageChunk(
            content=delta.text,
            tool_call_chunks=chunks,
            usage_metadata=usage_metadata(delta.usage),
            response_metadata=metadata,
            chunk_position="last",
        ),
        generation_info=dict(metadata),
    )
