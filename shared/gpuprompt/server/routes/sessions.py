"""Conversation sessions over HTTP: the server's ContextCache, for remote chat histories and memory
blocks (:class:`gpuprompt.remote.RemoteContextCache`), with the same semantics as in process.

Routes (behind the server's API key, like every ``/v1`` route)::

    POST   /v1/sessions/{session_id}/turns    append turns (embedded once, here)   -> session.turns
    GET    /v1/sessions/{session_id}/turns    every kept turn, oldest first         -> session.turns
    POST   /v1/sessions/{session_id}/window   ContextCache.window for a query       -> session.turns
    DELETE /v1/sessions/{session_id}          forget one session                    -> session.deleted
    GET    /v1/sessions                       the session ids, least recently used first
    DELETE /v1/sessions                       forget every session of these routes (collection chats stay)

A turn may carry a tool call's fields as the core's :class:`~gpuprompt.context.Turn` does: an
assistant turn its ``tool_calls`` (OpenAI's shape), a ``"tool"`` turn (a tool's result) its
``tool_call_id``, ``name`` and ``status``; they are stored and returned exactly, and windows keep a
call and its results together.

``session_id`` is one percent-encoded path segment (``/`` inside it travels as ``%2F``); any id of
1 to :data:`MAX_SESSION_ID_LENGTH` well-formed characters is accepted.

Key scheme: the server's one ContextCache also holds the sessions of collection chat, under
``"<collection>/<session id>"``, where a collection name starts with a letter or digit
(``COLLECTION_NAME_PATTERN``). Sessions of these routes are stored under ``"@/<session id>"``:
``@`` can never start a collection name, so no key of one kind can equal a key of the other (nor
start with a collection's ``"<name>/"`` prefix, which dropping a collection clears), whatever the
ids hold. With ``--redis-url`` the same keys are written through to Redis, so replicas share them.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, model_validator

from gpuprompt.context import MAX_SESSION_ID_LENGTH as _CACHE_KEY_LENGTH
from gpuprompt.server._http import json_response, until_disconnect
from gpuprompt.server.schemas.base import Text, _int, _Strict
from gpuprompt.server.schemas.chat import MAX_TOOLS, ToolCallIn, ToolCallOut
from gpuprompt.server.state import State
from gpuprompt.validation import INT64_MAX, check_str
from gpuprompt.wire import MAX_TURNS_PER_REQUEST, SESSIONS, V1

if TYPE_CHECKING:
    from gpuprompt.context import Turn

__all__ = [
    "MAX_SESSION_ID_LENGTH",
    "MAX_TURNS_PER_REQUEST",
    "SESSION_KEY_PREFIX",
    "AppendTurnsRequest",
    "SessionList",
    "TurnIn",
    "TurnList",
    "TurnModel",
    "WindowRequest",
    "router",
    "session_key",
]

SESSION_KEY_PREFIX = "@/"
"""The ContextCache key prefix of these routes' sessions (never the start of a collection's key)."""
MAX_SESSION_ID_LENGTH = _CACHE_KEY_LENGTH - len(SESSION_KEY_PREFIX)
"""Longest session id here (1022): the cache's limit less the prefix."""

Count = _int(0, INT64_MAX)
"""A budget in turns or tokens (larger budgets mean the same as the whole session)."""


def session_key(session_id: Any) -> str:
    """The ContextCache key of a session of these routes: ``"@/" + session_id``.

    Raises:
        InputTypeError: ``session_id`` is not a str.
        InvalidInputError: it is empty, longer than :data:`MAX_SESSION_ID_LENGTH` or not well-formed.
    """
    checked = check_str(session_id, "session_id", allow_empty=False, max_length=MAX_SESSION_ID_LENGTH)
    return SESSION_KEY_PREFIX + str(checked)


# ---------------------------------------------------------------------- schemas
class TurnIn(_Strict):
    """One turn to append."""

    role: Literal["system", "user", "assistant", "tool"]
    """Who said it (the core's roles; a ``"tool"`` turn is a tool's result)."""
    text: Text
    """The message text (``""`` for an assistant turn that only calls tools)."""
    tool_calls: list[ToolCallIn] | None = Field(None, max_length=MAX_TOOLS)
    """An assistant turn's tool calls, in OpenAI's shape (``{"id", "type": "function", "function":
    {"name", "arguments"}}``)."""
    tool_call_id: Annotated[Text, Field(min_length=1, max_length=256)] | None = None
    """A tool turn: the id of the call it is the result of."""
    name: Annotated[Text, Field(min_length=1, max_length=64)] | None = None
    """A tool turn: the tool's name."""
    status: Literal["success", "error"] | None = None
    """A tool turn: whether the tool succeeded (LangChain's ``ToolMessage.status``)."""

    @model_validator(mode="after")
    def _roles(self) -> TurnIn:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only an 'assistant' turn may hold 'tool_calls' (got role {self.role!r})")
        if self.role != "tool":
            for key in ("tool_call_id", "name", "status"):
                if getattr(self, key) is not None:
                    raise ValueError(f"'{key}' belongs to a 'tool' turn (a tool's result), not a {self.role!r} one")
        return self

    def core(self) -> dict[str, Any]:
        """The turn as the message dict ``ContextCache.extend`` takes (the core checks the rest:
        tool names, arguments as JSON text of an object)."""
        turn: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.tool_calls:
            turn["tool_calls"] = [call.core() for call in self.tool_calls]
        for key in ("tool_call_id", "name", "status"):
            if getattr(self, key) is not None:
                turn[key] = getattr(self, key)
        return turn


class AppendTurnsRequest(_Strict):
    """``POST /v1/sessions/{session_id}/turns``: append turns, in order, with one embedding batch."""

    turns: list[TurnIn] = Field(max_length=MAX_TURNS_PER_REQUEST)
    """The turns (an empty list stores nothing); all are checked before any is stored."""


class WindowRequest(_Strict):
    """``POST /v1/sessions/{session_id}/window``: the turns to put in a prompt (``ContextCache.window``)."""

    query: Text | None = None
    """The new user message; None: simply the most recent turns."""
    max_turns: Count = 10
    """Most turns returned."""
    max_tokens: Count | None = None
    """Token budget of the returned turns (the server embedder's tokenizer); None: none."""
    recent: Count | None = None
    """Latest turns always considered first (default: half of ``max_turns`` with a query, else all)."""


class TurnModel(BaseModel):
    """One stored turn (the core's :class:`~gpuprompt.context.Turn`)."""

    role: str
    text: str
    index: int
    """Position in the session from 0 (stable when old turns are dropped)."""
    created_at: float
    """When it was appended (Unix seconds)."""
    tokens: int
    """Its length under the server's token counter."""
    tool_calls: list[ToolCallOut] | None = Field(None, exclude_if=lambda v: v is None)
    """An assistant turn's tool calls (absent when it has none)."""
    tool_call_id: str | None = Field(None, exclude_if=lambda v: v is None)
    """A tool turn's call id (absent when not set)."""
    name: str | None = Field(None, exclude_if=lambda v: v is None)
    """A tool turn's tool name (absent when not set)."""
    status: str | None = Field(None, exclude_if=lambda v: v is None)
    """A tool turn's ``"success"`` or ``"error"`` (absent when not set)."""

    @classmethod
    def of(cls, turn: Turn) -> TurnModel:
        """The model of a core turn."""
        calls = [ToolCallOut(id=c.id, function={"name": c.name, "arguments": c.arguments}) for c in turn.tool_calls]
        return cls(role=turn.role, text=turn.text, index=turn.index, created_at=turn.created_at, tokens=turn.tokens,
                   tool_calls=calls or None, tool_call_id=turn.tool_call_id, name=turn.name, status=turn.status)


class TurnList(BaseModel):
    """Turns of one session, oldest first."""

    object: Literal["session.turns"] = "session.turns"
    session_id: str
    data: list[TurnModel]


class SessionList(BaseModel):
    """``GET /v1/sessions``."""

    object: Literal["list"] = "list"
    data: list[str]
    """The session ids of these routes, least recently used first."""


# ---------------------------------------------------------------------- routes
def _turns(session_id: str, turns: list[Turn]) -> Response:
    return json_response(
        TurnList(
            session_id=session_id,
            data=[TurnModel.of(t) for t in turns],
        )
    )


def _deleted(payload: dict[str, Any]) -> Response:
    return Response(json.dumps(payload), media_type="application/json")


router = APIRouter()


@router.post(V1 + SESSIONS + "/{session_id:path}/turns", response_model=TurnList, tags=["sessions"])
async def append_turns(server: State, session_id: str, body: AppendTurnsRequest, request: Request) -> Response:
    """Append turns to a session (created on first use); each text is embedded once, batched
    with every concurrent request. A client that goes away while its turns are embedded (a
    timeout: embedding is the long part) cancels the append, and none of them is stored; once the
    embeddings are done the turns are stored whole, even if the client has gone by then."""
    key = session_key(session_id)
    stored = await until_disconnect(request, server.memory.aextend(key, [t.core() for t in body.turns]))
    if isinstance(stored, Response):
        return stored  # the client went away (nobody reads it)
    return _turns(session_id, stored)

@router.get(V1 + SESSIONS + "/{session_id:path}/turns", response_model=TurnList, tags=["sessions"])
async def list_turns(server: State, session_id: str) -> Response:
    """Every kept turn of a session, oldest first (none for an unknown or expired session)."""
    key = session_key(session_id)
    return _turns(session_id, await asyncio.to_thread(server.memory.turns, key))  # a session store is I/O

@router.post(V1 + SESSIONS + "/{session_id:path}/window", response_model=TurnList, tags=["sessions"])
async def window(server: State, session_id: str, body: WindowRequest) -> Response:
    """The most recent turns plus the older ones most relevant to ``query``, oldest first,
    within ``max_turns`` and ``max_tokens``; only the query is embedded."""
    key = session_key(session_id)
    turns = await server.memory.awindow(
        key, query=body.query, max_turns=body.max_turns, max_tokens=body.max_tokens, recent=body.recent
    )
    return _turns(session_id, turns)

@router.delete(V1 + SESSIONS + "/{session_id:path}", tags=["sessions"])
async def delete_session(server: State, session_id: str) -> Response:
    """Forget a session (an unknown one too: deleting is idempotent)."""
    key = session_key(session_id)
    await asyncio.to_thread(server.memory.clear, key)
    return _deleted({"object": "session.deleted", "session_id": session_id, "deleted": True})

@router.get(V1 + SESSIONS, response_model=SessionList, tags=["sessions"])
async def list_sessions(server: State) -> Response:
    """The ids of the sessions of these routes (collection chats are not listed)."""
    keys = await asyncio.to_thread(server.memory.sessions)
    cut = len(SESSION_KEY_PREFIX)
    return json_response(SessionList(data=[k[cut:] for k in keys if k.startswith(SESSION_KEY_PREFIX)]))

@router.delete(V1 + SESSIONS, tags=["sessions"])
async def delete_sessions(server: State) -> Response:
    """Forget every session of these routes; the sessions of collection chat stay."""
    def clear() -> int:
        keys = [k for k in server.memory.sessions() if k.startswith(SESSION_KEY_PREFIX)]
        for key in keys:
            server.memory.clear(key)
        return len(keys)

    deleted = await asyncio.to_thread(clear)
    return _deleted({"object": "sessions.deleted", "deleted": deleted})


