"""Tool calls and tool results in remote conversation memory, against a live ``gpuprompt serve``:
the LangChain history gives back what LangChain's own ``InMemoryChatMessageHistory`` gives back,
turns and windows equal the in-process ones, the LlamaIndex block renders calls with their results
as in process, and the sessions API checks the tool fields (400 on bad ones)."""

from __future__ import annotations

import uuid

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import BaseMessage
from llama_index.core.base.llms.types import ChatMessage
from support.tool_history import DIFFERENTIAL, shape

from gpuprompt.context import ContextCache
from gpuprompt.errors import InvalidInputError
from gpuprompt.remote import RemoteContextCache
from gpuprompt.server.routes.sessions import SESSION_KEY_PREFIX
from langchain_gpuprompt import GPUPromptChatMessageHistory
from llamaindex_gpuprompt import GPUPromptContextMemoryBlock

TOOL_TURNS = [
    {"role": "user", "content": "Where is my order 4417?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "order_status", "arguments": '{"order_id": 4417}'}}]},
    {"role": "tool", "content": "shipped yesterday from Oslo", "tool_call_id": "c1", "name": "order_status",
     "status": "success"},
    {"role": "assistant", "content": "It shipped yesterday.", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "track", "arguments": "{}"}},
        {"id": "c3", "type": "function", "function": {"name": "eta", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "content": "in transit", "tool_call_id": "c2"},
    {"role": "tool", "content": "eta service down", "tool_call_id": "c3", "name": "eta", "status": "error"},
    {"role": "user", "content": "Can I pay with a gift card?"},
]


def _sid() -> str:
    return f"remote-tools-{uuid.uuid4().hex}"


def _full(turns) -> list[tuple]:
    """Everything two caches must agree on (``created_at`` is the wall clock of each append)."""
    return [(t.role, t.text, t.index, t.tokens, t.tool_calls, t.tool_call_id, t.name, t.status) for t in turns]


@pytest.mark.parametrize("messages", list(DIFFERENTIAL.values()), ids=list(DIFFERENTIAL))
def test_remote_history_returns_what_in_memory_history_returns(live, embedder, messages: list[BaseMessage]) -> None:
    sid = _sid()
    reference = InMemoryChatMessageHistory()
    remote = GPUPromptChatMessageHistory(sid, base_url=live.url)
    local = GPUPromptChatMessageHistory(sid, context_cache=ContextCache(embedder))
    for history in (reference, remote, local):
        history.add_messages(messages[:1])
        history.add_messages(messages[1:])
    assert shape(remote.messages) == shape(reference.messages) == shape(messages) == shape(local.messages)
    assert _full(remote.context_cache.turns(sid)) == _full(local.context_cache.turns(sid))
    # The server stored the very turns: a fresh client of the same session reads them back.
    assert shape(GPUPromptChatMessageHistory(sid, base_url=live.url).messages) == shape(messages)
    assert live.state.memory.turns(SESSION_KEY_PREFIX + sid) == remote.context_cache.turns(sid)
    remote.clear()


async def test_async_remote_history_returns_what_in_memory_history_returns(live) -> None:
    reference = InMemoryChatMessageHistory()
    remote = GPUPromptChatMessageHistory(_sid(), base_url=live.url)
    for messages in DIFFERENTIAL.values():
        await reference.aadd_messages(messages)
        await remote.aadd_messages(messages)
    assert shape(await remote.aget_messages()) == shape(await reference.aget_messages())
    await remote.aclear()


def test_remote_turns_and_windows_equal_in_process(live, embedder) -> None:
    sid = _sid()
    remote, local = RemoteContextCache(live.url), ContextCache(embedder)
    stored = remote.extend(sid, TOOL_TURNS[:3])
    assert _full(stored) == _full(local.extend(sid, TOOL_TURNS[:3]))
    remote.append(sid, TOOL_TURNS[3])
    local.append(sid, TOOL_TURNS[3])
    remote.extend(sid, TOOL_TURNS[4:])
    local.extend(sid, TOOL_TURNS[4:])
    assert [t.as_message() for t in remote.turns(sid)] == TOOL_TURNS
    assert _full(remote.turns(sid)) == _full(local.turns(sid))
    for options in ({}, {"max_turns": 2}, {"max_turns": 4}, {"query": "order shipped", "max_turns": 3, "recent": 1},
                    {"query": "eta to Oslo", "max_turns": 5, "max_tokens": 30}, {"query": "gift card", "max_turns": 1}):
        assert _full(remote.window(sid, **options)) == _full(local.window(sid, **options)), options
    remote.clear(sid)


async def test_remote_memory_block_renders_calls_as_in_process(live, embedder) -> None:
    sid = _sid()
    messages = [
        ChatMessage(role="user", content="Price of the Trailmaster boots?"),
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "price", "arguments": '{"item": "boots"}'}}]}),
        ChatMessage(role="tool", content="129 EUR", additional_kwargs={"tool_call_id": "c1", "name": "price"}),
        ChatMessage(role="assistant", content="They cost 129 EUR."),
    ]
    texts = []
    for block in (GPUPromptContextMemoryBlock(context_cache=ContextCache(embedder), max_turns=3),
                  GPUPromptContextMemoryBlock(base_url=live.url, max_turns=3)):
        await block.aput(messages, session_id=sid)
        texts.append(await block.aget([ChatMessage(role="user", content="boots price")], session_id=sid))
    assert texts[0] == texts[1]
    assert 'assistant: called price({"item": "boots"}) -> 129 EUR' in texts[1].splitlines()
    await RemoteContextCache(live.url).aclear(sid)


def test_the_server_checks_tool_fields(live) -> None:
    client = RemoteContextCache(live.url).client
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for turn, match in [
        ({"role": "user", "text": "x", "tool_calls": [call]}, "only an 'assistant' turn"),
        ({"role": "assistant", "text": "x", "tool_call_id": "c"}, "belongs to a 'tool' turn"),
        ({"role": "user", "text": "x", "name": "f"}, "belongs to a 'tool' turn"),
        ({"role": "tool", "text": "x", "status": "failed"}, "status"),
        ({"role": "tool", "text": "x", "tool_call_id": ""}, "tool_call_id"),
        ({"role": "assistant", "text": "", "tool_calls": [{**call, "function": {"name": "bad name!"}}]}, "name"),
        ({"role": "assistant", "text": "", "tool_calls": [{**call, "function": {"name": "f", "arguments": "[1]"}}]},
         "arguments"),
        ({"role": "assistant", "text": "", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}, "id"),
        ({"role": "tool", "text": "x", "extra": 1}, "extra"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            client.request("POST", "/sessions/tools-bad/turns", {"turns": [{"role": "user", "text": "ok"}, turn]},
                           idempotent=False)
    assert RemoteContextCache(live.url).turns("tools-bad") == []  # a refused request stored nothing
    # The wire shape: a plain turn has no tool keys; a tool turn only those that are set.
    answer = client.request("POST", "/sessions/tools-ok/turns", {"turns": [
        {"role": "user", "text": "hi"}, {"role": "assistant", "text": "", "tool_calls": [call]},
        {"role": "tool", "text": "1", "tool_call_id": "c"}]}, idempotent=False)
    assert set(answer["data"][0]) == {"role", "text", "index", "created_at", "tokens"}
    assert answer["data"][1]["tool_calls"] == [call]
    assert set(answer["data"][2]) == {"role", "text", "index", "created_at", "tokens", "tool_call_id"}
    RemoteContextCache(live.url).clear("tools-ok")
