"""Memory: our vector store under LlamaIndex's VectorMemoryBlock, and the ContextCache block."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory import Memory, VectorMemoryBlock

from gpuprompt import ContextCache
from gpuprompt.errors import ConfigurationError
from llamaindex_gpuprompt import GPUPromptContextMemoryBlock, GPUPromptVectorStore

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


def _small_memory(session_id: str, block) -> Memory:
    # A tiny short-term budget so that older turns are flushed into the long-term block.
    return Memory.from_defaults(
        session_id=session_id, token_limit=60, chat_history_token_ratio=0.5, token_flush_size=20, memory_blocks=[block]
    )


async def _fill(memory: Memory, turns=CONVERSATION) -> None:
    for role, text in turns:
        await memory.aput(ChatMessage(role=role, content=text))


async def test_vector_memory_block_over_our_store(li_embed) -> None:
    store = GPUPromptVectorStore()
    block = VectorMemoryBlock(vector_store=store, embed_model=li_embed, similarity_top_k=1)
    memory = _small_memory("vector-session", block)
    await _fill(memory)
    assert len(store.client) > 0
    messages = await memory.aget(input="Where does order 4417 ship to?")
    system = messages[0]
    assert system.role == "system"
    assert "Oslo" in system.content and "<RetrievedMessages>" in system.content
    # The stored nodes carry the session id, which VectorMemoryBlock filters on.
    assert all(n.metadata["session_id"] == "vector-session" for n in store.get_nodes())


async def test_context_cache_block_returns_relevant_past_turns(li_embed) -> None:
    cache = ContextCache(li_embed.embedder)
    block = GPUPromptContextMemoryBlock(context_cache=cache, max_turns=2)
    memory = _small_memory("customer-1", block)
    await _fill(memory)
    stored = cache.turns("customer-1")
    assert [t.text for t in stored][:2] == [CONVERSATION[0][1], CONVERSATION[1][1]]
    messages = await memory.aget(input="Where is my order 4417 shipping?")
    system = messages[0].content
    assert "<RelevantHistory>" in system
    relevant = system.split("<RelevantHistory>")[1].split("</RelevantHistory>")[0].strip()
    assert relevant.splitlines() == [
        "user: My order number is 4417 and it ships to Oslo.",
        "assistant: Order 4417 will ship to Oslo within two days.",
    ]


async def test_reads_do_not_re_embed_past_turns(li_embed) -> None:
    cache = ContextCache(li_embed.embedder)
    block = GPUPromptContextMemoryBlock(context_cache=cache, max_turns=3)
    await block.aput([ChatMessage(role=r, content=t) for r, t in CONVERSATION], session_id="s-embed")
    stats = li_embed.embedder.stats
    before = stats().texts
    for question in ("Which boots are leather?", "What did I order?", "Payment options?"):
        text = await block.aget([ChatMessage(role="user", content=question)], session_id="s-embed")
        assert text.count("\n") == 2  # three turns, one per line
    # Each read embedded its query only: 3 texts, not 3 x 8 turns.
    assert stats().texts - before == 3


async def test_sessions_are_isolated_and_roles_mapped(li_embed) -> None:
    cache = ContextCache(li_embed.embedder)
    block = GPUPromptContextMemoryBlock(context_cache=cache, max_turns=5)
    await block.aput([ChatMessage(role="user", content="My name is Ada.")], session_id="a")
    await block.aput([ChatMessage(role="user", content="My name is Grace."),
                      ChatMessage(role="chatbot", content="Hello Grace."),
                      ChatMessage(role="user", content="")], session_id="b")
    a = await block.aget([ChatMessage(role="user", content="What is my name?")], session_id="a")
    b = await block.aget([ChatMessage(role="user", content="What is my name?")], session_id="b")
    assert a == "user: My name is Ada."
    assert b == "user: My name is Grace.\nassistant: Hello Grace."
    assert await block.aget([], session_id="a") == ""
    assert await block.aget([ChatMessage(role="user", content="name?")], session_id="unknown") == ""


async def test_recent_turns_and_token_budget(li_embed) -> None:
    cache = ContextCache(li_embed.embedder)
    block = GPUPromptContextMemoryBlock(context_cache=cache, max_turns=3, recent=1)
    await block.aput([ChatMessage(role=r, content=t) for r, t in CONVERSATION], session_id="r")
    text = await block.aget([ChatMessage(role="user", content="leather boots")], session_id="r")
    assert text.splitlines()[-1] == "assistant: Yes, gift cards are accepted at checkout."
    assert "Trailmaster" in text
    tight = GPUPromptContextMemoryBlock(context_cache=cache, max_turns=3, max_tokens=16)
    assert len((await tight.aget([ChatMessage(role="user", content="leather boots")], session_id="r")).splitlines()) == 1


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="'context_cache' must be a gpuprompt.ContextCache"):
        GPUPromptContextMemoryBlock(context_cache={})
    with pytest.raises(ConfigurationError, match="'max_turns' must be greater than or equal to 1"):
        GPUPromptContextMemoryBlock(max_turns=0)
    with pytest.raises(ConfigurationError, match="'unknown_option' is not an option"):
        GPUPromptContextMemoryBlock(unknown_option=True)
    with pytest.raises(ConfigurationError, match="'name'"):
        GPUPromptContextMemoryBlock(name=None)
    with pytest.raises(ConfigurationError, match="'turn_template'.*width"):
        GPUPromptContextMemoryBlock(turn_template="{text:>99999999999}")


TOOL_CONVERSATION = [
    ChatMessage(role="user", content="How much are the Trailmaster boots, and are they in stock?"),
    ChatMessage(role="assistant", content="Let me check.", additional_kwargs={"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "price", "arguments": '{"item": "Trailmaster"}'}},
        {"id": "c2", "type": "function", "function": {"name": "stock", "arguments": '{"item": "Trailmaster"}'}}]}),
    ChatMessage(role="tool", content="129 EUR", additional_kwargs={"tool_call_id": "c1", "name": "price"}),
    ChatMessage(role="tool", content="stock service timed out", additional_kwargs={"tool_call_id": "c2"}),
    ChatMessage(role="assistant", content="They cost 129 EUR; stock is unknown right now."),
    ChatMessage(role="user", content="Can I pay with a gift card?"),
]


async def test_a_tool_call_and_its_result_are_stored_and_rendered_together(li_embed) -> None:
    cache = ContextCache(li_embed.embedder)
    block = GPUPromptContextMemoryBlock(context_cache=cache, max_turns=10)
    await block.aput(TOOL_CONVERSATION, session_id="tools")
    turns = cache.turns("tools")
    assert [t.role for t in turns] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert [c.id for c in turns[1].tool_calls] == ["c1", "c2"] and turns[2].name == "price"
    # The stored result of a failed tool is marked in the rendering by its status (set in the core).
    cache.extend("tools", [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c3", "name": "gift_card", "arguments": "{}"}]},
        {"role": "tool", "content": "not accepted online", "tool_call_id": "c3", "status": "error"},
    ])
    text = await block.aget([ChatMessage(role="user", content="boots price")], session_id="tools")
    assert text.splitlines() == [
        "user: How much are the Trailmaster boots, and are they in stock?",
        "assistant: Let me check.",
        'assistant: called price({"item": "Trailmaster"}) -> 129 EUR',
        'assistant: called stock({"item": "Trailmaster"}) -> stock service timed out',
        "assistant: They cost 129 EUR; stock is unknown right now.",
        "user: Can I pay with a gift card?",
        "assistant: called gift_card({}) -> error: not accepted online",
    ]
    # Under a turn budget a call goes with its results or not at all.
    for max_turns in range(1, 9):
        small = GPUPromptContextMemoryBlock(context_cache=cache, max_turns=max_turns)
        lines = (await small.aget([ChatMessage(role="user", content="boots price")], session_id="tools")).splitlines()
        called = [line for line in lines if "called " in line]
        assert all(" -> " in line for line in called), (max_turns, lines)
        if any("called price" in line for line in lines):
            assert any("called stock" in line for line in lines) and "assistant: Let me check." in lines


async def test_a_call_without_its_result_renders_alone_and_an_orphan_result_never(li_embed) -> None:
    cache = ContextCache(li_embed.embedder, max_turns_per_session=3)
    block = GPUPromptContextMemoryBlock(context_cache=cache, max_turns=5, recent=5)
    await block.aput(TOOL_CONVERSATION[1:2], session_id="o")
    assert await block.aget([], session_id="o") == (
        'assistant: Let me check.\nassistant: called price({"item": "Trailmaster"})\n'
        'assistant: called stock({"item": "Trailmaster"})')
    await block.aput(TOOL_CONVERSATION[2:], session_id="o")  # the cap drops the call: its results are orphans
    assert [t.role for t in cache.turns("o")] == ["tool", "assistant", "user"]
    assert (await block.aget([], session_id="o")).splitlines() == [
        "assistant: They cost 129 EUR; stock is unknown right now.", "user: Can I pay with a gift card?"]
