"""The clients low-code builders and agents use, unchanged, against the live server:
langchain-openai (``ChatOpenAI`` with ``bind_tools`` and a tool loop, ``OpenAIEmbeddings`` with its
tiktoken default and with ``check_embedding_ctx_length=False``) and LlamaIndex ``OpenAILike``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import numpy as np
import openai
import pytest
from pydantic import BaseModel

from gpuprompt import GenerationRequest

CHAT = "SmolLM2-135M-Instruct"
EMBED = "sentence-transformers/all-MiniLM-L6-v2"
QUESTION = "What does the red dress cost?"
TEXTS = ["a red cotton dress", "blue denim jeans, slim fit", "Will it shrink after washing? 🧺"]


class PriceArgs(BaseModel):
    """The arguments of get_price (an enum, so the small model cannot ramble)."""

    product: Literal["red dress", "blue jeans"]


def _bundled_tiktoken_cache() -> str:
    # llama-index-core ships tiktoken's cl100k_base file; offline, it stands in for the download
    # that tiktoken makes on a machine with network access.
    spec = importlib.util.find_spec("llama_index.core")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(spec.submodule_search_locations[0]) / "_static" / "tiktoken_cache"
    assert folder.is_dir()
    return str(folder)


def _get_price_tool():
    from langchain_core.tools import tool

    @tool
    def get_price(product: Literal["red dress", "blue jeans"]) -> str:
        """Price of a product in EUR."""
        return "49 EUR"

    return get_price


@pytest.fixture(scope="module")
def chat_openai(live):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=CHAT, base_url=f"{live.url}/v1", api_key="unused", temperature=0, max_tokens=64,
                      max_retries=0, timeout=120)


# ---------------------------------------------------------------------- langchain-openai: chat
def test_chat_openai_invoke_equals_the_engine(chat_openai, server_llm) -> None:
    [direct] = server_llm.generate(
        [GenerationRequest(messages=[{"role": "user", "content": QUESTION}], max_tokens=64, temperature=0.0)]
    )
    message = chat_openai.invoke(QUESTION)
    assert message.content == direct.text
    assert message.usage_metadata["input_tokens"] == direct.usage.prompt_tokens
    assert message.usage_metadata["input_token_details"].get("cache_read", 0) == 0 or server_llm.capabilities.get(
        "prefix_cache"
    )


def test_bind_tools_with_a_forced_choice_returns_tool_calls(chat_openai) -> None:
    get_price = _get_price_tool()
    for choice in ("get_price", "any"):
        bound = chat_openai.bind_tools([get_price], tool_choice=choice, parallel_tool_calls=False)
        message = bound.invoke(QUESTION)
        [call] = message.tool_calls
        assert call["name"] == "get_price"
        assert call["args"]["product"] in ("red dress", "blue jeans")
        assert call["id"].startswith("call_")
        assert message.response_metadata["finish_reason"] == "tool_calls"


def test_bind_tools_streams_tool_call_chunks(chat_openai) -> None:
    get_price = _get_price_tool()
    bound = chat_openai.bind_tools([get_price], tool_choice="get_price", strict=True, parallel_tool_calls=False)
    whole = bound.invoke(QUESTION)
    chunks = list(bound.stream(QUESTION))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert [c["name"] for c in merged.tool_calls] == ["get_price"]
    assert merged.tool_calls[0]["args"] == whole.tool_calls[0]["args"]


def test_a_small_tool_loop_runs_to_an_answer(chat_openai) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    get_price = _get_price_tool()
    messages = [HumanMessage(QUESTION)]
    ai = chat_openai.bind_tools([get_price], tool_choice="get_price", parallel_tool_calls=False).invoke(messages)
    assert len(ai.tool_calls) == 1
    messages.append(ai)
    for call in ai.tool_calls:
        result = get_price.invoke(call)
        assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"]
        messages.append(result)
    final = chat_openai.bind_tools([get_price], tool_choice="none").invoke(messages)
    assert isinstance(final, AIMessage)
    assert not final.tool_calls
    assert isinstance(final.content, str) and final.content


# ---------------------------------------------------------------------- langchain-openai: embeddings
def test_openai_embeddings_defaults_get_the_documented_400(live, monkeypatch) -> None:
    from langchain_openai import OpenAIEmbeddings

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", _bundled_tiktoken_cache())  # the client tokenizes with tiktoken

    embeddings = OpenAIEmbeddings(model=EMBED, base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
    assert embeddings.check_embedding_ctx_length and embeddings.tiktoken_enabled  # the defaults: token ids
    with pytest.raises(openai.BadRequestError) as info:
        embeddings.embed_documents(TEXTS)
    assert info.value.param.startswith("input")
    assert "check_embedding_ctx_length=False" in info.value.message and "TikToken Enable" in info.value.message
    assert "--accept-token-ids" in info.value.message


@pytest.fixture(scope="module")
def accepting(embedder, server_llm):
    """A server started with --accept-token-ids (the vocabulary: llama-index-core's copy, offline)."""
    from server_helpers import start_server

    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = _bundled_tiktoken_cache()
    server = start_server(embedder=embedder, llm=server_llm, accept_token_ids=True)
    try:
        yield server
    finally:
        server.stop()
        if before is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = before


def test_with_accept_token_ids_the_defaults_are_read_back(accepting, embedder) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model=EMBED, base_url=f"{accepting.url}/v1", api_key="unused", max_retries=0)
    got = np.array(embeddings.embed_documents(TEXTS), dtype=np.float32)
    np.testing.assert_allclose(got, embedder.embed(TEXTS), atol=1e-5)
    np.testing.assert_allclose(embeddings.embed_query(TEXTS[0]), embedder.embed(TEXTS[:1])[0], atol=1e-5)


def test_with_accept_token_ids_ids_that_are_not_a_text_get_the_documented_400(accepting) -> None:
    from langchain_openai import OpenAIEmbeddings

    # One token per chunk cuts the parrot's four UTF-8 bytes apart: no chunk is a text by itself.
    embeddings = OpenAIEmbeddings(model=EMBED, base_url=f"{accepting.url}/v1", api_key="unused", max_retries=0,
                                  embedding_ctx_length=1)
    with pytest.raises(openai.BadRequestError) as info:
        embeddings.embed_documents(["🦜"])
    assert info.value.param.startswith("input")
    assert "check_embedding_ctx_length=False" in info.value.message
    assert "TikToken Enable" in info.value.message


def test_token_id_inputs_are_capped_before_any_decoding(accepting) -> None:
    with accepting.client() as http:
        error = http.post("/v1/embeddings", json={"input": [[15339] * 8192]}).json()["error"]
    assert error["param"] == "input" and "8191" in error["message"]


def test_openai_embeddings_without_ctx_check_send_text(live, embedder) -> None:
    from langchain_openai import OpenAIEmbeddings

    for encoding_format in (None, "float"):
        embeddings = OpenAIEmbeddings(model=EMBED, base_url=f"{live.url}/v1", api_key="unused", max_retries=0,
                                      check_embedding_ctx_length=False,
                                      model_kwargs={"encoding_format": encoding_format} if encoding_format else {})
        got = np.array(embeddings.embed_documents(TEXTS), dtype=np.float32)
        np.testing.assert_allclose(got, embedder.embed(TEXTS), atol=1e-5)


def test_without_the_vocabulary_token_ids_get_the_documented_400(tmp_path) -> None:
    # A server that cannot load cl100k_base (offline, no cache): the 400 names the setting to change.
    code = (
        "from gpuprompt.server._token_ids import decode_token_ids\n"
        "from gpuprompt.server.errors import ApiError\n"
        "try:\n"
        "    decode_token_ids([[15339, 1917]], accept=True)\n"
        "except ApiError as exc:\n"
        "    print(exc.status, exc.param, exc.message)\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path), "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.startswith("400 input ")
    assert "check_embedding_ctx_length=False" in out and "TIKTOKEN_CACHE_DIR" in out


# ---------------------------------------------------------------------- LlamaIndex OpenAILike
def _openai_like(live, **options):
    from llama_index.llms.openai_like import OpenAILike

    options = {"max_tokens": 12, **options}
    return OpenAILike(model=CHAT, api_base=f"{live.url}/v1", api_key="unused", context_window=2048,
                      temperature=0.0, max_retries=0, timeout=120, **options)


def test_openai_like_complete_uses_text_completions(live, server_llm) -> None:
    prompt = "The three primary colours are"
    [direct] = server_llm.generate([GenerationRequest(prompt=prompt, max_tokens=12, temperature=0.0)])
    llm = _openai_like(live, is_chat_model=False)
    assert llm.complete(prompt).text == direct.text
    assert "".join(r.delta or "" for r in llm.stream_complete(prompt)) == direct.text


def test_openai_like_chat_and_stream_chat(live, server_llm) -> None:
    from llama_index.core.llms import ChatMessage

    [direct] = server_llm.generate(
        [GenerationRequest(messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0.0)]
    )
    llm = _openai_like(live, is_chat_model=True)
    assert llm.chat([ChatMessage(role="user", content=QUESTION)]).message.content == direct.text
    assert llm.complete(QUESTION).text == direct.text  # a chat model completes through chat
    streamed = "".join(r.delta or "" for r in llm.stream_chat([ChatMessage(role="user", content=QUESTION)]))
    assert streamed == direct.text


def test_openai_like_function_calling_with_a_required_tool(live) -> None:
    from llama_index.core.tools import FunctionTool

    def get_price(product: str) -> str:
        """Price of a product in EUR."""
        return "49 EUR"

    llm = _openai_like(live, is_chat_model=True, is_function_calling_model=True, max_tokens=64)
    tool = FunctionTool.from_defaults(fn=get_price, fn_schema=PriceArgs)
    response = llm.chat_with_tools([tool], user_msg=QUESTION, tool_required=True, allow_parallel_tool_calls=False)
    [selection] = llm.get_tool_calls_from_response(response)
    assert selection.tool_name == "get_price"
    assert selection.tool_kwargs["product"] in ("red dress", "blue jeans")
