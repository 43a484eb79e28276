"""GPUPromptContextMemoryBlock: a LlamaIndex ``Memory`` block over gpuprompt's ``ContextCache``.

Turns flushed from short-term memory are embedded once, when stored; later reads pick a session's
most relevant past turns with one product against the device-resident turn embeddings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, TextBlock
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
from llama_index.core.memory.memory import BaseMemoryBlock

from gpuprompt.errors import ConfigurationError, describe

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache

__all__ = ["GPUPromptContextMemoryBlock"]

# ContextCache knows four roles; LlamaIndex has a few aliases of them.
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

    Example:
        >>> from llama_index.core.memory import Memory
        >>> from llamaindex_gpuprompt import GPUPromptContextMemoryBlock
        >>> memory = Memory.from_defaults(
        ...     session_id="customer-42", token_limit=2000,
        ...     memory_blocks=[GPUPromptContextMemoryBlock(max_turns=4)],
        ... )
        >>> # use `memory` in a chat engine or agent as usual

    Args:
        context_cache: the :class:`gpuprompt.ContextCache` to use (default: a new one over the
            runtime's shared embedder, built on first use).
        **kwargs: the fields below and those of ``BaseMemoryBlock``.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(default="RelevantHistory", description="The name of the memory block.")
    max_turns: int = Field(default=4, ge=1, description="Most past turns returned per read.")
    max_tokens: int | None = Field(default=None, ge=0, description="Token budget of the returned turns; None: none.")
    recent: int = Field(
        default=0,
        ge=0,
        description="How many of the latest stored turns are always included (0: purely by relevance).",
    )
    query_messages: int = Field(default=1, ge=1, description="How many of the latest messages form the query.")
    turn_template: str = Field(default="{role}: {text}", description="How one returned turn is rendered.")
    default_session_id: str = Field(
        default="default", description="Session used when the memory passes none (a bare block)."
    )

    _cache: ContextCache | None = PrivateAttr(default=None)

    def __init__(self, *, context_cache: ContextCache | None = None, **kwargs: Any) -> None:
        if context_cache is not None:
            from gpuprompt.context import ContextCache

            if not isinstance(context_cache, ContextCache):
                raise ConfigurationError(
                    f"'context_cache' must be a gpuprompt.ContextCache or None (got {describe(context_cache)})."
                )
        super().__init__(**kwargs)
        self._cache = context_cache

    @property
    def context_cache(self) -> ContextCache:
        """The core ContextCache holding the turns (built on first use)."""
        if self._cache is None:
            from gpuprompt.context import ContextCache

            self._cache = ContextCache()
        return self._cache

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        session_id = block_kwargs.get("session_id") or self.default_session_id
        recent_messages = [m for m in (messages or []) if _message_text(m)][-self.query_messages :]
        query = " ".join(_message_text(m) for m in recent_messages) or None
        if query is None and self.recent == 0:
            return ""
        turns = await self.context_cache.awindow(
            session_id, query=query, max_turns=self.max_turns, max_tokens=self.max_tokens, recent=self.recent
        )
        return "\n".join(self.turn_template.format(role=turn.role, text=turn.text) for turn in turns)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        by_session: dict[str, list[tuple[str, str]]] = {}
        for message in messages:
            # BaseMemoryBlock.aput tags each message with the memory's session id.
            session_id = message.additional_kwargs.pop("session_id", None) or self.default_session_id
            text = _message_text(message)
            if not text:
                continue
            role = _ROLE_MAP.get(str(getattr(message.role, "value", message.role)), "user")
            by_session.setdefault(session_id, []).append((role, text))
        for session_id, turns in by_session.items():
            await self.context_cache.aextend(session_id, turns)
