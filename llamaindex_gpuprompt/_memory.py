"""GPUPromptContextMemoryBlock: a LlamaIndex ``Memory`` block over gpuprompt's ``ContextCache``.

Turns flushed from short-term memory are embedded once, when stored; later reads pick a session's
most relevant past turns with one product against the device-resident turn embeddings. Tool calls
and their results are stored as such and rendered together, one line per call with its result. The block
gets its runtime once (:func:`gpuprompt.connect`): with ``base_url`` (or ``GPUPROMPT_URL``) the
turns live in a running ``gpuprompt serve`` (a ``RemoteContextCache``), else in the process's shared
ContextCache; it then only delegates (:class:`gpuprompt.protocols.ContextLike`).
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, describe
from gpuprompt.protocols import ContextLike
from gpuprompt.runtime import connect
from gpuprompt.validation import INT64_MAX, check_str, configuration_error, fail
from llama_index.core.base.llms.types import ChatMessage, TextBlock
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr, ValidationError, field_validator
from llama_index.core.memory.memory import BaseMemoryBlock

from llamaindex_gpuprompt._llm_tools import _message_calls, _openai_call, _tool_result

if TYPE_CHECKING:
    from gpuprompt.context import Turn

__all__ = ["GPUPromptContextMemoryBlock"]

_MAX_WIDTH = 10_000
"""Widest format-spec number a ``turn_template`` may use."""

# ContextCache keeps the LLM's roles; LlamaIndex has aliases of them. A tool or function result is a
# "tool" turn, as GPUPromptLLM sends it.
_ROLE_MAP = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "chatbot": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
}


def _message_text(message: ChatMessage) -> str:
    return "".join(block.text for block in message.blocks if isinstance(block, TextBlock))


class GPUPromptContextMemoryBlock(BaseMemoryBlock[str]):
    """Long-term memory block: a session's most relevant past turns, from gpuprompt's ContextCache.

    Put it in a LlamaIndex ``Memory``: when the short-term chat history overflows its token limit,
    the flushed turns are stored here (embedded once, kept on the device); on every read the block
    embeds only the new query and returns the past turns most similar to it, oldest first. Sessions
    never see each other's turns.

    Roles: system and developer messages are stored as ``"system"``, assistant, chatbot and model
    messages as ``"assistant"`` (with their tool calls: ``ToolCallBlock``s, else
    ``additional_kwargs["tool_calls"]``), user messages as ``"user"``, and tool and function
    messages as ``"tool"`` turns with ``additional_kwargs["tool_call_id"]`` and ``["name"]`` --
    the same translation :class:`GPUPromptLLM` applies when it sends messages. A message with no
    text and no tool call (a tool result aside) is not stored.

    Rendering: each returned turn is ``turn_template`` with its role and text, except that a tool
    call and its result are rendered together, as one ``assistant`` line per call:
    ``called <name>(<arguments>) -> <result>`` (``-> error: <result>`` when the tool failed; no
    arrow while the result is not stored). The window returns a call with its results or neither,
    and never a result whose call is gone.

    Example:
        >>> from llama_index.core.memory import Memory
        >>> from llamaindex_gpuprompt import GPUPromptContextMemoryBlock
        >>> memory = Memory.from_defaults(
        ...     session_id="customer-42", token_limit=2000,
        ...     memory_blocks=[GPUPromptContextMemoryBlock(max_turns=4)],
        ... )
        >>> # use `memory` in a chat engine or agent as usual
        >>> shared = GPUPromptContextMemoryBlock(base_url="http://127.0.0.1:8000")  # a gpuprompt serve's turns

    How long turns are kept: the default cache holds them in this process's memory, so a restart
    loses them, and it drops a session idle for an hour (``ttl_seconds=3600``), keeping at most
    1,000 turns per session and 10,000 sessions (``ContextCache``'s defaults; LlamaIndex's
    ``VectorMemoryBlock`` keeps turns as long as its vector store does). For memory that lasts, pass
    ``context_cache=connect().context_cache(store=RedisStore(url))`` (turns written through to
    Redis, kept as long as the store's ``ttl_s``), or use remote mode against a server started with
    ``--redis-url``.

    Remote mode: with ``base_url`` (or ``GPUPROMPT_URL``, and ``GPUPROMPT_API_KEY``) the turns live
    in a running ``gpuprompt serve``, shared by every worker that names the same server and session
    id (and with LangChain's ``GPUPromptChatMessageHistory`` there); the server embeds and ranks
    them, this process imports no torch and loads no model. Session ids are then at most 1022
    characters long.

    Args:
        context_cache: the :class:`gpuprompt.ContextCache` to use (default: the runtime's shared
            one, ``get_runtime().context_cache()``, so a session id sees the same turns here as in
            LangChain's ``GPUPromptChatMessageHistory`` in this process); a
            :class:`gpuprompt.remote.RemoteContextCache` works too. Not with ``base_url``.
        **kwargs: the fields below and those of ``BaseMemoryBlock``.

    Raises:
        ConfigurationError: a field of the wrong type or out of range, a ``context_cache`` of the
            wrong type or together with ``base_url`` / ``api_key``, an ``api_key`` without a
            server, or a malformed URL or key.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    # Strict ints: pydantic would otherwise take True as 1 and 2.0 as 2.
    name: str = Field(default="RelevantHistory", description="The name of the memory block.")
    max_turns: int = Field(default=4, ge=1, le=INT64_MAX, strict=True, description="Most past turns returned per read.")
    max_tokens: int | None = Field(
        default=None, ge=0, le=INT64_MAX, strict=True, description="Token budget of the returned turns; None: none."
    )
    recent: int = Field(
        default=0,
        ge=0,
        le=INT64_MAX,
        strict=True,
        description="How many of the latest stored turns are always included (0: purely by relevance).",
    )
    query_messages: int = Field(
        default=1, ge=1, le=INT64_MAX, strict=True, description="How many of the latest messages form the query."
    )
    turn_template: str = Field(default="{role}: {text}", description="How one returned turn is rendered.")
    default_session_id: str = Field(
        default="default", description="Session used when the memory passes none (a bare block)."
    )
    base_url: str | None = Field(
        default=None,
        description="A running gpuprompt serve to keep the turns in (remote mode); None: GPUPROMPT_URL or in process.",
    )
    api_key: str | None = Field(default=None, exclude=True, repr=False, description="The server's API key (remote mode).")
    timeout: float | None = Field(
        default=None, description="Remote mode: seconds a request to the server may wait for an answer (None reads "
        "GPUPROMPT_TIMEOUT, else 60).")

    _cache: ContextLike | None = PrivateAttr(default=None)

    @field_validator("turn_template")
    @classmethod
    def _check_template(cls, value: str) -> str:
        check_str(value, "turn_template", error=ConfigurationError)
        try:
            fields = [(name, spec or "") for _, name, spec, _ in string.Formatter().parse(value) if name is not None]
        except ValueError as exc:
            raise _template_error(value, exc) from None
        for name, spec in fields:
            # Only the two fields, and a format spec that cannot allocate without bound: a width
            # such as {text:>99999999999}, or one taken from the message ({role:{text}}), would.
            numbers = re.findall(r"\d+", spec)
            if name not in ("role", "text") or "{" in spec or any(len(n) > 5 or int(n) > _MAX_WIDTH for n in numbers):
                field = "{" + name + (":" + spec if spec else "") + "}"
                raise _template_error(value, f"field {field} is not {{role}} or {{text}} with a width <= {_MAX_WIDTH}")
        _render(value, "user", "text")  # a conversion or spec that fails, fails now, not on a read
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return check_str(value, "name", error=ConfigurationError)

    @field_validator("default_session_id")
    @classmethod
    def _check_session(cls, value: str) -> str:
        from gpuprompt.context import check_session_id

        return check_session_id(value, "default_session_id")

    def __init__(self, *, context_cache: ContextLike | None = None, **kwargs: Any) -> None:
        if context_cache is not None and not isinstance(context_cache, ContextLike):
            raise ConfigurationError(
                f"'context_cache' must be a gpuprompt.ContextCache, a gpuprompt.remote.RemoteContextCache or "
                f"None (got {describe(context_cache)})."
            )
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:  # a field of the wrong type: our typed error, naming it
            raise configuration_error(exc, "GPUPromptContextMemoryBlock") from exc
        if context_cache is not None:
            if self.base_url is not None or self.api_key is not None:
                raise ConfigurationError(
                    "GPUPromptContextMemoryBlock got both 'context_cache' and 'base_url' / 'api_key': pass a "
                    "context_cache to keep turns in it, or base_url (and api_key) to keep them in a gpuprompt serve."
                )
        else:
            runtime = connect(self.base_url, api_key=self.api_key, timeout=self.timeout,
                              owner="GPUPromptContextMemoryBlock")
            if runtime.remote:
                self.base_url, self.api_key = runtime.config.base_url, runtime.config.api_key
            context_cache = runtime.context_cache()  # the process's shared cache, or the server's memory
        # The cache's rule (a server's keys are "@/<id>"): a default accepted here never fails there.
        try:
            context_cache.check_session_id(self.default_session_id, "default_session_id")
        except InvalidInputError as exc:  # a field, as in process: a configuration error
            raise ConfigurationError(str(exc)) from None
        self._cache = context_cache

    @property
    def context_cache(self) -> ContextLike:
        """The core ContextCache holding the turns (the runtime's shared one unless given; in remote
        mode the server's, through a :class:`gpuprompt.remote.RemoteContextCache`)."""
        assert self._cache is not None
        return self._cache

    async def aput(
        self, messages: list[ChatMessage], from_short_term_memory: bool = False, session_id: str | None = None
    ) -> None:
        """Store ``messages`` (embedded once) under ``session_id`` (default: ``default_session_id``).

        Raises:
            InputTypeError: ``messages`` is not a list of ``ChatMessage``, or ``session_id`` is not a str.
            InvalidInputError: a message text or ``session_id`` holds a lone surrogate, or
                ``session_id`` is empty. Nothing is stored then.
        """
        _messages(messages)
        if session_id is not None:
            self._check_session_id(session_id, "session_id")
        await super().aput(messages, from_short_term_memory=from_short_term_memory, session_id=session_id)

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        messages = _messages(messages, allow_none=True)
        session_id = self._session(block_kwargs.get("session_id"), "session_id")
        recent_messages = [m for m in (messages or []) if _message_text(m)][-self.query_messages :]
        query = " ".join(_message_text(m) for m in recent_messages) or None
        if query is None and self.recent == 0:
            return ""
        turns = await self.context_cache.awindow(
            session_id, query=query, max_turns=self.max_turns, max_tokens=self.max_tokens, recent=self.recent
        )
        return _render_turns(self.turn_template, turns)

    def _session(self, value: Any, name: str) -> str:
        """The session a call or message names (None or "": the default), as the cache accepts it."""
        if value is None or (isinstance(value, str) and not value):
            return self.default_session_id
        return self._check_session_id(value, name)

    def _check_session_id(self, value: Any, name: str) -> str:
        """The cache's rule for a session id (the server's, in remote mode)."""
        return self.context_cache.check_session_id(value, name)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        # Every message is checked before anything is stored: a refused call stores nothing.
        by_session: dict[str, list[dict[str, Any]]] = {}
        for i, message in enumerate(_messages(messages)):
            # BaseMemoryBlock.aput tags each message with the memory's session id.
            session_id = self._session(
                message.additional_kwargs.get("session_id"), f"messages[{i}].additional_kwargs['session_id']"
            )
            turn = _turn(message, i)
            if turn is not None:
                by_session.setdefault(session_id, []).append(turn)
        for message in messages:
            message.additional_kwargs.pop("session_id", None)  # checked: now untag
        for session_id, turns in by_session.items():
            await self.context_cache.aextend(session_id, turns)


def _turn(message: ChatMessage, index: int) -> dict[str, Any] | None:
    """The core turn of one message (None: nothing to store), as GPUPromptLLM would send it."""
    text = check_str(_message_text(message), f"messages[{index}].content")
    role = _ROLE_MAP.get(str(getattr(message.role, "value", message.role)), "user")
    if role == "tool":
        return _tool_result(message, index, text)
    calls = _message_calls(message, index) if role == "assistant" else []
    if calls:
        return {"role": "assistant", "content": text, "tool_calls": [_openai_call(*call) for call in calls]}
    return {"role": role, "content": text} if text else None


def _render_turns(template: str, turns: Sequence[Turn]) -> str:
    """The turns, one rendered line each, but a tool call and its result as one ``assistant`` line
    per call. A result joins its call by ``tool_call_id``, or, without one, the next unanswered
    call of the call turn before it."""
    results: dict[int, Turn] = {}  # index of a result -> claimed
    answer: dict[tuple[int, int], Turn] = {}  # (turn index, call position) -> its result
    by_id: dict[str, tuple[int, int]] = {}
    open_calls: list[tuple[int, int]] = []
    for turn in turns:
        if turn.role == "tool":
            key = by_id.get(turn.tool_call_id) if turn.tool_call_id else (open_calls[0] if open_calls else None)
            if key is not None and key not in answer:
                answer[key] = results[turn.index] = turn
                if key in open_calls:
                    open_calls.remove(key)
            continue
        open_calls = [(turn.index, j) for j in range(len(turn.tool_calls))]
        by_id.update({call.id: (turn.index, j) for j, call in enumerate(turn.tool_calls)})
    lines = []
    for turn in turns:
        if turn.index in results:
            continue
        if turn.text or not turn.tool_calls:
            lines.append(_render(template, turn.role, turn.text))
        for j, call in enumerate(turn.tool_calls):
            text = f"called {call.name}({call.arguments})"
            result = answer.get((turn.index, j))
            if result is not None:
                text += f" -> {'error: ' if result.status == 'error' else ''}{result.text}"
            lines.append(_render(template, "assistant", text))
    return "\n".join(lines)


def _messages(messages: Any, *, allow_none: bool = False) -> list[ChatMessage] | None:
    if messages is None and allow_none:
        return None
    if isinstance(messages, (ChatMessage, str, bytes)) or not isinstance(messages, Sequence):
        raise fail(
            "messages", "a list of ChatMessage" + (" or None" if allow_none else ""), messages, error=InputTypeError
        )
    for i, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise fail(f"messages[{i}]", "a ChatMessage", message, error=InputTypeError)
    return list(messages)


def _render(template: str, role: str, text: str) -> str:
    try:
        return template.format(role=role, text=text)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise _template_error(template, exc) from None


def _template_error(template: str, problem: object) -> ConfigurationError:
    reason = f"{type(problem).__name__}: {problem}" if isinstance(problem, Exception) else str(problem)
    return ConfigurationError(
        f"'turn_template' must be a str.format template using only {{role}} and {{text}} "
        f"(got {describe(template)}: {reason})."
    )
