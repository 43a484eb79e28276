"""ChatGPUPrompt behaviour beyond the standard suites: engine batching, stop/length, usage, timeouts,
message conversion, the LLM cache, and guided decoding for tools and structured output (vLLM)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field, ValidationError

from gpuprompt.errors import ConfigurationError, InvalidInputError
from langchain_gpuprompt import ChatGPUPrompt, GPUPromptEmbeddings, GPUPromptSemanticCache


class _InFlight:
    """Wraps an engine's ``agenerate`` (and still calls it) to record how many requests the
    adapter had in the engine at the same time."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.original = engine.agenerate
        self.now = 0
        self.peak = 0
        self.calls = 0

    async def __call__(self, request: Any, **options: Any) -> Any:
        self.now += 1
        self.calls += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self.original(request, **options)
        finally:
            self.now -= 1


QUESTIONS = [f"In one word, what colour is a {thing}?" for thing in
             ("banana", "tomato", "leaf", "cloud", "lemon", "sky", "coal", "snow")]


def test_construction_loads_nothing_and_checks_settings() -> None:
    chat = ChatGPUPrompt(backend="transformers", temperature=0.7, max_tokens=8, stop=["\n"], seed=3)
    assert chat._engine_cache is None
    with pytest.raises(InvalidInputError, match="'temperature'"):
        ChatGPUPrompt(temperature=-1.0)
    with pytest.raises(InvalidInputError, match="'max_tokens' must be an int >= 1"):
        ChatGPUPrompt(max_tokens=0)
    with pytest.raises(ConfigurationError, match="unknown 'engine_kwargs'"):
        ChatGPUPrompt(engine_kwargs={"tensor_paralel_size": 2})
    with pytest.raises(ValidationError):
        ChatGPUPrompt(model_name="typo")  # type: ignore[call-arg]


def test_invoke_reports_usage_and_metadata(lc_chat: ChatGPUPrompt) -> None:
    message = lc_chat.invoke([SystemMessage("You are a shop assistant."), HumanMessage("Hello!")])
    assert isinstance(message, AIMessage) and message.content
    assert message.usage_metadata["input_tokens"] == lc_chat.get_num_tokens_from_messages(
        [SystemMessage("You are a shop assistant."), HumanMessage("Hello!")]
    )
    assert message.usage_metadata["total_tokens"] == (
        message.usage_metadata["input_tokens"] + message.usage_metadata["output_tokens"]
    )
    assert message.response_metadata["model_name"] == lc_chat.engine.model_name
    assert message.response_metadata["finish_reason"] in ("stop", "length")


def test_stream_concatenates_to_the_invoke_text(lc_chat: ChatGPUPrompt) -> None:
    chunks = list(lc_chat.stream("Name three colours."))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert [c.chunk_position for c in chunks].count("last") == 1 and chunks[-1].chunk_position == "last"
    assert [c.usage_metadata is not None for c in chunks].count(True) == 1
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert full.content == lc_chat.invoke("Name three colours.").content
    assert full.response_metadata["model_name"] == lc_chat.engine.model_name


async def test_astream_concatenates_to_the_ainvoke_text(lc_chat: ChatGPUPrompt) -> None:
    chunks = [c async for c in lc_chat.astream("Name a fruit.")]
    assert chunks[-1].chunk_position == "last"
    assert "".join(str(c.content) for c in chunks) == (await lc_chat.ainvoke("Name a fruit.")).content


def test_streaming_flag_serves_invoke_token_by_token(lc_chat: ChatGPUPrompt) -> None:
    from langchain_core.callbacks import BaseCallbackHandler

    class Tokens(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tokens: list[str] = []

        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            self.tokens.append(token)

    seen = Tokens()
    streaming = ChatGPUPrompt(backend="transformers", max_tokens=8, streaming=True)
    message = streaming.invoke("Name a colour.", config={"callbacks": [seen]})
    assert len(seen.tokens) > 1 and "".join(seen.tokens) == message.content
    assert message.usage_metadata["output_tokens"] >= 1


def test_max_tokens_and_stop_strings(lc_chat: ChatGPUPrompt) -> None:
    short = lc_chat.invoke("Count from one to twenty in words.", max_tokens=3)
    assert short.response_metadata["finish_reason"] == "length"
    assert short.usage_metadata["output_tokens"] == 3
    full = lc_chat.invoke("Count from one to twenty in words.", max_tokens=12).content
    words = full.split()
    assert len(words) > 2
    cut = lc_chat.invoke("Count from one to twenty in words.", max_tokens=12, stop=[words[2]])
    assert cut.content == full[: full.index(words[2])]
    assert cut.response_metadata["finish_reason"] == "stop"


def test_batch_submits_every_input_to_the_engine_at_once(lc_chat: ChatGPUPrompt, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _InFlight(lc_chat.engine)
    monkeypatch.setattr(lc_chat.engine, "agenerate", spy)
    replies = lc_chat.batch(QUESTIONS)
    assert len(replies) == len(QUESTIONS) and all(isinstance(r, AIMessage) and r.content for r in replies)
    assert spy.calls == len(QUESTIONS)
    assert spy.peak == len(QUESTIONS)  # not a pool of a few serial callers


async def test_abatch_submits_every_input_to_the_engine_at_once(
    lc_chat: ChatGPUPrompt, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _InFlight(lc_chat.engine)
    monkeypatch.setattr(lc_chat.engine, "agenerate", spy)
    replies = await lc_chat.abatch(QUESTIONS)
    assert len(replies) == len(QUESTIONS) and spy.peak == len(QUESTIONS)


def test_batch_return_exceptions_isolates_a_bad_input(lc_chat: ChatGPUPrompt) -> None:
    image = HumanMessage(content=[{"type": "image", "url": "https://example.com/cat.png"}])
    replies = lc_chat.batch(["Hello", [image]], return_exceptions=True)
    assert isinstance(replies[0], AIMessage)
    assert isinstance(replies[1], InvalidInputError) and "text only" in str(replies[1])


def test_timeout_aborts_the_request_and_the_engine_keeps_serving(lc_chat: ChatGPUPrompt) -> None:
    aborted = lc_chat.engine.stats().aborted
    with pytest.raises(TimeoutError, match="timeout=0.001"):
        lc_chat.invoke("Write a long story about a cat.", timeout=0.001, max_tokens=64)
    assert lc_chat.invoke("Hello", timeout=120).content
    assert lc_chat.engine.stats().aborted > aborted


def test_tool_and_multi_turn_histories_are_accepted(lc_chat: ChatGPUPrompt) -> None:
    history = [
        SystemMessage("You help with orders."),
        HumanMessage("Where is order 42?"),
        AIMessage("", tool_calls=[{"name": "order_status", "args": {"order_id": 42}, "id": "c1", "type": "tool_call"}]),
        ToolMessage("shipped yesterday", tool_call_id="c1", name="order_status"),
        HumanMessage("So when will it arrive?"),
    ]
    assert lc_chat.invoke(history).content
    with pytest.raises(InvalidInputError, match="text only"):
        lc_chat.invoke([HumanMessage(content=[{"type": "image", "url": "https://example.com/cat.png"}])])
    with pytest.raises(InvalidInputError, match="unexpected call option"):
        lc_chat.invoke("Hello", temprature=0.5)


def test_guided_decoding_needs_a_capable_backend(lc_chat: ChatGPUPrompt) -> None:
    if lc_chat.engine.supports_structured_output:  # pragma: no cover - a transformers build with guidance
        pytest.skip("this transformers backend supports guided decoding")

    class Answer(BaseModel):
        text: str

    with pytest.raises(ConfigurationError, match="backend='vllm'"):
        lc_chat.with_structured_output(Answer).invoke("Hi")
    with pytest.raises(ConfigurationError, match="guided decoding"):
        lc_chat.bind_tools([Answer], tool_choice="any").invoke("Hi")


def test_bind_tools_validates_tool_choice(lc_chat: ChatGPUPrompt) -> None:
    @tool
    def order_status(order_id: int) -> str:
        """Look up an order."""
        return "shipped"

    with pytest.raises(InvalidInputError, match="'tool_choice'"):
        lc_chat.bind_tools([order_status], tool_choice="refund")
    assert lc_chat.bind_tools([order_status], tool_choice="none").invoke("Hi").content  # tools disabled


def test_semantic_llm_cache_serves_paraphrases_without_the_engine(
    lc_chat: ChatGPUPrompt, lc_embeddings: GPUPromptEmbeddings
) -> None:
    chat = ChatGPUPrompt(backend="transformers", max_tokens=8, cache=GPUPromptSemanticCache(lc_embeddings, score_threshold=0.9))
    first = chat.invoke("What is your return policy?")
    requests = chat.engine.stats().requests
    again = chat.invoke("What is your return policy?")
    similar = chat.invoke("what is your return policy")
    assert again.content == first.content == similar.content
    assert chat.engine.stats().requests == requests
    other = chat.invoke("Do you ship to Norway?")
    assert chat.engine.stats().requests == requests + 1
    assert other.content


# ---------------------------------------------------------------------------------------- vLLM
class Product(BaseModel):
    """A product from a customer's message."""

    name: str = Field(description="the product's name")
    price: float = Field(description="the price in euros")


@tool
def order_status(order_id: int) -> str:
    """Look up the delivery status of an order by its number."""
    return "shipped"


@pytest.mark.vllm
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_is_schema_valid(lc_chat_vllm: ChatGPUPrompt, method: str) -> None:
    structured = lc_chat_vllm.with_structured_output(Product, method=method).bind(max_tokens=64)
    product = structured.invoke("I bought a red dress for 40 euros.")
    assert isinstance(product, Product)
    as_dict = lc_chat_vllm.with_structured_output(Product.model_json_schema(), method=method).bind(max_tokens=64)
    assert set(as_dict.invoke("Blue jeans, 60 euros.")) == {"name", "price"}


@pytest.mark.vllm
async def test_structured_output_include_raw_async(lc_chat_vllm: ChatGPUPrompt) -> None:
    structured = lc_chat_vllm.with_structured_output(Product, include_raw=True).bind(max_tokens=64)
    out = await structured.ainvoke("Wool scarf, 25 euros.")
    assert isinstance(out["raw"], AIMessage) and out["parsing_error"] is None
    assert isinstance(out["parsed"], Product)


@pytest.mark.vllm
def test_forced_tool_call_is_well_formed_sync_stream_and_async(lc_chat_vllm: ChatGPUPrompt) -> None:
    with_tools = lc_chat_vllm.bind_tools([order_status], tool_choice="any")
    message = with_tools.invoke("Where is my order number 42?")
    assert [call["name"] for call in message.tool_calls] == ["order_status"]
    assert set(message.tool_calls[0]["args"]) == {"order_id"} and isinstance(message.tool_calls[0]["args"]["order_id"], int)
    full = None
    for chunk in with_tools.stream("Where is my order number 42?"):
        full = chunk if full is None else full + chunk
    assert full.tool_calls[0]["args"] == message.tool_calls[0]["args"]
    again = asyncio.run(with_tools.ainvoke("Where is my order number 42?"))
    assert again.tool_calls[0]["args"] == message.tool_calls[0]["args"]


@pytest.mark.vllm
def test_auto_tool_choice_may_answer_in_prose(lc_chat_vllm: ChatGPUPrompt) -> None:
    message = lc_chat_vllm.bind_tools([order_status]).invoke("Where is my order number 42?", max_tokens=64)
    assert isinstance(message, AIMessage)
    # Either a well-formed call of the bound tool or a prose answer: never malformed JSON.
    assert not message.invalid_tool_calls
    assert all(call["name"] == "order_status" for call in message.tool_calls)
    assert message.tool_calls or message.content
