"""Remote conversation memory against a live ``gpuprompt serve``: ``GPUPromptChatMessageHistory`` and
``GPUPromptContextMemoryBlock`` with ``base_url`` (or ``GPUPROMPT_URL``) give the same messages,
windows and memory text as in process; workers (and replicas over Redis) share sessions; the
``/v1/sessions`` keys never meet collection chat's; errors are typed; a worker imports no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory import Memory

from gpuprompt.context import ContextCache
from gpuprompt.errors import ConfigurationError, EngineDeadError, EngineError, InputTypeError, InvalidInputError
from gpuprompt.remote import RemoteClient, RemoteConfig, RemoteContextCache
from gpuprompt.remote import _sessions as remote_sessions
from gpuprompt.server.routes.sessions import MAX_SESSION_ID_LENGTH, SESSION_KEY_PREFIX
from langchain_gpuprompt import ChatGPUPrompt, GPUPromptChatMessageHistory
from llamaindex_gpuprompt import GPUPromptContextMemoryBlock

MESSAGES: list[BaseMessage] = [
    SystemMessage("You sell clothes."),
    HumanMessage("I bought the Aurora dress in size M last week."),
    AIMessage("Thank you for your order!"),
    HumanMessage("Do you ship to Norway?"),
    AIMessage("", tool_calls=[{"name": "shipping", "args": {"country": "NO"}, "id": "c1", "type": "tool_call"}]),
    ToolMessage("3-5 days to Norway", tool_call_id="c1", name="shipping"),
    AIMessage("Yes, we ship to Norway in 3-5 days."),
    HumanMessage("Is there a discount for students?"),
]
QUERIES = [("which size did I order?", 1), ("delivery to Oslo", 2), ("cheaper for students", 3), ("hello", 0)]
CONVERSATION = [
    ("user", "I bought the Aurora cotton dress in red, size M."),
    ("assistant", "Great choice, the Aurora dress is 100% cotton."),
    ("user", "My order number is 4417 and it ships to Oslo."),
    ("assistant", "Order 4417 will ship to Oslo within two days."),
    ("user", "Also, do you sell leather hiking boots?"),
    ("assistant", "Yes, the Trailmaster boots are full-grain leather."),
    ("user", "Can I pay with a gift card?"),
    ("assistant", "Yes, gift cards are accepted at checkout."),
]


def _sid() -> str:
    return f"remote-{uuid.uuid4().hex}"


def _shape(turns: list[Any]) -> list[tuple[str, str, int, int]]:
    """What two caches must agree on (``created_at`` is the wall clock of each append)."""
    return [(t.role, t.text, t.index, t.tokens) for t in turns]


def _small_memory(session_id: str, block: GPUPromptContextMemoryBlock) -> Memory:
    # A tiny short-term budget, so that older turns are flushed into the long-term block.
    return Memory.from_defaults(
        session_id=session_id, token_limit=60, chat_history_token_ratio=0.5, token_flush_size=20, memory_blocks=[block]
    )


# ---------------------------------------------------------------------- the chat history
def test_history_equals_in_process(live, embedder) -> None:
    sid = _sid()
    local = GPUPromptChatMessageHistory(sid, context_cache=ContextCache(embedder))
    remote = GPUPromptChatMessageHistory(sid, base_url=live.url)
    assert isinstance(remote.context_cache, RemoteContextCache)
    assert "base_url='http://127.0.0.1:" in repr(remote)
    for history in (local, remote):
        history.add_messages(MESSAGES[:4])
        history.add_ai_message("Noted.")
        history.add_user_message(HumanMessage("And to Sweden?"))
        history.add_messages(MESSAGES[4:])
        history.add_messages([])
    assert remote.messages == local.messages and len(local.messages) == len(MESSAGES) + 2
    assert _shape(remote.context_cache.turns(sid)) == _shape(local.context_cache.turns(sid))
    for query, k in QUERIES:
        assert remote.relevant_messages(query, k=k) == local.relevant_messages(query, k=k), query
    # The window with every budget, as ContextCache.window computes it.
    for options in ({}, {"query": "Norway", "max_turns": 3}, {"query": "size", "max_turns": 4, "max_tokens": 20},
                    {"query": "students", "max_turns": 5, "recent": 2}, {"max_turns": 2**70}):
        assert _shape(remote.context_cache.window(sid, **options)) == _shape(local.context_cache.window(sid, **options))
    remote.clear()
    assert remote.messages == [] and remote.relevant_messages("size", k=3) == []
    assert GPUPromptChatMessageHistory(sid, base_url=live.url).messages == []


async def test_async_history_equals_in_process(live, embedder) -> None:
    sid = _sid()
    local = GPUPromptChatMessageHistory(sid, context_cache=ContextCache(embedder))
    remote = GPUPromptChatMessageHistory(sid, base_url=live.url)
    for history in (local, remote):
        await history.aadd_messages(MESSAGES)
    assert await remote.aget_messages() == await local.aget_messages() == remote.messages
    for query, k in QUERIES:
        assert await remote.arelevant_messages(query, k=k) == await local.arelevant_messages(query, k=k)
    cache = remote.context_cache
    assert _shape(await cache.awindow(sid, query="Norway", max_turns=3)) == _shape(
        await local.context_cache.awindow(sid, query="Norway", max_turns=3))
    assert [t.text for t in [await cache.aappend(sid, "user", "one more")]] == ["one more"]
    assert (await cache.aturns(sid))[-1].index == len(MESSAGES)
    assert sid in await cache.asessions()
    await remote.aclear()
    assert await remote.aget_messages() == []
    assert sid not in await cache.asessions()


def test_two_workers_share_a_session(live, monkeypatch) -> None:
    """Two worker processes are two clients (two pools): each sees the other's writes at once."""
    sid = _sid()
    config = RemoteConfig(base_url=live.url)
    one = GPUPromptChatMessageHistory(sid, context_cache=RemoteContextCache(client=RemoteClient(config)))
    monkeypatch.setenv("GPUPROMPT_URL", live.url)
    two = GPUPromptChatMessageHistory(sid)  # GPUPROMPT_URL: the process's shared client
    assert isinstance(two.context_cache, RemoteContextCache)
    assert one.context_cache.client is not two.context_cache.client
    one.add_user_message("My name is Ada.")
    two.add_ai_message("Hello Ada.")
    one.add_user_message("What is my name?")
    assert one.messages == two.messages == [
        HumanMessage("My name is Ada."), AIMessage("Hello Ada."), HumanMessage("What is my name?")
    ]
    assert [t.index for t in two.context_cache.turns(sid)] == [0, 1, 2]
    # The server keeps the turns under "@/<id>".
    assert live.state.memory.turns(SESSION_KEY_PREFIX + sid)[0].text == "My name is Ada."
    two.clear()
    assert one.messages == []
    one.context_cache.client.close()


def test_langchain_and_llamaindex_share_remote_sessions(live) -> None:
    import asyncio

    sid = _sid()
    history = GPUPromptChatMessageHistory(sid, base_url=live.url)
    history.add_messages([HumanMessage("My order number is 4417."), AIMessage("Order 4417 ships tomorrow.")])
    block = GPUPromptContextMemoryBlock(base_url=live.url, max_turns=1)
    text = asyncio.run(block.aget([ChatMessage(role="user", content="which order number?")], session_id=sid))
    assert text == "user: My order number is 4417."
    asyncio.run(block.aput([ChatMessage(role="chatbot", content="Anything else?")], session_id=sid))
    assert history.messages[-1] == AIMessage("Anything else?")
    history.clear()


@pytest.mark.parametrize("session_id", ["a/b", "..", ".", "a/turns", "x?y#z&w=1", "%2F", " é 𝄞 ", "s" * MAX_SESSION_ID_LENGTH])
def test_any_session_id_round_trips_as_itself(live, session_id) -> None:
    """Ids that look like paths, queries or escapes are one session each, never another's."""
    cache = RemoteContextCache(live.url)
    cache.clear(session_id)
    cache.append(session_id, "user", f"turn of {session_id[:20]!r}")
    assert [t.text for t in cache.turns(session_id)] == [f"turn of {session_id[:20]!r}"]
    assert session_id in cache.sessions()
    assert live.state.memory.turns(SESSION_KEY_PREFIX + session_id)[0].text == f"turn of {session_id[:20]!r}"
    cache.clear(session_id)
    assert cache.turns(session_id) == [] and session_id not in cache.sessions()


def test_long_extends_are_split_into_server_sized_requests(live, embedder, monkeypatch) -> None:
    monkeypatch.setattr(remote_sessions, "MAX_TURNS_PER_REQUEST", 3)
    sid = _sid()
    remote = RemoteContextCache(live.url)
    local = ContextCache(embedder)
    stored = remote.extend(sid, CONVERSATION)
    assert _shape(stored) == _shape(local.extend(sid, CONVERSATION)) == _shape(remote.turns(sid))
    remote.clear(sid)


def test_runnable_with_message_history_over_remote_chat(live) -> None:
    class Recorder(BaseCallbackHandler):
        def __init__(self) -> None:
            self.prompts: list[list[BaseMessage]] = []

        def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **_: Any) -> None:
            self.prompts.extend(messages)

    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a helpful shop assistant."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chat = RunnableWithMessageHistory(
        prompt | ChatGPUPrompt(base_url=live.url, max_tokens=8),
        lambda session_id: GPUPromptChatMessageHistory(session_id, base_url=live.url),
        input_messages_key="question",
        history_messages_key="history",
    )
    sid, recorder = _sid(), Recorder()
    config = {"configurable": {"session_id": sid}, "callbacks": [recorder]}
    questions = ["Hi, I am Ana and I wear size M.", "What size do I wear?"]
    replies = [chat.invoke({"question": q}, config=config) for q in questions]
    assert all(isinstance(r, AIMessage) and r.content for r in replies)
    stored = GPUPromptChatMessageHistory(sid, base_url=live.url).messages
    assert [m.content for m in stored] == [questions[0], replies[0].content, questions[1], replies[1].content]
    assert [m.content for m in recorder.prompts[-1]] == [
        "You are a helpful shop assistant.", questions[0], replies[0].content, questions[1]
    ]
    GPUPromptChatMessageHistory(sid, base_url=live.url).clear()


# ---------------------------------------------------------------------- the LlamaIndex memory block
async def test_memory_block_equals_in_process(live, embedder) -> None:
    local_cache, remote_cache = ContextCache(embedder), RemoteContextCache(live.url)
    outputs, sids = [], (_sid(), _sid())  # one session id each: the Memory's own chat stores stay apart
    for sid, block in zip(sids, (GPUPromptContextMemoryBlock(context_cache=local_cache, max_turns=2),
                                 GPUPromptContextMemoryBlock(base_url=live.url, max_turns=2))):
        memory = _small_memory(sid, block)
        for role, text in CONVERSATION:
            await memory.aput(ChatMessage(role=role, content=text))
        outputs.append([m.content for m in await memory.aget(input="Where is my order 4417 shipping?")])
    assert outputs[0] == outputs[1]
    assert "user: My order number is 4417 and it ships to Oslo." in outputs[1][0]
    assert _shape(remote_cache.turns(sids[1])) == _shape(local_cache.turns(sids[0])) != []
    await remote_cache.aclear(sids[1])


async def test_memory_block_get_put_options_equal_in_process(live, embedder) -> None:
    local_cache = ContextCache(embedder)
    a, b = _sid(), _sid()
    blocks = (GPUPromptContextMemoryBlock(context_cache=local_cache), GPUPromptContextMemoryBlock(base_url=live.url))
    for block in blocks:
        await block.aput([ChatMessage(role=r, content=t) for r, t in CONVERSATION], session_id=a)
        await block.aput([ChatMessage(role="user", content="My name is Grace."),
                          ChatMessage(role="chatbot", content="Hello Grace."),
                          ChatMessage(role="user", content="")], session_id=b)
    asked = [ChatMessage(role="user", content="leather boots"), ChatMessage(role="user", content="name?")]
    for options in ({"max_turns": 5}, {"max_turns": 3, "recent": 1}, {"max_turns": 3, "max_tokens": 16},
                    {"max_turns": 2, "query_messages": 2, "turn_template": "[{role}] {text}"}):
        answers = []
        for cache in (local_cache, RemoteContextCache(live.url)):
            block = GPUPromptContextMemoryBlock(context_cache=cache, **options)
            answers.append([await block.aget(asked, session_id=a), await block.aget(asked, session_id=b),
                            await block.aget([], session_id=a), await block.aget(asked, session_id="unknown-" + a)])
        assert answers[0] == answers[1], options
        assert answers[1][0] and answers[1][1] and answers[1][3] == ""
    await RemoteContextCache(live.url).aclear(a)
    await RemoteContextCache(live.url).aclear(b)


# ---------------------------------------------------------------------- keys: no collision with collection chat
def test_remote_sessions_never_meet_collection_chat_sessions(live) -> None:
    client = RemoteContextCache(live.url).client
    name, sid = f"shop-{uuid.uuid4().hex[:8]}", _sid()
    client.request("POST", f"/collections/{name}/documents", {"documents": ["The Aurora dress is red."]})
    client.request("POST", f"/collections/{name}/chat", {"session_id": sid, "question": "Is it red?", "max_tokens": 4})
    memory = live.state.memory
    collection_key = f"{name}/{sid}"
    assert [t.role for t in memory.turns(collection_key)] == ["user", "assistant"]
    # Neither the same id nor the collection's own key reaches the collection's session.
    cache = RemoteContextCache(live.url)
    for remote_id in (sid, collection_key):
        assert cache.turns(remote_id) == []
        cache.append(remote_id, "user", f"remote turn of {remote_id}")
    assert len(memory.turns(collection_key)) == 2
    assert sid in cache.sessions() and cache.sessions().count(collection_key) == 1
    # Deleting either kind leaves the other; the listing holds remote-mode sessions only.
    cache.clear(collection_key)
    assert len(memory.turns(collection_key)) == 2 and collection_key not in cache.sessions()
    client.request("DELETE", f"/collections/{name}/sessions/{sid}")
    assert memory.turns(collection_key) == []
    assert [t.text for t in cache.turns(sid)] == [f"remote turn of {sid}"]
    client.request("POST", f"/collections/{name}/chat", {"session_id": sid, "question": "Again?", "max_tokens": 4})
    cache.clear()  # every remote-mode session of the server: collection chats stay
    assert cache.turns(sid) == [] and sid not in cache.sessions()
    assert len(memory.turns(collection_key)) == 2
    cache.append(collection_key, "user", "before the drop")
    client.request("DELETE", f"/collections/{name}")  # dropping the collection leaves remote sessions
    assert memory.turns(collection_key) == []
    assert [t.text for t in cache.turns(collection_key)] == ["before the drop"]
    cache.clear(collection_key)


@pytest.mark.redis
def test_replicas_share_remote_sessions_through_redis(live, embedder, remote_llm_engine, redis_server) -> None:
    from gpuprompt.server import create_app

    def replica() -> Any:  # served as the conftest serves `live`
        return type(live)(create_app(embedder=embedder, llm=remote_llm_engine, redis_url=redis_server.url)).start()

    a, b = replica(), replica()
    try:
        sid = _sid()
        GPUPromptChatMessageHistory(sid, base_url=a.url).add_messages(MESSAGES[:3])
        on_b = GPUPromptChatMessageHistory(sid, base_url=b.url)
        assert on_b.messages == MESSAGES[:3]
        on_b.add_user_message("Do you ship to Norway?")
        assert GPUPromptChatMessageHistory(sid, base_url=a.url).relevant_messages("delivery abroad", k=1) == [
            HumanMessage("Do you ship to Norway?")
        ]
        assert a.state.memory.session_store.load(SESSION_KEY_PREFIX + sid).head.next_index == 4
        on_b.clear()
        assert GPUPromptChatMessageHistory(sid, base_url=a.url).messages == []
    finally:
        a.stop()
        b.stop()


# ---------------------------------------------------------------------- typed errors and configuration
def test_bad_session_ids_and_arguments_are_typed_and_send_nothing(live) -> None:
    with pytest.raises(InvalidInputError, match="'session_id' must be a non-empty str"):
        GPUPromptChatMessageHistory("", base_url=live.url)
    with pytest.raises(InvalidInputError, match=f"'session_id' must be at most {MAX_SESSION_ID_LENGTH}"):
        GPUPromptChatMessageHistory("s" * (MAX_SESSION_ID_LENGTH + 1), base_url=live.url)
    with pytest.raises(ConfigurationError, match="'default_session_id' must be at most"):
        GPUPromptContextMemoryBlock(base_url=live.url, default_session_id="s" * (MAX_SESSION_ID_LENGTH + 1))
    cache = RemoteContextCache(live.url)
    with pytest.raises(InputTypeError, match="'session_id'"):
        cache.turns(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="'role'"):
        cache.append("s", "robot", "hi")
    with pytest.raises(InputTypeError, match=r"'turns\[1\]"):
        cache.extend("s", [("user", "hi"), ("user",)])
    with pytest.raises(InvalidInputError, match="'max_turns'"):
        cache.window("s", query="x", max_turns=-1)
    with pytest.raises(InvalidInputError, match="'max_tokens'"):
        cache.window("s", max_tokens=True)  # type: ignore[arg-type]
    history = GPUPromptChatMessageHistory(_sid(), base_url=live.url)
    with pytest.raises(InvalidInputError, match=r"'messages\[1\]'.*content block"):
        history.add_messages([HumanMessage("hi"), HumanMessage([{"type": "image_url", "image_url": {"url": "x"}}])])
    with pytest.raises(InvalidInputError, match="'k'"):
        history.relevant_messages("x", k=-1)
    assert history.messages == []
    assert history.session_id not in cache.sessions()


def test_the_server_checks_raw_requests_too(live) -> None:
    client = RemoteContextCache(live.url).client
    too_long = "s" * (MAX_SESSION_ID_LENGTH + 1)
    for method, path, body, match in [
        ("GET", "/sessions//turns", None, "'session_id' must be a non-empty str"),
        ("GET", f"/sessions/{too_long}/turns", None, f"at most {MAX_SESSION_ID_LENGTH}"),
        ("POST", "/sessions/s/turns", {"turns": [{"role": "robot", "text": "hi"}]}, "role"),
        ("POST", "/sessions/s/turns", {"turns": [{"role": "user", "content": "hi"}]}, "text"),
        ("POST", "/sessions/s/turns", {"turns": "hi"}, "turns"),
        ("POST", "/sessions/s/window", {"max_turns": -1}, "max_turns"),
        ("POST", "/sessions/s/window", {"max_turns": 2**64}, "max_turns"),
        ("POST", "/sessions/s/window", {"query": "x", "k": 2}, "k"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            client.request(method, path, body, idempotent=False)
    assert "s" not in RemoteContextCache(live.url).sessions()


def test_dead_server_fails_fast_and_typed(dead_url) -> None:
    import asyncio

    started = time.monotonic()
    history = GPUPromptChatMessageHistory(_sid(), base_url=dead_url)
    with pytest.raises(EngineDeadError, match="could not connect"):
        history.add_user_message("hi")
    with pytest.raises(EngineDeadError):
        _ = history.messages  # a read is retried (twice, with backoff), then fails
    with pytest.raises(EngineDeadError):
        asyncio.run(history.aget_messages())
    block = GPUPromptContextMemoryBlock(base_url=dead_url)
    with pytest.raises(EngineDeadError):
        asyncio.run(block.aget([ChatMessage(role="user", content="hi")]))
    with pytest.raises(EngineDeadError):
        asyncio.run(block.aput([ChatMessage(role="user", content="hi")]))
    assert time.monotonic() - started < 10


def test_api_key(live_keyed, monkeypatch) -> None:
    sid = _sid()
    with pytest.raises(EngineError, match="api_key"):
        GPUPromptChatMessageHistory(sid, base_url=live_keyed.url, api_key="wrong").add_user_message("hi")
    GPUPromptChatMessageHistory(sid, base_url=live_keyed.url, api_key="sesame").add_user_message("hi")
    monkeypatch.setenv("GPUPROMPT_URL", live_keyed.url)
    monkeypatch.setenv("GPUPROMPT_API_KEY", "sesame")
    assert GPUPromptChatMessageHistory(sid).messages == [HumanMessage("hi")]
    block = GPUPromptContextMemoryBlock(recent=1)
    assert block.base_url == live_keyed.url and "sesame" not in repr(block) and "api_key" not in block.model_dump()
    GPUPromptChatMessageHistory(sid).clear()


def test_remote_configuration(live, embedder, monkeypatch) -> None:
    monkeypatch.delenv("GPUPROMPT_URL", raising=False)
    local = ContextCache(embedder)
    remote = RemoteContextCache(live.url)
    for make in (lambda **kw: GPUPromptChatMessageHistory("s", **kw), lambda **kw: GPUPromptContextMemoryBlock(**kw)):
        for cache in (local, remote):
            with pytest.raises(ConfigurationError, match="both 'context_cache' and 'base_url'"):
                make(context_cache=cache, base_url=live.url)
            with pytest.raises(ConfigurationError, match="both 'context_cache' and 'base_url'"):
                make(context_cache=cache, api_key="k")
        with pytest.raises(ConfigurationError, match="'api_key' but no server"):
            make(api_key="k")
        with pytest.raises(ConfigurationError, match="'base_url' must be"):
            make(base_url="localhost:8000")
        assert make(context_cache=remote).context_cache is remote  # an injected remote cache
    with pytest.raises(InputTypeError, match="'context_cache' must be a gpuprompt.ContextCache, a gpuprompt.remote"):
        GPUPromptChatMessageHistory("s", context_cache={})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="'context_cache' must be a gpuprompt.ContextCache, a gpuprompt.remote"):
        GPUPromptContextMemoryBlock(context_cache={})
    # GPUPROMPT_URL picks remote mode; an explicit context_cache still wins over it.
    monkeypatch.setenv("GPUPROMPT_URL", live.url)
    monkeypatch.delenv("GPUPROMPT_API_KEY", raising=False)
    assert isinstance(GPUPromptChatMessageHistory("s").context_cache, RemoteContextCache)
    assert isinstance(GPUPromptContextMemoryBlock().context_cache, RemoteContextCache)
    assert GPUPromptChatMessageHistory("s", context_cache=local).context_cache is local
    assert GPUPromptContextMemoryBlock(context_cache=local).context_cache is local
    assert remote_sessions.MAX_REMOTE_SESSION_ID_LENGTH == MAX_SESSION_ID_LENGTH


# ---------------------------------------------------------------------- the worker process
def test_a_remote_memory_worker_imports_no_torch(live) -> None:
    sid = _sid()
    code = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from langchain_core.messages import AIMessage, HumanMessage
        from llama_index.core.base.llms.types import ChatMessage
        from langchain_gpuprompt import GPUPromptChatMessageHistory
        from llamaindex_gpuprompt import GPUPromptContextMemoryBlock

        out = {{}}
        history = GPUPromptChatMessageHistory({sid!r})
        history.add_messages([HumanMessage("My order number is 4417."), AIMessage("It ships tomorrow.")])
        asyncio.run(history.aadd_messages([HumanMessage("Do you sell boots?")]))
        out["messages"] = [m.content for m in history.messages]
        out["relevant"] = [m.content for m in history.relevant_messages("order number", k=1)]
        block = GPUPromptContextMemoryBlock(max_turns=1)
        asyncio.run(block.aput([ChatMessage(role="assistant", content="Yes, leather boots.")], session_id={sid!r}))
        out["block"] = asyncio.run(block.aget([ChatMessage(role="user", content="boots?")], session_id={sid!r}))
        heavy = ("torch", "transformers", "sentence_transformers", "vllm", "faiss", "safetensors", "accelerate")
        out["heavy"] = sorted(m for m in heavy if m in sys.modules)
        print(json.dumps(out))
        """
    )
    env = {**os.environ, "GPUPROMPT_URL": live.url, "HF_HUB_OFFLINE": "1"}
    env.pop("GPUPROMPT_API_KEY", None)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    assert out["messages"] == ["My order number is 4417.", "It ships tomorrow.", "Do you sell boots?"]
    assert out["relevant"] == ["My order number is 4417."]
    assert out["block"] in ("assistant: Yes, leather boots.", "user: Do you sell boots?")
    # The server holds the worker's turns under "@/<id>".
    assert [t.text for t in live.state.memory.turns(SESSION_KEY_PREFIX + sid)][-1] == "Yes, leather boots."
    RemoteContextCache(live.url).clear(sid)
