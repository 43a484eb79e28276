"""GPUPromptLLM: metadata, chat/complete/stream in sync and async, instrumentation, errors,
cancellation, and structured output (structured_predict, streaming, as_structured_llm, the
function-calling program) through the engine's guided decoding on both backends.

Tool calling and agents: test_li_agent.py."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import PydanticProgramMode
from pydantic import BaseModel

from gpuprompt.errors import ConfigurationError, ContextLengthError, InputTypeError, InvalidInputError
from llamaindex_gpuprompt import GPUPromptLLM

USER = [ChatMessage(role=MessageRole.USER, content="Name one colour of the rainbow.")]


def test_metadata_comes_from_the_engine(li_llm) -> None:
    meta = li_llm.metadata
    assert meta.is_chat_model is True
    assert meta.is_function_calling_model is True
    # the room a LlamaIndex prompt has: the window less the chat template around it
    template = li_llm.engine.count_tokens([{"role": "user", "content": ""}])
    assert 0 < template < 64
    assert meta.context_window == li_llm.engine.context_window - template == 2048 - template
    assert meta.num_output == 12
    assert meta.model_name == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_tokenize_makes_llamaindex_packing_fit_the_window(li_llm) -> None:
    """LlamaIndex packs chunks into the window counting with Settings.tokenizer (tiktoken by
    default), which undercounts this model's tokens: a summarising prompt overflows. Counted with
    ``llm.tokenize`` (``Settings.tokenizer = llm.tokenize``), every packed prompt fits."""
    import random

    from llama_index.core import PromptHelper
    from llama_index.core.prompts.default_prompts import DEFAULT_TREE_SUMMARIZE_PROMPT
    from llama_index.core.utils import get_tokenizer

    words = ("the customer returned a jacket because the zipper broke after two weeks; our policy allows refunds "
             "within thirty days when the receipt is shown, and exchanges for store credit afterwards, except for "
             "sale items marked final. Shipping to Norway costs 12.50 EUR and takes 4-6 business days.").split()
    rng = random.Random(1)
    chunks = [" ".join(rng.choice(words) for _ in range(700)) for _ in range(4)]
    assert li_llm.tokenize("a red dress") == li_llm.engine.tokenize("a red dress")
    window = li_llm.engine.context_window  # what the engine accepts, prompt and reply

    def longest_prompt(tokenizer) -> int:
        helper = PromptHelper.from_llm_metadata(li_llm.metadata, tokenizer=tokenizer)
        template = DEFAULT_TREE_SUMMARIZE_PROMPT.partial_format(query_str="What is the refund policy?")
        packed = helper.repack(template, chunks, llm=li_llm)
        messages = [{"role": "user", "content": template.format(context_str=text)} for text in packed]
        return max(li_llm.engine.count_tokens([message]) for message in messages)

    assert longest_prompt(get_tokenizer()) > window - li_llm.max_tokens  # tiktoken's count: too long
    assert longest_prompt(li_llm.tokenize) <= window - li_llm.max_tokens


def test_chat_and_complete_report_text_and_usage(li_llm) -> None:
    response = li_llm.chat(USER)
    assert response.message.role == MessageRole.ASSISTANT
    assert response.message.content
    usage = response.raw["usage"]
    assert 0 < usage["completion_tokens"] <= 12
    assert usage["prompt_tokens"] == li_llm.engine.count_tokens([{"role": "user", "content": USER[0].content}])
    assert response.raw["finish_reason"] in ("stop", "length")
    completion = li_llm.complete("Name one colour of the rainbow.")
    # complete() of a chat model goes through the chat template: the same greedy answer.
    assert completion.text == response.message.content


def test_per_call_options_override_the_fields(li_llm) -> None:
    response = li_llm.chat(USER, max_tokens=3)
    assert response.raw["usage"]["completion_tokens"] <= 3
    with pytest.raises(InvalidInputError, match=r"unknown GPUPromptLLM call option\(s\) \['bogus'\]"):
        li_llm.chat(USER, bogus=1)
    # vLLM's end-of-reply fields are call options too: a reply of exactly max_tokens
    fixed = li_llm.complete("Say just the word yes.", max_tokens=12, ignore_eos=True)
    assert fixed.raw["usage"]["completion_tokens"] == 12 and fixed.raw["finish_reason"] == "length"
    assert li_llm.complete("Say just the word yes.", max_tokens=12, min_tokens=8).raw["usage"]["completion_tokens"] >= 8


def test_stream_chat_deltas_add_up_to_the_chat_reply(li_llm) -> None:
    chunks = list(li_llm.stream_chat(USER))
    assert "".join(c.delta for c in chunks) == chunks[-1].message.content == li_llm.chat(USER).message.content
    assert chunks[-1].raw["finish_reason"] in ("stop", "length")
    assert chunks[-1].additional_kwargs["completion_tokens"] > 0
    text_chunks = list(li_llm.stream_complete("Name one colour of the rainbow."))
    assert text_chunks[-1].text == chunks[-1].message.content


async def test_async_variants_match_sync(li_llm) -> None:
    # A few greedy tokens: the same request gives the same text on every path.
    expected = li_llm.chat(USER, max_tokens=4).message.content
    assert expected
    assert (await li_llm.achat(USER, max_tokens=4)).message.content == expected
    assert (await li_llm.acomplete("Name one colour of the rainbow.", max_tokens=4)).text == expected
    chunks = [c async for c in await li_llm.astream_chat(USER, max_tokens=4)]
    assert chunks[-1].message.content == "".join(c.delta for c in chunks) == expected
    texts = [c async for c in await li_llm.astream_complete("Name one colour of the rainbow.", max_tokens=4)]
    assert texts[-1].text == expected


async def test_concurrent_achat_calls_all_complete_and_do_not_block_the_loop(li_llm) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick_task = asyncio.create_task(ticker())
    prompts = [[ChatMessage(role="user", content=f"What is {i} plus {i}?")] for i in range(8)]
    responses = await asyncio.gather(*(li_llm.achat(p, max_tokens=6) for p in prompts))
    tick_task.cancel()
    assert all(r.raw["usage"]["completion_tokens"] > 0 for r in responses)
    assert len({r.raw["request_id"] for r in responses}) == 8
    assert ticks > 0  # the loop kept running while the engine generated


async def test_closing_an_async_stream_aborts_the_request(li_llm) -> None:
    before = li_llm.engine.stats()
    stream = await li_llm.astream_complete("Write a long story about a dragon.", max_tokens=200)
    first = await stream.__anext__()
    assert first.text
    await stream.aclose()
    for _ in range(200):
        stats = li_llm.engine.stats()
        if stats.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert stats.aborted == before.aborted + 1
    assert stats.completion_tokens - before.completion_tokens < 200


def test_instrumentation_events_are_emitted(li_llm) -> None:
    seen: list[str] = []

    class Recorder(BaseEventHandler):
        def handle(self, event, **kwargs) -> None:
            seen.append(event.class_name())

    dispatcher = get_dispatcher()
    recorder = Recorder()
    dispatcher.add_event_handler(recorder)
    try:
        li_llm.chat(USER, max_tokens=2)
        li_llm.complete("Hi", max_tokens=2)
    finally:
        dispatcher.event_handlers.remove(recorder)
    assert "LLMChatStartEvent" in seen and "LLMChatEndEvent" in seen
    assert "LLMCompletionStartEvent" in seen and "LLMCompletionEndEvent" in seen


def test_bad_input_raises_typed_errors(li_llm) -> None:
    with pytest.raises(InputTypeError, match="'messages' must be a list of ChatMessage"):
        li_llm.chat("hello")
    with pytest.raises(InputTypeError, match=r"'messages\[1\]' must be a ChatMessage"):
        li_llm.chat([USER[0], {"role": "user", "content": "x"}])
    image = ChatMessage(role="user", blocks=[TextBlock(text="what is this?"), ImageBlock(url="http://x/y.png")])
    with pytest.raises(InvalidInputError, match=r"must hold text only \(got \['ImageBlock'\]\)"):
        li_llm.chat([image])
    with pytest.raises(InputTypeError, match="'prompt' must be a str"):
        li_llm.complete(42)
    with pytest.raises(ContextLengthError):
        li_llm.complete("word " * 3000)
    with pytest.raises(ConfigurationError, match="'engine' must be a gpuprompt.LLMEngine"):
        GPUPromptLLM(engine="nope")


def test_truncate_left_keeps_a_too_long_chat_answerable(li_llm) -> None:
    history = []
    for i in range(60):
        history.append(ChatMessage(role="user", content=f"Tell me fact number {i} about hiking boots. " * 3))
        history.append(ChatMessage(role="assistant", content="Leather boots last longer with care. " * 3))
    history.append(ChatMessage(role="user", content="Summarise in one word."))
    with pytest.raises(ContextLengthError):
        li_llm.chat(history, max_tokens=2)
    response = li_llm.chat(history, max_tokens=2, truncate="left")
    assert response.raw["usage"]["prompt_tokens"] <= li_llm.metadata.context_window


class Product(BaseModel):
    name: str
    price: int


EXTRACT = PromptTemplate("Extract the product as JSON: {text}")


@pytest.fixture(params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def any_llm(request: pytest.FixtureRequest) -> GPUPromptLLM:
    """A GPUPromptLLM with room for a small JSON object, on the session's engine of each backend."""
    base = request.getfixturevalue("li_llm" if request.param == "transformers" else "li_vllm")
    return GPUPromptLLM(engine=base.engine, max_tokens=48)


def test_structured_predict_uses_guided_json(any_llm) -> None:
    seen: list[dict] = []

    class Recorder(BaseEventHandler):
        def handle(self, event, **kwargs) -> None:
            if event.class_name() == "LLMChatStartEvent":
                seen.append(event.additional_kwargs)

    dispatcher = get_dispatcher()
    recorder = Recorder()
    dispatcher.add_event_handler(recorder)
    try:
        product = any_llm.structured_predict(Product, EXTRACT, text="The Aurora dress costs 49 euros.")
    finally:
        dispatcher.event_handlers.remove(recorder)
    assert isinstance(product, Product)
    assert isinstance(product.price, int)
    # One chat call, constrained by the JSON schema (not LlamaIndex's prompt-and-parse program).
    assert [kwargs.get("response_format") for kwargs in seen] == [Product.model_json_schema()]


async def test_astructured_predict_uses_guided_json(any_llm) -> None:
    products = await asyncio.gather(
        *(any_llm.astructured_predict(Product, EXTRACT, text=f"Boots model {i} cost {100 + i} euros.") for i in range(3))
    )
    assert all(isinstance(p, Product) for p in products)


async def test_stream_structured_predict_yields_partials_then_the_object(any_llm) -> None:
    partials = list(any_llm.stream_structured_predict(Product, EXTRACT, text="The Aurora dress costs 49 euros."))
    assert len(partials) > 1
    assert isinstance(partials[-1], Product)
    assert partials[-1] == any_llm.structured_predict(Product, EXTRACT, text="The Aurora dress costs 49 euros.")
    stream = await any_llm.astream_structured_predict(Product, EXTRACT, text="The Aurora dress costs 49 euros.")
    apartials = [p async for p in stream]
    assert apartials[-1] == partials[-1]


def test_as_structured_llm_answers_with_the_object_as_json(any_llm) -> None:
    structured = any_llm.as_structured_llm(Product)
    response = structured.chat([ChatMessage(role="user", content="The Aurora dress costs 49 euros. As JSON.")])
    assert isinstance(response.raw, Product)
    assert Product.model_validate_json(response.message.content) == response.raw
    streamed = list(structured.stream_chat([ChatMessage(role="user", content="The Aurora dress costs 49 euros.")]))
    assert isinstance(streamed[-1].raw, Product)


async def test_function_program_mode_uses_a_forced_tool_call(any_llm) -> None:
    """pydantic_program_mode=FUNCTION: LlamaIndex's FunctionCallingProgram forces a call of a tool
    whose schema is the class; the core's guided decoding makes the arguments schema-valid."""
    llm = GPUPromptLLM(engine=any_llm.engine, max_tokens=48, pydantic_program_mode=PydanticProgramMode.FUNCTION)
    product = llm.structured_predict(Product, EXTRACT, text="The Aurora dress costs 49 euros.")
    assert isinstance(product, Product)
    products = await asyncio.gather(
        *(llm.astructured_predict(Product, EXTRACT, text=f"Boots model {i} cost {100 + i} euros.") for i in range(2))
    )
    assert all(isinstance(p, Product) for p in products)


def test_structured_predict_cut_off_is_a_typed_error(li_llm) -> None:
    short = GPUPromptLLM(engine=li_llm.engine, max_tokens=3)
    with pytest.raises(InvalidInputError, match="does not validate as Product"):
        short.structured_predict(Product, EXTRACT, text="The Aurora dress costs 49 euros.")


@pytest.mark.vllm
def test_vllm_backend_chats_and_streams(li_vllm) -> None:
    reply = li_vllm.chat(USER, max_tokens=8)
    streamed = list(li_vllm.stream_chat(USER, max_tokens=8))
    assert reply.message.content == streamed[-1].message.content
