"""The four adapter classes in remote mode against a live ``gpuprompt serve``: the same answers as in
process, every feature (streaming, async, batch, tools, structured output), env configuration,
refused in-process options, and THE worker test: remote classes import no torch and load no model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Literal

import numpy as np
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field

from gpuprompt.errors import ConfigurationError, QueueFullError
from gpuprompt.llm import GenerationRequest
from gpuprompt.remote import RemoteEmbedder, RemoteLLM
from langchain_gpuprompt import ChatGPUPrompt, GPUPromptEmbeddings
from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptLLM

LONG = GenerationRequest(messages=[{"role": "user", "content": "Write a long story."}], max_tokens=400)
DOCS = ["Returns are free within 30 days.", "Shipping takes 2-4 days.", "We sell dresses and coats."]


@tool
def get_order_status(order_id: int) -> str:
    """Look up the delivery status of an order by its number."""
    return f"order {order_id} ships tomorrow"


class WeatherArgs(BaseModel):
    """Which city."""

    city: Literal["Paris", "Rome", "Oslo"]


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


class Product(BaseModel):
    """A product and its price."""

    name: str = Field(description="the product")
    price: float = Field(description="the price in euros")


# ---------------------------------------------------------------------- LangChain
def test_lc_embeddings_equal_in_process(live) -> None:
    remote = GPUPromptEmbeddings(base_url=live.url, query_instruction="query: ")
    local = GPUPromptEmbeddings(query_instruction="query: ")
    assert isinstance(remote.embedder, RemoteEmbedder)
    np.testing.assert_allclose(remote.embed_documents(DOCS), local.embed_documents(DOCS), atol=1e-5)
    np.testing.assert_allclose(remote.embed_query("free returns?"), local.embed_query("free returns?"), atol=1e-5)
    assert "base_url" in repr(remote)


async def test_lc_embeddings_async(live) -> None:
    remote = GPUPromptEmbeddings(base_url=live.url)
    local = GPUPromptEmbeddings()
    np.testing.assert_allclose(await remote.aembed_documents(DOCS), local.embed_documents(DOCS), atol=1e-5)
    np.testing.assert_allclose(await remote.aembed_query("coats"), local.embed_query("coats"), atol=1e-5)


def test_lc_chat_equals_in_process(live) -> None:
    remote = ChatGPUPrompt(base_url=live.url, max_tokens=12)
    local = ChatGPUPrompt(backend="transformers", max_tokens=12)
    messages = [SystemMessage("You are a shop assistant."), HumanMessage("Hello!")]
    got, want = remote.invoke(messages), local.invoke(messages)
    assert got.content == want.content
    # each engine's prefix-cache hits depend on what it ran before: compared without them
    assert {**got.usage_metadata, "input_token_details": {}} == {**want.usage_metadata, "input_token_details": {}}
    assert got.response_metadata == want.response_metadata
    assert remote.get_num_tokens_from_messages(messages) == local.get_num_tokens_from_messages(messages)
    assert isinstance(remote.engine, RemoteLLM)


def test_lc_stream_and_batch(live) -> None:
    remote = ChatGPUPrompt(base_url=live.url, max_tokens=12)
    chunks = list(remote.stream("Name three colours."))
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata is not None
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert full.content == remote.invoke("Name three colours.").content
    replies = remote.batch(["Hi!", "Name a fruit."])
    assert [r.content for r in replies] == [remote.invoke("Hi!").content, remote.invoke("Name a fruit.").content]


async def test_lc_async_invoke_stream_and_batch(live) -> None:
    remote = ChatGPUPrompt(base_url=live.url, max_tokens=10)
    want = (await remote.ainvoke("Name a colour.")).content
    text = ""
    async for chunk in remote.astream("Name a colour."):
        text += chunk.content
    assert text == want
    assert [m.content for m in await remote.abatch(["Name a colour."] * 3)] == [want] * 3


def test_lc_tools_forced_and_a_tool_loop(live) -> None:
    llm = ChatGPUPrompt(base_url=live.url, max_tokens=48).bind_tools([get_order_status], tool_choice="any",
                                                                      parallel_tool_calls=False)
    question = HumanMessage("Where is my order 42?")
    reply = llm.invoke([question])
    [call] = reply.tool_calls
    assert call["name"] == "get_order_status" and isinstance(call["args"]["order_id"], int)
    streamed = None
    for chunk in llm.stream([question]):
        streamed = chunk if streamed is None else streamed + chunk
    assert [c["name"] for c in streamed.tool_calls] == ["get_order_status"]
    answer = ChatGPUPrompt(base_url=live.url, max_tokens=16).bind_tools([get_order_status]).invoke(
        [question, AIMessage("", tool_calls=[call]), ToolMessage(get_order_status.invoke(call["args"]),
                                                                  tool_call_id=call["id"])])
    assert isinstance(answer, AIMessage)


def test_lc_structured_output(live) -> None:
    remote = ChatGPUPrompt(base_url=live.url, max_tokens=48)
    product = remote.with_structured_output(Product).invoke("A red dress that costs 40 euros.")
    assert isinstance(product, Product)
    called = remote.with_structured_output(Product, method="function_calling").invoke("A coat for 90 euros.")
    assert isinstance(called, Product)
    raw = remote.with_structured_output(Product, include_raw=True).invoke("Jeans for 30 euros.")
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Product)


def test_lc_errors_are_typed(busy) -> None:
    llm = RemoteLLM(busy.url).load()
    first = llm.stream(LONG)
    next(first)
    try:
        with pytest.raises(QueueFullError) as full:
            ChatGPUPrompt(base_url=busy.url, max_retries=0, max_tokens=4).invoke("Hi")
        assert full.value.retry_after == 2.0
    finally:
        first.close()


def test_lc_remote_configuration(live, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROMPT_URL", live.url)
    monkeypatch.setenv("GPUPROMPT_API_KEY", "from-env")
    chat = ChatGPUPrompt(max_tokens=4)
    assert chat.base_url == live.url and chat.api_key.get_secret_value() == "from-env"
    assert chat._engine_cache is None  # construction connects to nothing
    assert isinstance(GPUPromptEmbeddings().embedder, RemoteEmbedder)
    with pytest.raises(ConfigurationError, match=r"\['backend', 'device'\].*GPUPROMPT_URL"):
        ChatGPUPrompt(backend="transformers", device="cpu")
    monkeypatch.delenv("GPUPROMPT_URL")
    assert ChatGPUPrompt(max_tokens=4).base_url is None  # in process again (the key alone means nothing)
    for bad in ({"device": "cpu"}, {"quantize": "int8"}, {"max_queue": 5}, {"normalize": False},
                {"model_kwargs": {"device": "cpu"}}, {"encode_kwargs": {"batch_size": 8}}):
        with pytest.raises(ConfigurationError, match="in-process option"):
            GPUPromptEmbeddings(base_url=live.url, **bad)
    for bad in ({"backend": "vllm"}, {"engine_kwargs": {"dtype": "float32"}}):
        with pytest.raises(ConfigurationError, match="in-process option"):
            ChatGPUPrompt(base_url=live.url, **bad)
    with pytest.raises(ConfigurationError, match="api_key"):
        ChatGPUPrompt(api_key="k")
    with pytest.raises(ConfigurationError, match="base_url"):
        GPUPromptEmbeddings(base_url="localhost:8000")


# ---------------------------------------------------------------------- LlamaIndex
def test_li_embedding_equals_in_process(live) -> None:
    remote = GPUPromptEmbedding(base_url=live.url)
    local = GPUPromptEmbedding()
    np.testing.assert_allclose(remote.get_text_embedding_batch(DOCS), local.get_text_embedding_batch(DOCS), atol=1e-5)
    np.testing.assert_allclose(remote.get_query_embedding("coats"), local.get_query_embedding("coats"), atol=1e-5)
    assert "base_url" in repr(remote) and isinstance(remote.embedder, RemoteEmbedder)


async def test_li_embedding_async(live) -> None:
    remote = GPUPromptEmbedding(base_url=live.url)
    local = GPUPromptEmbedding()
    np.testing.assert_allclose(await remote.aget_text_embedding_batch(DOCS), local.get_text_embedding_batch(DOCS),
                               atol=1e-5)
    np.testing.assert_allclose(await remote.aget_query_embedding("x"), local.get_query_embedding("x"), atol=1e-5)


def test_li_llm_equals_in_process(live) -> None:
    remote = GPUPromptLLM(base_url=live.url, max_tokens=12)
    local = GPUPromptLLM(backend="transformers", max_tokens=12)
    messages = [ChatMessage(role="user", content="Name a colour.")]
    local.chat(messages)  # one engine serves both: its prefix cache now holds the prompt for either call
    got, want = remote.chat(messages), local.chat(messages)
    assert got.message.content == want.message.content
    assert got.additional_kwargs == want.additional_kwargs  # the usage too, cached prompt tokens included
    assert remote.complete("Say hi.").text == local.complete("Say hi.").text
    assert remote.metadata.model_name == local.metadata.model_name
    assert remote.metadata.context_window == local.metadata.context_window  # the served window, less the template
    assert remote.tokenize("a red dress, 49 EUR") == local.tokenize("a red dress, 49 EUR")  # POST /tokenize
    assert remote.metadata.is_function_calling_model
    last = None
    for last in remote.stream_chat(messages):
        pass
    assert last is not None and last.message.content == want.message.content


async def test_li_llm_async(live) -> None:
    remote = GPUPromptLLM(base_url=live.url, max_tokens=10)
    messages = [ChatMessage(role="user", content="Name a fruit.")]
    want = (await remote.achat(messages)).message.content
    last = None
    async for last in await remote.astream_chat(messages):
        pass
    assert last.message.content == want
    assert (await remote.acomplete("Name a fruit.")).text
    stream = await remote.astream_complete("Write a long story.", max_tokens=300)
    first = await stream.__anext__()
    await stream.aclose()  # closing early aborts on the server
    assert first.delta is not None


def test_li_tools_and_structured_predict(live) -> None:
    from llama_index.core.prompts import PromptTemplate

    tools = [FunctionTool.from_defaults(get_weather, fn_schema=WeatherArgs)]
    remote = GPUPromptLLM(base_url=live.url, max_tokens=48)
    local = GPUPromptLLM(backend="transformers", max_tokens=48)
    response = remote.chat_with_tools(tools, "What is the weather in Paris?", tool_required=True)
    [selection] = remote.get_tool_calls_from_response(response)
    assert selection.tool_name == "get_weather" and selection.tool_kwargs["city"] in ("Paris", "Rome", "Oslo")
    want = local.get_tool_calls_from_response(local.chat_with_tools(tools, "What is the weather in Paris?",
                                                                    tool_required=True))
    assert [(s.tool_name, s.tool_kwargs) for s in want] == [(selection.tool_name, selection.tool_kwargs)]
    product = remote.structured_predict(Product, PromptTemplate("Describe: {text}"), text="A coat for 90 euros.")
    assert isinstance(product, Product)


def test_li_remote_configuration(live, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROMPT_URL", live.url)
    assert GPUPromptLLM().base_url == live.url
    assert isinstance(GPUPromptEmbedding().embedder, RemoteEmbedder)
    monkeypatch.delenv("GPUPROMPT_URL")
    for bad in ({"device": "cpu"}, {"quantize": "int8"}, {"embedder_options": {"cache_size": 0}}, {"normalize": False}):
        with pytest.raises(ConfigurationError, match="in-process option"):
            GPUPromptEmbedding(base_url=live.url, **bad)
    for bad in ({"backend": "transformers"}, {"engine_options": {"dtype": "float32"}}):
        with pytest.raises(ConfigurationError, match="in-process option"):
            GPUPromptLLM(base_url=live.url, **bad)
    assert "api_key" not in GPUPromptLLM(base_url=live.url, api_key="k").to_dict()


# ---------------------------------------------------------------------- the worker process
def test_a_remote_worker_imports_no_torch_and_loads_no_model(live) -> None:
    code = textwrap.dedent(
        """
        import asyncio, json, sys
        from langchain_gpuprompt import ChatGPUPrompt, GPUPromptEmbeddings
        from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptLLM
        from llama_index.core.base.llms.types import ChatMessage

        out = {}
        out["lc_embed"] = len(GPUPromptEmbeddings().embed_query("red dress"))
        chat = ChatGPUPrompt(max_tokens=6)
        out["lc_chat"] = chat.invoke("Hi!").content
        out["lc_stream"] = "".join(c.content for c in chat.stream("Hi!"))
        out["lc_async"] = asyncio.run(chat.ainvoke("Hi!")).content
        out["li_embed"] = len(GPUPromptEmbedding().get_text_embedding("red dress"))
        out["li_chat"] = GPUPromptLLM(max_tokens=6).chat([ChatMessage(role="user", content="Hi!")]).message.content
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
    assert out["lc_embed"] == out["li_embed"] == 384
    assert out["lc_chat"] and out["lc_chat"] == out["lc_stream"] == out["lc_async"]
    assert out["li_chat"]
