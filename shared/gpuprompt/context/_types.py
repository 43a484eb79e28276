"""The value types of conversation memory: :class:`Turn`, :class:`ContextStats`, the session ids a
cache accepts, the check of one turn to append (a ``(role, text)`` pair or a chat message dict, tool
calls and results included), and the append-only storage of one session (shared by the cache and its
store sync)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuprompt.errors import InputTypeError, InvalidInputError
from gpuprompt.llm._tools import MAX_ID, MAX_TOOLS, ROLES, ToolCall, _check_name
from gpuprompt.validation import check_choice, check_str, fail

__all__ = ["MAX_SESSIONS_LIMIT", "MAX_SESSION_ID_LENGTH", "MAX_TURNS_LIMIT", "TOOL_STATUSES", "ContextStats",
           "Session", "Turn", "check_session_id", "check_turn", "memory_text"]

MAX_SESSIONS_LIMIT = 100_000_000
"""Largest accepted ``max_sessions``."""
MAX_TURNS_LIMIT = 1_000_000
"""Largest accepted ``max_turns_per_session``."""
MAX_SESSION_ID_LENGTH = 1024
"""Longest accepted session id (the server's ``"<collection>/<session>"`` keys stay below 330)."""
TOOL_STATUSES = ("success", "error")
"""The statuses a tool result may carry (LangChain's ``ToolMessage.status``)."""


def check_session_id(value: Any, name: str = "session_id") -> str:
    """Return ``value`` if a :class:`ContextCache` accepts it as a session id: a non-empty,
    well-formed str of at most :data:`MAX_SESSION_ID_LENGTH` characters.

    For surfaces that take a session id before they reach the cache (a default session, a tag on a
    message), so a value they accept never fails at the cache later.

    Raises:
        InputTypeError: not a str.
        InvalidInputError: empty, too long, or holding a lone surrogate.
    """
    checked = check_str(value, name, allow_empty=False, max_length=MAX_SESSION_ID_LENGTH)
    assert checked is not None
    return checked


@dataclass(frozen=True)
class Turn:
    """One message of a conversation.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"`` (``gpuprompt.llm._types.ROLES``:
            a stored turn always fits a :class:`~gpuprompt.llm.GenerationRequest`).
        text: the message text (an assistant turn that only calls tools: ``""``; a ``"tool"`` turn:
            the tool's result).
        index: position in the session, counting from 0 (stable even after old turns are dropped).
        created_at: wall-clock time of the append (``time.time()``).
        tokens: the length of :func:`memory_text` under the cache's token counter.
        tool_calls: an assistant turn's tool calls (id, name, arguments as JSON text), in order.
        tool_call_id: a ``"tool"`` turn: the id of the call it is the result of.
        name: a ``"tool"`` turn: the name of the tool that ran.
        status: a ``"tool"`` turn: ``"success"`` or ``"error"`` (LangChain's ``ToolMessage.status``),
            or None when not given.
    """

    role: str
    text: str
    index: int
    created_at: float
    tokens: int
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    status: str | None = None

    @property
    def calls_tools(self) -> bool:
        """True for an assistant turn with tool calls and for a tool result: the turns a window keeps
        together (a call with its results, both or neither)."""
        return bool(self.tool_calls) or self.role == "tool"

    def as_message(self) -> dict[str, Any]:
        """The turn as a chat message dict: ``{"role": ..., "content": ...}``, plus ``tool_calls`` in
        OpenAI's shape (``{"id", "type": "function", "function": {"name", "arguments"}}``) on an
        assistant turn that calls tools, and ``tool_call_id``, ``name`` and ``status`` on a tool
        result when set (``status`` is LangChain's; the core's chat checks ignore it). The dict is
        one :meth:`ContextCache.extend` takes back unchanged and a
        :class:`~gpuprompt.llm.GenerationRequest` takes as a message."""
        message: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        for key in ("tool_call_id", "name", "status"):
            value = getattr(self, key)
            if value is not None:
                message[key] = value
        return message


def memory_text(turn: Turn) -> str:
    """What a cache embeds and counts for ``turn``: its text, and for an assistant turn that calls
    tools each call as ``name(arguments)`` on a line of its own after the text (so that relevance and
    token budgets see the calls, not an empty message). A tool result is its text."""
    if not turn.tool_calls:
        return turn.text
    calls = [f"{call.name}({call.arguments})" for call in turn.tool_calls]
    return "\n".join([turn.text, *calls] if turn.text else calls)


def check_turn(turn: Any, where: str) -> Turn:
    """Validate one turn to append and return it as a draft :class:`Turn` (index -1, no time, no
    tokens: the cache sets them when it stores the turn).

    A turn is a ``(role, text)`` pair, or a chat message dict ``{"role", "content"}`` that may
    carry, on an assistant turn, ``tool_calls`` (OpenAI tool-call dicts, bare
    ``{"id", "name", "arguments"}`` dicts or :class:`~gpuprompt.llm.ToolCall`; arguments as JSON
    text of an object or a dict; ``content`` may then be None or absent) and, on a ``"tool"``
    turn, ``tool_call_id``, ``name`` and ``status`` (``"success"`` | ``"error"``). Each part is
    checked as :func:`gpuprompt.llm.check_messages` checks it, so a turn accepted here is a valid
    message of a request and stores and loads in every session store. Other keys are ignored
    (``name`` on a turn that is not a tool result too, as in a request).

    Args:
        turn: the pair or dict.
        where: how error messages name it (``"turns[3]"``).

    Raises:
        InputTypeError: a part has the wrong type (the message names it).
        InvalidInputError: an unknown role, a malformed str, a bad tool name, call id or
            arguments, too many calls, or a tool field on a turn of another role.
    """
    if isinstance(turn, Mapping):
        return _check_message_turn(turn, where)
    if isinstance(turn, (tuple, list)) and len(turn) == 2:
        return _draft(turn[0], turn[1], f"{where}[0]", f"{where}[1]")
    raise fail(where, "a (role, text) pair or a message dict", turn, error=InputTypeError)


def _draft(role: Any, text: Any, role_name: str, text_name: str) -> Turn:
    """Refuse a non-str or unknown role (by type first) and a non-str or malformed text."""
    check_str(role, role_name)
    check_choice(role, role_name, ROLES)
    check_str(text, text_name)
    return Turn(role, text, -1, 0.0, 0)


def _check_message_turn(message: Mapping[str, Any], where: str) -> Turn:
    role, calls, content = message.get("role"), message.get("tool_calls"), message.get("content")
    # Never truth-test or compare a value of unknown type (an array-like one raises): types first.
    only_calls = (
        isinstance(role, str) and role == "assistant" and content is None
        and isinstance(calls, Sequence) and not isinstance(calls, (str, bytes)) and len(calls) > 0
    )
    if "role" not in message or ("content" not in message and not only_calls):
        raise fail(where, "a dict with 'role' and 'content' keys", message, error=InputTypeError)
    draft = _draft(role, "" if only_calls else content, f"{where}['role']", f"{where}['content']")
    role = draft.role
    tool_calls: tuple[ToolCall, ...] = ()
    if calls is not None:
        name = f"{where}['tool_calls']"
        if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
            raise fail(name, "a list of OpenAI tool-call dicts or ToolCall", calls, error=InputTypeError)
        if calls and role != "assistant":
            raise InvalidInputError(
                f"'{name}' is set on a {role!r} turn; only an 'assistant' turn calls tools (store a tool's result "
                "as a 'tool' turn with 'tool_call_id')."
            )
        if len(calls) > MAX_TOOLS:
            raise InvalidInputError(f"'{name}' must hold at most {MAX_TOOLS} calls (got {len(calls)}).")
        tool_calls = tuple(ToolCall.from_openai(call, f"{name}[{i}]") for i, call in enumerate(calls))
    fields: dict[str, Any] = {}
    for key in ("tool_call_id", "status"):
        if message.get(key) is not None and role != "tool":
            raise InvalidInputError(
                f"'{where}['{key}']' is set on a {role!r} turn; it belongs to a 'tool' turn (a tool's result)."
            )
    if role == "tool":
        call_id, tool, status = message.get("tool_call_id"), message.get("name"), message.get("status")
        fields["tool_call_id"] = check_str(
            call_id, f"{where}['tool_call_id']", allow_none=True, allow_empty=False, max_length=MAX_ID
        )
        fields["name"] = None if tool is None else _check_name(tool, f"{where}['name']")
        if status is not None:
            check_str(status, f"{where}['status']")
            fields["status"] = check_choice(status, f"{where}['status']", TOOL_STATUSES)
    return Turn(draft.role, draft.text, -1, 0.0, 0, tool_calls, **fields)


@dataclass(frozen=True)
class ContextStats:
    """Counters of a :class:`ContextCache`."""

    sessions: int
    turns: int
    evicted_sessions: int
    expired_sessions: int
    dropped_turns: int


@dataclass
class Session:
    """One session's storage: append-only rows, live from ``start`` to the end.

    ``turns[i]`` and row ``i`` of ``vectors`` describe the same turn for every ``i < len(turns)``;
    rows are written once and never changed, so a reader may keep ``(turns, vectors, start, end)``
    and read it without the lock. Only whole-object replacement (a new list and tensor) compacts.
    """

    turns: list[Turn] = field(default_factory=list)
    vectors: Any = None  # (capacity, dim) float32 tensor on the embedder's device, rows >= len(turns) unwritten
    start: int = 0
    next_index: int = 0
    last_access: float = 0.0
    epoch: str | None = None  # with a store: the stored session this is a copy of
    tools: bool = False  # a tool call or result was ever stored here: windows keep them together

    def live(self) -> list[Turn]:
        return self.turns[self.start :]
