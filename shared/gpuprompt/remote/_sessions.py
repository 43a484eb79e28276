"""RemoteContextCache: the :class:`~gpuprompt.ContextCache` calls of the chat history and the memory
block, served by a running ``gpuprompt serve`` (``/v1/sessions``). No torch, no model here.

Every worker that names the same server and session id reads and writes the same turns (with
``gpuprompt serve --redis-url``, on every replica). Reads (turns, window) and deletes are
idempotent and retried like GETs; appends are not (a retried append could store a turn twice).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from gpuprompt.context import MAX_SESSION_ID_LENGTH as _CACHE_KEY_LENGTH
from gpuprompt.context import ContextCache, Turn
from gpuprompt.errors import EngineError, InvalidInputError
from gpuprompt.llm import ToolCall
from gpuprompt.remote._client import SERVICE, RemoteClient, client_for
from gpuprompt.remote._config import RemoteConfig
from gpuprompt.validation import INT64_MAX, check_str
from gpuprompt.wire import MAX_TURNS_PER_REQUEST, SESSIONS, redact

__all__ = ["MAX_REMOTE_SESSION_ID_LENGTH", "MAX_TURNS_PER_REQUEST", "RemoteContextCache"]

MAX_REMOTE_SESSION_ID_LENGTH = _CACHE_KEY_LENGTH - 2
"""Longest session id in remote mode (1022): the server keys these sessions ``"@/<id>"`` (see
``gpuprompt.server.routes.sessions``), within the cache's limit of 1024 characters."""


class RemoteContextCache:
    """A running ``gpuprompt serve``'s conversation memory, with the :class:`~gpuprompt.ContextCache`
    methods the adapters call: ``append`` / ``extend`` / ``turns`` / ``window`` / ``clear`` /
    ``sessions`` and their async ``a*`` twins, returning the core's :class:`~gpuprompt.context.Turn`.

    Semantics are the server's ContextCache's: a turn is embedded once, on the server, when it is
    appended; ``window`` embeds only the query there and ranks the session's turns against it.
    Turns carry tool calls and results (``tool_calls``, ``tool_call_id``, ``name``, ``status``)
    as in process, exactly, and windows keep a call and its results together.
    Token counts are the server embedder's. Checks run here first (the same messages as in
    process), so a refused call sends nothing. Nothing connects until the first call.

    Example:
        >>> memory = RemoteContextCache("http://127.0.0.1:8000")
        >>> memory.extend("s1", [("user", "I want a red dress in cotton."),
        ...                      ("assistant", "The Aurora dress is 100% cotton, 49 EUR."),
        ...                      ("user", "Do you ship to Norway?")])
        [...]
        >>> [t.text for t in memory.window("s1", query="will the dress shrink?", max_turns=2)]
        ['I want a red dress in cotton.', 'Do you ship to Norway?']

    Args:
        base_url: the server (``http://host:port``), or a :class:`RemoteConfig`.
        api_key: the server's API key (with a URL; a config carries its own).
        client: a :class:`RemoteClient` to use instead of the process's shared one for the config.
        **options: other :class:`RemoteConfig` fields (``connect_timeout``, ``read_timeout``,
            ``max_retries``, ...), with a URL.

    Raises:
        ConfigurationError: a malformed URL, key or option, or a ``client`` that is not a RemoteClient.
    """

    def __init__(
        self,
        base_url: str | RemoteConfig | None = None,
        *,
        api_key: str | None = None,
        client: RemoteClient | None = None,
        **options: Any,
    ) -> None:
        client = client_for(base_url, api_key, client, options, owner="RemoteContextCache")
        self.client = client

    def __repr__(self) -> str:
        return f"<RemoteContextCache {redact(self.client.root)!r}>"

    # ------------------------------------------------------------------ validation
    @staticmethod
    def check_session_id(value: Any, name: str = "session_id") -> str:
        """Return ``value`` if the server accepts it as a session id: a non-empty, well-formed str of
        at most :data:`MAX_REMOTE_SESSION_ID_LENGTH` (1022) characters.

        Raises:
            InputTypeError: not a str.
            InvalidInputError: empty, too long, or holding a lone surrogate.
        """
        checked = check_str(value, name, allow_empty=False, max_length=MAX_REMOTE_SESSION_ID_LENGTH)
        assert checked is not None
        return checked

    @classmethod
    def _path(cls, session_id: Any, suffix: str = "") -> str:
        """The URL path of a session: its id percent-encoded as one segment (dots too, so that no
        client or proxy resolves ``.`` or ``..`` in it)."""
        cls.check_session_id(session_id)
        segment = quote(session_id, safe="").replace(".", "%2E")
        return f"{SESSIONS}/{segment}{suffix}"

    @staticmethod
    def _window_body(query: Any, max_turns: Any, max_tokens: Any, recent: Any) -> dict[str, Any]:
        check_str(query, "query", allow_none=True)
        max_turns, max_tokens, recent = ContextCache._check_window_args(max_turns, max_tokens, recent)

        # Past int64 (JSON's and the server's range) a budget already covers any session.
        def clamp(value: int | None) -> int | None:
            return None if value is None else min(value, INT64_MAX)

        return {"query": query, "max_turns": clamp(max_turns), "max_tokens": clamp(max_tokens),
                "recent": clamp(recent)}

    def _parts(self, session_id: Any, turns: Any) -> tuple[str, list[list[dict[str, Any]]]]:
        path = self._path(session_id, "/turns")
        drafts = [_wire_turn(d) for d in ContextCache._check_turns(turns)]
        bodies = [drafts[i : i + MAX_TURNS_PER_REQUEST] for i in range(0, len(drafts), MAX_TURNS_PER_REQUEST)]
        return path, bodies

    def _read(self, answer: Any, path: str) -> list[Turn]:
        try:
            return [
                Turn(t["role"], t["text"], t["index"], t["created_at"], t["tokens"],
                     tuple(ToolCall.from_openai(c) for c in t.get("tool_calls") or ()),
                     t.get("tool_call_id"), t.get("name"), t.get("status"))
                for t in answer["data"]
            ]
        except (KeyError, TypeError, AttributeError, InvalidInputError) as exc:
            raise EngineError(
                f"{SERVICE} at {redact(self.client.url(path))} answered turns without role, text, index, "
                f"created_at and tokens ({str(answer)[:200]!r}); is base_url a gpuprompt serve of this version?"
            ) from exc

    # ------------------------------------------------------------------ writes
    def append(self, session_id: str, role: str | Mapping[str, Any], text: str | None = None) -> Turn:
        """Add one turn to a session (created on first use); the server embeds it once. ``role``
        may be one message dict, with ``text`` omitted (as :meth:`ContextCache.append`).

        Raises:
            InputTypeError: ``session_id``, ``role`` or ``text`` is not a str.
            InvalidInputError: ``session_id`` is empty, longer than 1022 characters or not
                well-formed, ``role`` is not a known role, or a str holds a lone surrogate.
            EngineError, EngineDeadError, QueueFullError, RequestTimeoutError: the server's
                answer or the transport's failure (see :mod:`gpuprompt.remote`).
        """
        draft = ContextCache._check_turn(role, text)
        return self.extend(session_id, [draft.as_message()])[0]

    def extend(self, session_id: str, turns: Iterable[tuple[str, str] | Mapping[str, Any]]) -> list[Turn]:
        """Add several turns at once (one batched embedding on the server per 2048 turns).

        Args:
            session_id: the session, a non-empty str of at most 1022 characters.
            turns: ``(role, text)`` pairs or chat message dicts, tool calls and results included
                (as :meth:`ContextCache.extend`).

        Returns:
            The stored turns, in order.

        Raises:
            InputTypeError, InvalidInputError: as :meth:`ContextCache.extend`; every turn is
                checked before anything is sent.
            EngineError, EngineDeadError, QueueFullError, RequestTimeoutError: see :meth:`append`.
        """
        path, bodies = self._parts(session_id, turns)
        stored: list[Turn] = []
        for body in bodies:
            stored += self._read(self.client.request("POST", path, {"turns": body}, idempotent=False), path)
        return stored

    async def aappend(self, session_id: str, role: str | Mapping[str, Any], text: str | None = None) -> Turn:
        """Async :meth:`append` (never blocks the caller's loop)."""
        draft = ContextCache._check_turn(role, text)
        return (await self.aextend(session_id, [draft.as_message()]))[0]

    async def aextend(self, session_id: str, turns: Iterable[tuple[str, str] | Mapping[str, Any]]) -> list[Turn]:
        """Async :meth:`extend`."""
        path, bodies = self._parts(session_id, turns)
        stored: list[Turn] = []
        for body in bodies:
            stored += self._read(await self.client.arequest("POST", path, {"turns": body}, idempotent=False), path)
        return stored

    # ------------------------------------------------------------------ reads
    def turns(self, session_id: str) -> list[Turn]:
        """Every kept turn of a session, oldest first (empty for an unknown or expired session).

        Raises:
            InputTypeError, InvalidInputError: a bad ``session_id`` (see :meth:`append`).
            EngineError, EngineDeadError, QueueFullError, RequestTimeoutError: see :meth:`append`.
        """
        path = self._path(session_id, "/turns")
        return self._read(self.client.request("GET", path), path)

    async def aturns(self, session_id: str) -> list[Turn]:
        """Async :meth:`turns`."""
        path = self._path(session_id, "/turns")
        return self._read(await self.client.arequest("GET", path), path)

    def window(
        self,
        session_id: str,
        query: str | None = None,
        max_turns: int = 10,
        max_tokens: int | None = None,
        *,
        recent: int | None = None,
    ) -> list[Turn]:
        """The most recent turns plus the older ones most relevant to ``query``, oldest first,
        within ``max_turns`` and ``max_tokens`` (:meth:`ContextCache.window`, on the server).

        Raises:
            InputTypeError: ``session_id`` or ``query`` is not a str.
            InvalidInputError: a budget is not an int >= 0, or a str is empty or malformed.
                Nothing is sent on a refused call.
            EngineError, EngineDeadError, QueueFullError, RequestTimeoutError: see :meth:`append`.
        """
        path = self._path(session_id, "/window")
        body = self._window_body(query, max_turns, max_tokens, recent)
        return self._read(self.client.request("POST", path, body, idempotent=True), path)

    async def awindow(
        self,
        session_id: str,
        query: str | None = None,
        max_turns: int = 10,
        max_tokens: int | None = None,
        *,
        recent: int | None = None,
    ) -> list[Turn]:
        """Async :meth:`window`."""
        path = self._path(session_id, "/window")
        body = self._window_body(query, max_turns, max_tokens, recent)
        return self._read(await self.client.arequest("POST", path, body, idempotent=True), path)

    def sessions(self) -> list[str]:
        """The server's remote-mode session ids, least recently used first (collection chats are
        not listed)."""
        return _ids(self.client.request("GET", SESSIONS))

    async def asessions(self) -> list[str]:
        """Async :meth:`sessions`."""
        return _ids(await self.client.arequest("GET", SESSIONS))

    # ------------------------------------------------------------------ deletes
    def clear(self, session_id: str | None = None) -> None:
        """Forget one session, or, with None, every remote-mode session of the server (for every
        worker; collection chats stay).

        Raises:
            InputTypeError, InvalidInputError: a bad ``session_id`` (see :meth:`append`).
            EngineError, EngineDeadError, QueueFullError, RequestTimeoutError: see :meth:`append`.
        """
        path = SESSIONS if session_id is None else self._path(session_id)
        self.client.request("DELETE", path, idempotent=True)

    async def aclear(self, session_id: str | None = None) -> None:
        """Async :meth:`clear`."""
        path = SESSIONS if session_id is None else self._path(session_id)
        await self.client.arequest("DELETE", path, idempotent=True)


def _wire_turn(draft: Turn) -> dict[str, Any]:
    """A checked turn as ``POST /v1/sessions/{id}/turns`` takes it (``text``, not ``content``)."""
    body = draft.as_message()
    body["text"] = body.pop("content")
    return body


def _ids(answer: Any) -> list[str]:
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or not all(isinstance(i, str) for i in data):
        raise EngineError(f"{SERVICE} answered GET /v1/sessions without a list of ids ({str(answer)[:200]!r}).")
    return data
