"""ChatGPUPrompt behaviour beyond the standard suites: engine batching, stop/length, usage, timeouts,
message conversion, the LLM cache, and tool calling / structured output through the core (both backends)."""

from __future__ import annotations

import asyncio
import re
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
    # pydantic's refusals come back typed, naming the field
    for bad, field in [({"temperature": "hot"}, "temperature"), ({"max_tokens": "many"}, "max_tokens"),
                       ({"backend": "llamacpp"}, "backend"), ({"stop": "x"}, "stop"), ({"modle": "x"}, "modle")]:
        with pytest.raises(ConfigurationError, match=f"'{field}'") as raised:
            ChatGPUPrompt(**bad)
        assert isinstance(raised.value.__cause__, ValidationError)
    # ChatOpenAI's and Hugging Face's names for the same settings
    renamed = ChatGPUPrompt(model_name="a-model-folder", max_new_tokens=7)  # type: ignore[call-arg]
    assert (renamed.model, renamed.max_tokens) == ("a-model-folder", 7)
    assert ChatGPUPrompt(max_completion_tokens=9).max_tokens == 9  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="both 'model_name' and 'model'"):
        ChatGPUPrompt(model_name="a", model="b")  # type: ignore[call-arg]


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


def test_the_cores_sampling_fields_are_call_options_fields_and_model_kwargs(lc_chat: ChatGPUPrompt) -> None:
    """What a ChatOpenAI app sets (frequency_penalty, presence_penalty, model_kwargs, stop_sequences)
    and the core's other sampling fields reach the engine, and part LangChain's cache keys."""
    from gpuprompt.llm import GenerationRequest

    short = [{"role": "user", "content": "Say just the word yes."}]
    [fixed] = lc_chat.engine.generate([GenerationRequest(messages=short, max_tokens=12, ignore_eos=True)])
    assert fixed.usage.completion_tokens == 12
    assert lc_chat.invoke("Say just the word yes.", max_tokens=12, ignore_eos=True).content == fixed.text
    by_kwargs = ChatGPUPrompt(backend="transformers", max_tokens=12, model_kwargs={"ignore_eos": True})
    assert by_kwargs.invoke("Say just the word yes.").content == fixed.text
    assert by_kwargs.invoke("Say just the word yes.", ignore_eos=False).content != fixed.text  # the call wins
    repeat = "Repeat after me forever: la la la la la la la la la la"
    [penalised] = lc_chat.engine.generate([GenerationRequest(messages=[{"role": "user", "content": repeat}],
                                                             max_tokens=12, frequency_penalty=2.0, top_k=5)])
    chat = ChatGPUPrompt(backend="transformers", max_tokens=12, frequency_penalty=2.0, model_kwargs={"top_k": 5})
    assert chat.invoke(repeat).content == penalised.text
    assert chat._get_llm_string() != ChatGPUPrompt(backend="transformers", max_tokens=12)._get_llm_string()
    assert ChatGPUPrompt(backend="transformers", stop_sequences=["\n"]).stop == ["\n"]
    with pytest.raises(ConfigurationError, match=r"unknown 'model_kwargs' key\(s\) \['n'\]"):
        ChatGPUPrompt(backend="transformers", model_kwargs={"n": 2})
    with pytest.raises(InvalidInputError, match="'frequency_penalty'"):
        ChatGPUPrompt(backend="transformers", frequency_penalty=3.0)
    with pytest.raises(InvalidInputError, match=r"valid: \[.*'stop'"):
        lc_chat.invoke("Hello", n=2)


def test_bind_tools_validates_tool_choice(lc_chat: ChatGPUPrompt) -> None:
    @tool
    def order_status(order_id: int) -> str:
        """Look up an order."""
        return "shipped"

    with pytest.raises(InvalidInputError, match="'tool_choice'"):
        lc_chat.bind_tools([order_status], tool_choice="refund")
    with pytest.raises(InvalidInputError, match="'tool_choice'"):
        lc_chat.bind_tools([order_status], tool_choice=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="needs tools"):
        lc_chat.invoke("Hi", tool_choice="any")
    with pytest.raises(InvalidInputError, match="tools"):
        lc_chat.bind_tools([{"type": "function", "function": {"name": "bad name!", "parameters": {}}}])
    # "none": the tools are described to the model, but no call is produced.
    message = lc_chat.bind_tools([order_status], tool_choice="none").invoke("Where is order 42?")
    assert message.content and not message.tool_calls


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


# -------------------------------------------------------------- tools and structured output (both backends)
# The schemas bound their values (numbers in a range, short strings). Left unbounded, the 135M model
# often writes digits until max_tokens cuts the call off (its own quality); the grammar enforces the
# bounds, so the shape under test always completes.
class Product(BaseModel):
    """A product from a customer's message."""

    name: str = Field(max_length=40, description="the product's name")
    price: float = Field(ge=0, le=10000, description="the price in euros")


class OrderQuery(BaseModel):
    order_id: int = Field(ge=1, le=99999, description="the order number")


class RefundQuery(BaseModel):
    order_id: int = Field(ge=1, le=99999, description="the order number")
    reason: str = Field(max_length=40, description="why, in a few words")


@tool(args_schema=OrderQuery)
def order_status(order_id: int) -> str:
    """Look up the delivery status of an order by its number."""
    return "shipped"


@tool(args_schema=RefundQuery)
def refund(order_id: int, reason: str) -> str:
    """Refund an order."""
    return "refunded"


@pytest.fixture(params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def chat(request: pytest.FixtureRequest) -> ChatGPUPrompt:
    """A ChatGPUPrompt on each backend (the session's engines), with room for guided JSON."""
    base = request.getfixturevalue("lc_chat" if request.param == "transformers" else "lc_chat_vllm")
    return base.model_copy(update={"max_tokens": 64})  # its engine: a bare backend="vllm" would start another


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_structured_output_is_schema_valid(chat: ChatGPUPrompt, method: str) -> None:
    prompt = "I bought a red dress for 40 euros. Reply in JSON with the keys name and price."
    structured = chat.with_structured_output(Product, method=method)
    if method == "json_mode":  # any JSON object: the keys are the model's own choice
        raw = chat.with_structured_output(Product.model_json_schema(), method=method).invoke(prompt)
        assert isinstance(raw, dict)
        return
    assert isinstance(structured.invoke(prompt), Product)
    as_dict = chat.with_structured_output(Product.model_json_schema(), method=method)
    assert set(as_dict.invoke("Blue jeans, 60 euros.")) == {"name", "price"}


async def test_structured_output_include_raw_async(chat: ChatGPUPrompt) -> None:
    structured = chat.with_structured_output(Product, include_raw=True)
    out = await structured.ainvoke("Wool scarf, 25 euros.")
    assert isinstance(out["raw"], AIMessage) and out["parsing_error"] is None
    assert isinstance(out["parsed"], Product)
    assert out["raw"].response_metadata["model_provider"] == "gpuprompt"


def test_forced_tool_call_is_typed_sync_stream_and_async(chat: ChatGPUPrompt) -> None:
    with_tools = chat.bind_tools([order_status, refund], tool_choice="order_status", strict=True)
    message = with_tools.invoke("Where is my order number 42?")
    assert [call["name"] for call in message.tool_calls] == ["order_status"]
    call = message.tool_calls[0]
    assert set(call["args"]) == {"order_id"} and isinstance(call["args"]["order_id"], int)
    assert call["id"].startswith("call_") and call["type"] == "tool_call"
    assert message.response_metadata == {
        "model_provider": "gpuprompt", "model_name": chat.engine.model_name, "finish_reason": "tool_calls",
    }
    chunks = list(with_tools.stream("Where is my order number 42?"))
    assert any(c.tool_call_chunks for c in chunks) and chunks[-1].chunk_position == "last"
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [("order_status", call["args"])]
    assert full.response_metadata["finish_reason"] == "tool_calls"
    again = asyncio.run(with_tools.ainvoke("Where is my order number 42?"))
    assert again.tool_calls[0]["args"] == call["args"]


def test_required_tool_choice_and_parallel_calls(chat: ChatGPUPrompt) -> None:
    one = chat.bind_tools([order_status, refund], tool_choice="any", parallel_tool_calls=False).invoke(
        "Refund order 7 because it arrived broken."
    )
    assert len(one.tool_calls) == 1 and one.tool_calls[0]["name"] in {"order_status", "refund"}
    assert not one.invalid_tool_calls


def test_auto_tool_choice_may_answer_in_prose(chat: ChatGPUPrompt) -> None:
    message = chat.bind_tools([order_status]).invoke("Where is my order number 42?")
    assert isinstance(message, AIMessage)
    # Either a well-formed call of the bound tool or a prose answer: never malformed output.
    assert not message.invalid_tool_calls
    assert all(call["name"] == "order_status" for call in message.tool_calls)
    assert message.tool_calls or message.content


def test_tool_turns_reach_the_core_as_tool_messages(lc_chat: ChatGPUPrompt) -> None:
    """AI tool calls become assistant ``tool_calls``, a ToolMessage a ``tool`` turn with its id."""
    from langchain_gpuprompt._chat_convert import core_messages

    history = [
        HumanMessage("Where is order 42?"),
        AIMessage("", tool_calls=[{"name": "order_status", "args": {"order_id": 42}, "id": "c1", "type": "tool_call"}]),
        ToolMessage("shipped yesterday", tool_call_id="c1", name="order_status"),
    ]
    turns = core_messages(history)
    assert turns[1]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "order_status", "arguments": {"order_id": 42}}}
    ]
    assert turns[2] == {"role": "tool", "content": "shipped yesterday", "tool_call_id": "c1", "name": "order_status"}
    # The rendered prompt carries the call and the result (more tokens than without them).
    assert lc_chat.get_num_tokens_from_messages(history) > lc_chat.get_num_tokens_from_messages(history[:1])


@pytest.mark.parametrize("backend", ["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_prefix_cache_hits_are_reported_as_cache_read(request: pytest.FixtureRequest, backend: str) -> None:
    """The prefix cache serves the repeated system prompt: ``input_token_details.cache_read``."""
    chat = request.getfixturevalue("lc_chat_vllm" if backend == "vllm" else "lc_chat")
    system = "You are the support assistant of a clothing shop. " * 20
    messages = [SystemMessage(system), HumanMessage("Hello!")]
    chat.invoke(messages, max_tokens=2)
    again = chat.invoke(messages, max_tokens=2)
    cached = again.usage_metadata["input_token_details"]["cache_read"]
    assert 0 < cached <= again.usage_metadata["input_tokens"]


def test_no_cache_read_detail_without_cache_hits(lc_chat: ChatGPUPrompt) -> None:
    """Right after a cache reset nothing is served from it: no ``cache_read`` figure is invented."""
    assert lc_chat.engine.reset_prefix_cache()
    message = lc_chat.invoke("Hello!", max_tokens=2)
    assert "input_token_details" not in message.usage_metadata


def test_token_count_includes_bound_tools(lc_chat: ChatGPUPrompt) -> None:
    messages = [HumanMessage("Where is order 42?")]
    assert lc_chat.get_num_tokens_from_messages(messages, tools=[order_status]) > lc_chat.get_num_tokens_from_messages(
        messages
    )


class Address(BaseModel):
    city: str
    country: str


class Customer(BaseModel):
    """A customer and where they live."""

    name: str
    address: Address


def test_nested_models_work_as_structured_output_and_tools(lc_chat: ChatGPUPrompt) -> None:
    chat = ChatGPUPrompt(backend=lc_chat.backend, max_tokens=64)
    prompt = "Bob lives in Paris, France. Give the customer as JSON."
    assert isinstance(chat.with_structured_output(Customer, method="json_schema").invoke(prompt), Customer)
    # function_calling binds parallel_tool_calls=False (as langchain-openai): one call, then the reply ends.
    raw = chat.with_structured_output(Customer, method="function_calling", include_raw=True).invoke(prompt)
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Customer)
    assert len(raw["raw"].tool_calls) == 1 and raw["raw"].response_metadata["finish_reason"] == "tool_calls"
    # A nested tool beside a nested response format, with "auto".
    message = chat.bind_tools([Address], response_format=json_schema_of(Customer)).invoke(prompt)
    assert not message.invalid_tool_calls
    for call in message.tool_calls:
        Address.model_validate(call["args"])


def json_schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": model.__name__, "schema": model.model_json_schema()}}


def test_a_named_tool_choice_is_one_call(lc_chat: ChatGPUPrompt) -> None:
    chat = ChatGPUPrompt(backend=lc_chat.backend, max_tokens=96)
    message = chat.bind_tools([order_status, refund], tool_choice="order_status").invoke("Where is order 42?")
    assert [c["name"] for c in message.tool_calls] == ["order_status"]
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.usage_metadata["output_tokens"] < 40  # the reply ended after its one call


def test_stop_strings_and_cut_replies_never_show_wrapper_json(lc_chat: ChatGPUPrompt) -> None:
    chat = ChatGPUPrompt(backend=lc_chat.backend, max_tokens=14)
    for message in (chat.bind_tools([order_status]).invoke("Where is order 42?", stop=["name"]),
                    chat.bind_tools([order_status], max_tokens=10).invoke("Where is order 42?")):
        assert "{" not in message.content and "__answer__" not in message.content
        # A call the limit cut comes back invalid (partial arguments), and only then.
        if message.invalid_tool_calls:
            assert message.response_metadata["finish_reason"] == "length"
            assert [c["name"] for c in message.invalid_tool_calls] == ["order_status"]


@tool
def get_price(product: str) -> str:
    """Price of a product in EUR."""
    return "49.90"


@tool
def get_stock(product: str) -> str:
    """Units of a product in stock."""
    return "3"


LONG_ASK = ("What does the long-sleeved organic cotton midi dress with the ruby red floral print and "
            "mother-of-pearl buttons, size 38, cost?")


def test_a_call_cut_by_max_tokens_is_an_invalid_tool_call(chat: ChatGPUPrompt) -> None:
    """A forced call cut by max_tokens: in ``invalid_tool_calls`` with its partial arguments, as
    langchain-openai files unparsable arguments (it used to vanish); streamed as tool_call_chunks."""
    forced = chat.bind_tools([get_price, get_stock], tool_choice="get_price", max_tokens=24)
    message = forced.invoke(LONG_ASK)
    assert message.tool_calls == [] and message.content == ""
    assert message.response_metadata["finish_reason"] == "length"
    [invalid] = message.invalid_tool_calls
    assert invalid["type"] == "invalid_tool_call" and invalid["name"] == "get_price"
    assert invalid["id"].startswith("call_") and "cut short by max_tokens" in invalid["error"]
    assert re.match(r'\{\s*"product"\s*:\s*"[^"]+$', invalid["args"]), invalid["args"]
    chunks = list(forced.stream(LONG_ASK))
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert [(c["name"], c["args"]) for c in full.tool_call_chunks] == [("get_price", invalid["args"])]
    assert full.response_metadata["finish_reason"] == "length"
