"""LangChain chat message history over gpuprompt's ContextCache (turn embeddings kept on the device).

Each message is embedded once, when added; ``relevant_messages`` then picks a session's past
messages most similar to a query with one product on the device, never re-encoding history.
Messages become turns exactly as :class:`ChatGPUPrompt` sends them to the engine (one translation),
tool calls and tool results included, and read back as the same LangChain messages.
The class gets its runtime once (:func:`gpuprompt.connect`): with ``base_url`` (or ``GPUPROMPT_URL``)
the turns live in a running ``gpuprompt serve`` (a ``RemoteContextCache``), else in the process's
shared ContextCache; it then only delegates (:class:`gpuprompt.protocols.ContextLike`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import ConfigurationError, InputTypeError, describe
from gpuprompt.protocols import ContextLike
from gpuprompt.runtime import connect
from gpuprompt.validation import INT64_MAX, check_int, check_str
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_gpuprompt._chat_convert import core_messages

if TYPE_CHECKING:
    from gpuprompt.context import Turn
    from pydantic import SecretStr

__all__ = ["GPUPromptChatMessageHistory"]

_MESSAGE_OF_ROLE: dict[str, type[BaseMessage]] = {"user": HumanMessage, "system": SystemMessage}


class GPUPromptChatMessageHistory(BaseChatMessageHistory):
    """Chat history for one session, stored in gpuprompt's :class:`~gpuprompt.ContextCache`.

    Usable wherever LangChain takes a ``BaseChatMessageHistory``, notably
    ``RunnableWithMessageHistory`` and agents. Messages are stored as the core's turns, translated
    exactly as :class:`ChatGPUPrompt` sends them to the engine, and read back as the same
    messages (as ``InMemoryChatMessageHistory`` returns them):

    * ``SystemMessage`` -> ``"system"``, ``HumanMessage`` -> ``"user"``;
    * ``AIMessage`` -> ``"assistant"`` with its ``tool_calls`` (id, name, args), read back as an
      ``AIMessage`` with the same content and ``tool_calls``;
    * ``ToolMessage`` -> ``"tool"`` with its ``tool_call_id``, ``name`` and ``status``, read back
      as a ``ToolMessage`` with the same fields.

    What is kept is what the chat model sends: the text of the content (text blocks joined), the
    tool calls and the tool-result fields. Other message fields (ids, ``additional_kwargs``,
    ``response_metadata``, usage, ``invalid_tool_calls``) are not stored, and a tool call without
    an id gets a stable one derived from the call.

    How long messages are kept: the default cache (the runtime's shared one) holds them in this
    process's memory, so a restart loses them, and it drops a session idle for an hour, keeping at
    most 1,000 messages per session and 10,000 sessions (``ContextCache``'s defaults; LangChain's
    ``InMemoryChatMessageHistory`` keeps everything until the process ends). For history that
    lasts, pass ``context_cache=connect().context_cache(store=RedisStore(url))`` (written through
    to Redis, kept as long as the store's ``ttl_s``), or use remote mode against a server started
    with ``--redis-url``.

    Each message is embedded once, on add (an AI message that calls tools as its text plus each
    call's name and arguments), so :meth:`relevant_messages` can pick the past messages most
    related to a new question without re-encoding the conversation; it returns a tool call
    together with its results, or neither.

    Instantiate:
        .. code-block:: python

            from langchain_gpuprompt import GPUPromptChatMessageHistory

            history = GPUPromptChatMessageHistory(session_id="customer-42")
            history.add_user_message("I bought the Aurora dress in size M.")
            history.add_ai_message("Thanks! How can I help with the Aurora dress?")
            history.add_user_message("Do you ship to Norway?")

    Relevant past messages:
        .. code-block:: python

            [m.content for m in history.relevant_messages("what size did I buy?", k=1)]
            # ['I bought the Aurora dress in size M.']

    With ``RunnableWithMessageHistory``:
        .. code-block:: python

            from langchain_core.runnables.history import RunnableWithMessageHistory

            chat = RunnableWithMessageHistory(
                prompt | ChatGPUPrompt(),
                lambda session_id: GPUPromptChatMessageHistory(session_id=session_id),
                input_messages_key="question",
                history_messages_key="history",
            )

    Remote mode (the turns live in a running ``gpuprompt serve``, shared by every worker process
    that names the same server and session id; this process imports no torch and loads no model):
        .. code-block:: python

            history = GPUPromptChatMessageHistory("customer-42", base_url="http://127.0.0.1:8000")
            # or set GPUPROMPT_URL (and GPUPROMPT_API_KEY) and keep GPUPromptChatMessageHistory("customer-42")

        The server embeds each message once and ranks :meth:`relevant_messages` on its device;
        the session id may then be at most 1022 characters long.

    Args:
        session_id: the conversation's id; sessions never see each other's messages.
        context_cache: the cache to store turns in (default: the runtime's shared one,
            ``get_runtime().context_cache()``, so every history object -- and the LlamaIndex memory
            block -- for the same session id reads the same turns in this process); a
            :class:`gpuprompt.remote.RemoteContextCache` (any :class:`gpuprompt.protocols.ContextLike`) works too.
        base_url: a running ``gpuprompt serve`` to keep the turns in (remote mode); None reads
            ``GPUPROMPT_URL``, and without it the turns stay in this process. Not with ``context_cache``.
        api_key: that server's API key; None reads ``GPUPROMPT_API_KEY`` with ``GPUPROMPT_URL``.
        timeout: remote mode: seconds a request to the server may wait for an answer (None reads
            ``GPUPROMPT_TIMEOUT``, else 60); a silent server raises ``RequestTimeoutError``.

    Raises:
        InputTypeError: ``session_id`` or ``context_cache`` has the wrong type.
        InvalidInputError: ``session_id`` is empty, too long or not well-formed.
        ConfigurationError: ``base_url`` or ``api_key`` together with ``context_cache``, an
            ``api_key`` without a server, or a malformed URL or key.
    """

    def __init__(
        self,
        session_id: str,
        *,
        context_cache: ContextLike | None = None,
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        timeout: float | None = None,
    ) -> None:
        from gpuprompt.context import check_session_id

        check_session_id(session_id)  # the cache's own rule: an id accepted here never fails there
        self._remote_url: str | None = None
        if context_cache is not None:
            if not isinstance(context_cache, ContextLike):
                raise InputTypeError(
                    f"'context_cache' must be a gpuprompt.ContextCache, a gpuprompt.remote.RemoteContextCache or "
                    f"None (got {describe(context_cache)})."
                )
            if base_url is not None or api_key is not None:
                raise ConfigurationError(
                    "GPUPromptChatMessageHistory got both 'context_cache' and 'base_url' / 'api_key': pass a "
                    "context_cache to keep turns in it, or base_url (and api_key) to keep them in a gpuprompt serve."
                )
        else:
            runtime = connect(base_url, api_key=api_key, timeout=timeout, owner="GPUPromptChatMessageHistory")
            context_cache = runtime.context_cache()  # the process's shared cache, or the server's memory
            if runtime.remote:
                self._remote_url = runtime.config.shown_url
        client = getattr(context_cache, "client", None)
        if self._remote_url is None and client is not None:
            self._remote_url = client.config.shown_url
        context_cache.check_session_id(session_id)  # the cache's rule (a server's keys are "@/<id>")
        self.session_id = session_id
        self._cache = context_cache

    def __repr__(self) -> str:
        if self._remote_url is not None:
            return f"GPUPromptChatMessageHistory(session_id={self.session_id!r}, base_url={self._remote_url!r})"
        return f"GPUPromptChatMessageHistory(session_id={self.session_id!r})"

    @property
    def context_cache(self) -> ContextLike:
        """The ContextCache holding this session's turns (in remote mode the server's, through a
        :class:`gpuprompt.remote.RemoteContextCache`)."""
        return self._cache

    # ------------------------------------------------------------------ reads
    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's messages, oldest first: the ones kept under the session's turn cap, less
        the ``ToolMessage`` results at their head, whose call the cap dropped (a chat API refuses a
        result without its call)."""
        from gpuprompt.context import replayable

        return _to_messages(replayable(self.context_cache.turns(self.session_id)))

    async def aget_messages(self) -> list[BaseMessage]:
        """Async :attr:`messages` (a read of in-memory turns: no model runs)."""
        from gpuprompt.context import replayable

        return _to_messages(replayable(await self.context_cache.aturns(self.session_id)))

    def relevant_messages(self, query: str, k: int = 4) -> list[BaseMessage]:
        """The ``k`` past messages most similar to ``query``, in chronological order.

        Only ``query`` is embedded; the session's messages were embedded when added. An AI message
        that calls tools and its ``ToolMessage`` results are picked together, or not at all (they
        count as that many of ``k``), so the list is always a valid conversation to replay.

        Raises:
            InputTypeError: ``query`` is not a str.
            InvalidInputError: ``k`` is not an int >= 0 (bools and ints beyond 64 bits are
                refused), or ``query`` holds a lone surrogate.
        """
        _check_query(query, k)
        return _to_messages(self.context_cache.window(self.session_id, query=query, max_turns=k, recent=0))

    async def arelevant_messages(self, query: str, k: int = 4) -> list[BaseMessage]:
        """Async :meth:`relevant_messages`: the query is embedded by the batched embedder."""
        _check_query(query, k)
        return _to_messages(await self.context_cache.awindow(self.session_id, query=query, max_turns=k, recent=0))

    # ------------------------------------------------------------------ writes
    def add_user_message(self, message: HumanMessage | str) -> None:
        """Append a human message (a str is wrapped in a ``HumanMessage``).

        Raises:
            InputTypeError: ``message`` is neither a str nor a ``HumanMessage``.
        """
        self.add_messages([_message(message, HumanMessage)])

    def add_ai_message(self, message: AIMessage | str) -> None:
        """Append an AI message (a str is wrapped in an ``AIMessage``).

        Raises:
            InputTypeError: ``message`` is neither a str nor an ``AIMessage``.
        """
        self.add_messages([_message(message, AIMessage)])

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append messages (embedded together in one batched call). All are checked first:
        a rejected call stores nothing.

        Raises:
            InputTypeError: ``messages`` is not a list of ``BaseMessage`` (a bare message or str
                included), or an item is not one.
            InvalidInputError: a message the chat model cannot send either (a non-text content
                block, a ``ChatMessage`` with another role), or a text holding a lone surrogate.
        """
        self.context_cache.extend(self.session_id, _to_turns(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async :meth:`add_messages`: the embedding runs off the event loop."""
        await self.context_cache.aextend(self.session_id, _to_turns(messages))

    def clear(self) -> None:
        """Forget this session's messages (other sessions are untouched)."""
        self.context_cache.clear(self.session_id)

    async def aclear(self) -> None:
        """Async :meth:`clear`."""
        await self.context_cache.aclear(self.session_id)


def _check_query(query: Any, k: Any) -> None:
    check_str(query, "query")
    check_int(k, "k", min=0, max=INT64_MAX)


def _message(message: Any, kind: type[BaseMessage]) -> BaseMessage:
    if isinstance(message, str):
        return kind(content=message)
    if not isinstance(message, BaseMessage):
        raise InputTypeError(f"'message' must be a str or a {kind.__name__} (got {describe(message)}).")
    return message


def _to_turns(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    if isinstance(messages, (BaseMessage, str, bytes)) or not isinstance(messages, Sequence):
        raise InputTypeError(
            f"'messages' must be a list of BaseMessage (got {describe(messages)}); wrap one message in a list."
        )
    turns = core_messages(messages)  # the chat model's translation: the same turns it would send
    for position, (message, turn) in enumerate(zip(messages, turns)):
        check_str(turn["content"], f"messages[{position}].content")
        if isinstance(message, ToolMessage):
            turn["status"] = message.status
    return turns


def _to_messages(turns: list[Turn]) -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for turn in turns:
        if turn.role == "assistant":
            calls = [{"name": c.name, "args": c.args, "id": c.id, "type": "tool_call"} for c in turn.tool_calls]
            messages.append(AIMessage(content=turn.text, tool_calls=calls))
        elif turn.role == "tool":
            messages.append(ToolMessage(content=turn.text, tool_call_id=turn.tool_call_id or "", name=turn.name,
                                        status=turn.status or "success"))
        else:
            messages.append(_MESSAGE_OF_ROLE[turn.role](content=turn.text))
    return messages
