"""One session, two frameworks: LangChain's chat history and LlamaIndex's memory block share turns.

Both take their ContextCache from ``get_runtime().context_cache()`` by default, so in one process
a session id sees the same turns whichever framework wrote them.
"""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from llama_index.core.base.llms.types import ChatMessage  # noqa: E402

from gpuprompt import get_runtime  # noqa: E402
from langchain_gpuprompt import GPUPromptChatMessageHistory  # noqa: E402
from llamaindex_gpuprompt import GPUPromptContextMemoryBlock  # noqa: E402


def _session() -> str:
    return f"shared-{uuid.uuid4().hex}"


def test_both_default_to_the_runtime_cache(li_embed) -> None:
    shared = get_runtime().context_cache()
    assert GPUPromptChatMessageHistory(_session()).context_cache is shared
    assert GPUPromptContextMemoryBlock().context_cache is shared


async def test_langchain_writes_llamaindex_reads(li_embed) -> None:
    session = _session()
    history = GPUPromptChatMessageHistory(session)
    history.add_messages(
        [
            SystemMessage("You sell clothes."),
            HumanMessage("I bought the Aurora dress in size M."),
            AIMessage("Thanks! How can I help with the Aurora dress?"),
            AIMessage("", tool_calls=[{"name": "stock", "args": {"size": "M"}, "id": "c1"}]),
            ToolMessage("in stock", tool_call_id="c1", name="stock"),
        ]
    )
    block = GPUPromptContextMemoryBlock(max_turns=10, recent=10)
    text = await block.aget([ChatMessage(role="user", content="what size did I buy?")], session_id=session)
    assert text.splitlines() == [
        "system: You sell clothes.",
        "user: I bought the Aurora dress in size M.",
        "assistant: Thanks! How can I help with the Aurora dress?",
        'assistant: called stock({"size": "M"}) -> in stock',  # a call and its result, together
    ]
    history.clear()
    assert await block.aget([ChatMessage(role="user", content="what size did I buy?")], session_id=session) == ""


async def test_llamaindex_writes_langchain_reads(li_embed) -> None:
    session = _session()
    block = GPUPromptContextMemoryBlock()
    await block.aput(
        [
            ChatMessage(role="developer", content="Answer briefly."),
            ChatMessage(role="user", content="Do you ship to Norway?"),
            ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shipping", "arguments": '{"to": "NO"}'}}]}),
            ChatMessage(role="tool", content="shipping: NO, 3 days", additional_kwargs={"tool_call_id": "c1"}),
            ChatMessage(role="assistant", content="Yes, in 3 days."),
        ],
        session_id=session,
    )
    history = GPUPromptChatMessageHistory(session)
    assert history.messages == [
        SystemMessage("Answer briefly."),
        HumanMessage("Do you ship to Norway?"),
        AIMessage("", tool_calls=[{"name": "shipping", "args": {"to": "NO"}, "id": "c1", "type": "tool_call"}]),
        ToolMessage("shipping: NO, 3 days", tool_call_id="c1"),
        AIMessage("Yes, in 3 days."),
    ]
    assert [m.content for m in history.relevant_messages("delivery to Norway", k=1)] == ["Do you ship to Norway?"]
    history.clear()
    assert get_runtime().context_cache().turns(session) == []
