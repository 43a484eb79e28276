"""GPUPromptChatMessageHistory over the core ContextCache, and a RunnableWithMessageHistory chat."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from support.tool_history import DIFFERENTIAL, shape

from gpuprompt.context import ContextCache
from gpuprompt.errors import InputTypeError, InvalidInputError
from langchain_gpuprompt import ChatGPUPrompt, GPUPromptChatMessageHistory, GPUPromptEmbeddings
from langchain_gpuprompt._chat_convert import core_messages


def _session() -> str:
    return f"test-{uuid.uuid4().hex}"


def test_messages_round_trip_and_sessions_are_isolated() -> None:
    sid, other = _session(), _session()
    history = GPUPromptChatMessageHistory(sid)
    history.add_messages([SystemMessage("You sell clothes."), HumanMessage("Hi!"), AIMessage("Hello, how can I help?")])
    GPUPromptChatMessageHistory(other).add_user_message("I am someone else")
    again = GPUPromptChatMessageHistory(sid)  # a new object for the same session sees the same turns
    assert again.messages == [SystemMessage("You sell clothes."), HumanMessage("Hi!"), AIMessage("Hello, how can I help?")]
    assert [m.content for m in GPUPromptChatMessageHistory(other).messages] == ["I am someone else"]
    again.clear()
    assert GPUPromptChatMessageHistory(sid).messages == []
    assert len(GPUPromptChatMessageHistory(other).messages) == 1


def test_relevant_messages_without_re_embedding_history(lc_embeddings: GPUPromptEmbeddings) -> None:
    cache = ContextCache(lc_embeddings.embedder)
    history = GPUPromptChatMessageHistory(_session(), context_cache=cache)
    history.add_messages(
        [
            HumanMessage("I bought the Aurora dress in size M last week."),
            AIMessage("Thank you for your order!"),
            HumanMessage("Do you ship to Norway?"),
            AIMessage("Yes, we ship to Norway in 3-5 days."),
            HumanMessage("Is there a discount for students?"),
        ]
    )
    embedded = lc_embeddings.embedder.stats().texts
    assert [m.content for m in history.relevant_messages("which size did I order?", k=1)] == [
        "I bought the Aurora dress in size M last week."
    ]
    picked = history.relevant_messages("delivery to Oslo", k=2)
    assert [m.content for m in picked][-1] == "Yes, we ship to Norway in 3-5 days."
    assert len(picked) == 2 and picked == sorted(picked, key=history.messages.index)  # chronological
    _ = history.messages
    # Only the two queries were embedded; the five turns were embedded once, when added.
    assert lc_embeddings.embedder.stats().texts == embedded + 2


async def test_async_methods(lc_embeddings: GPUPromptEmbeddings) -> None:
    history = GPUPromptChatMessageHistory(_session(), context_cache=ContextCache(lc_embeddings.embedder))
    await history.aadd_messages([HumanMessage("My order number is 1007."), AIMessage("Got it.")])
    assert [m.content for m in await history.aget_messages()] == ["My order number is 1007.", "Got it."]
    assert [m.content for m in await history.arelevant_messages("what was the order number?", k=1)] == [
        "My order number is 1007."
    ]
    await history.aclear()
    assert await history.aget_messages() == []


def test_tool_turns_are_stored_as_the_chat_model_sends_them() -> None:
    """An AI tool call is an assistant turn with its calls and a ToolMessage a "tool" turn, as
    ChatGPUPrompt sends them; read back, the history gives the model the very prompt the original
    messages gave."""
    history = GPUPromptChatMessageHistory(_session())
    original = [
        HumanMessage("Where is order 42?"),
        AIMessage("", tool_calls=[{"name": "order_status", "args": {"order_id": 42}, "id": "c1", "type": "tool_call"}]),
        ToolMessage("shipped yesterday", tool_call_id="c1", name="order_status"),
        AIMessage("It shipped yesterday."),
    ]
    history.add_messages(original)
    turns = history.context_cache.turns(history.session_id)
    assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant"]
    assert [c.to_openai() for c in turns[1].tool_calls] == [
        {"id": "c1", "type": "function", "function": {"name": "order_status", "arguments": '{"order_id": 42}'}}]
    assert (turns[2].text, turns[2].tool_call_id, turns[2].name, turns[2].status) == (
        "shipped yesterday", "c1", "order_status", "success")
    assert isinstance(history.messages[2], ToolMessage)
    assert core_messages(history.messages) == core_messages(original)
    history.clear()


@pytest.mark.parametrize("messages", list(DIFFERENTIAL.values()), ids=list(DIFFERENTIAL))
def test_history_returns_what_in_memory_history_returns(messages: list[BaseMessage]) -> None:
    """The same message lists, in two adds, to LangChain's own InMemoryChatMessageHistory and to ours."""
    reference = InMemoryChatMessageHistory()
    history = GPUPromptChatMessageHistory(_session())
    for target in (reference, history):
        target.add_messages(messages[:1])
        target.add_messages(messages[1:])
    assert shape(history.messages) == shape(reference.messages) == shape(messages)
    assert [type(m) for m in GPUPromptChatMessageHistory(history.session_id).messages] == [type(m) for m in messages]
    history.clear()


async def test_async_history_returns_what_in_memory_history_returns() -> None:
    reference = InMemoryChatMessageHistory()
    history = GPUPromptChatMessageHistory(_session())
    for messages in DIFFERENTIAL.values():
        await reference.aadd_messages(messages)
        await history.aadd_messages(messages)
    assert shape(await history.aget_messages()) == shape(await reference.aget_messages())
    await history.aclear()


def test_relevant_messages_keep_a_call_with_its_results() -> None:
    history = GPUPromptChatMessageHistory(_session())
    history.add_messages(DIFFERENTIAL["parallel-calls"])
    for k in range(0, 8):
        picked = history.relevant_messages("how much does the dress cost?", k=k)
        assert len(picked) <= k
        kinds = [type(m).__name__ for m in picked]
        if "AIMessage" in kinds and any(m.tool_calls for m in picked if isinstance(m, AIMessage)):
            assert kinds.count("ToolMessage") == 2
        else:
            assert "ToolMessage" not in kinds
    assert len(history.relevant_messages("how much does the dress cost?", k=6)) == 6  # everything fits
    history.clear()


def test_bad_input_is_typed_and_stores_nothing() -> None:
    history = GPUPromptChatMessageHistory(_session())
    with pytest.raises(InvalidInputError, match=r"'messages\[1\]'.*content block"):
        history.add_messages([HumanMessage("hi"), HumanMessage([{"type": "image_url", "image_url": {"url": "x"}}])])
    with pytest.raises(InputTypeError, match=r"'messages\[1\]'"):
        history.add_messages([HumanMessage("hi"), "not a message"])  # type: ignore[list-item]
    assert history.messages == []
    with pytest.raises(InvalidInputError, match="'session_id' must be a non-empty str"):
        GPUPromptChatMessageHistory("")
    with pytest.raises(InputTypeError, match="'context_cache'"):
        GPUPromptChatMessageHistory("s", context_cache={})  # type: ignore[arg-type]
    with pytest.raises(InputTypeError, match="'query'"):
        history.relevant_messages(None)  # type: ignore[arg-type]


class _PromptRecorder(BaseCallbackHandler):
    """Records the messages each chat model call received."""

    def __init__(self) -> None:
        self.prompts: list[list[BaseMessage]] = []

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any) -> None:
        self.prompts.extend(messages)


def test_runnable_with_message_history_multi_turn(lc_chat: ChatGPUPrompt) -> None:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a helpful shop assistant."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chat = RunnableWithMessageHistory(
        prompt | lc_chat,
        lambda session_id: GPUPromptChatMessageHistory(session_id=session_id),
        input_messages_key="question",
        history_messages_key="history",
    )
    sid = _session()
    recorder = _PromptRecorder()
    config = {"configurable": {"session_id": sid}, "callbacks": [recorder]}
    questions = ["Hi, I am Ana and I wear size M.", "Do you have red dresses?", "What size do I wear?"]
    replies = [chat.invoke({"question": q}, config=config) for q in questions]
    assert all(isinstance(r, AIMessage) and r.content for r in replies)
    stored = GPUPromptChatMessageHistory(sid).messages
    assert [m.content for m in stored[0::2]] == questions
    assert [m.content for m in stored[1::2]] == [r.content for r in replies]
    # The third call saw the whole conversation so far: system + 2 earlier turns + the new question.
    third = recorder.prompts[-1]
    assert [m.content for m in third] == [
        "You are a helpful shop assistant.", questions[0], replies[0].content, questions[1], replies[1].content, questions[2]
    ]


def test_the_turn_cap_never_leaves_a_tool_result_without_its_call(lc_embeddings: GPUPromptEmbeddings) -> None:
    """The cap drops the oldest turns one by one; a result whose call it dropped is not replayed."""
    history = GPUPromptChatMessageHistory(_session(), context_cache=ContextCache(lc_embeddings.embedder,
                                                                                 max_turns_per_session=4))
    call = AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "c1", "type": "tool_call"}])
    history.add_messages([HumanMessage("Where is order 42?"), call, ToolMessage("a", tool_call_id="c1"),
                          ToolMessage("b", tool_call_id="c1"), AIMessage("It shipped."), HumanMessage("Thanks!")])
    assert [t.role for t in history.context_cache.turns(history.session_id)] == ["tool", "tool", "assistant", "user"]
    assert history.messages == [AIMessage("It shipped."), HumanMessage("Thanks!")]
