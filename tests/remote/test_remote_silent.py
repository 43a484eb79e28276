"""Against a server that accepts the connection and never answers, every remote class raises
``RequestTimeoutError`` within its configured ``timeout`` (+1 s): the model-list probe included,
and ``GPUPROMPT_TIMEOUT`` reaches the classes that are given no ``timeout``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuprompt.errors import RequestTimeoutError

TIMEOUT = 1.0


def _langchain() -> list[tuple[str, Callable[[str, float | None], Any]]]:
    from langchain_core.documents import Document
    from langchain_core.outputs import Generation

    from langchain_gpuprompt import (
        ChatGPUPrompt,
        GPUPromptChatMessageHistory,
        GPUPromptEmbeddings,
        GPUPromptReranker,
        GPUPromptSemanticCache,
        GPUPromptStore,
        GPUPromptVectorStore,
    )

    return [
        ("GPUPromptEmbeddings.embed_query", lambda url, t: GPUPromptEmbeddings(base_url=url, timeout=t).embed_query("hi")),
        ("ChatGPUPrompt.invoke", lambda url, t: ChatGPUPrompt(base_url=url, timeout=t, max_retries=0).invoke("hi")),
        ("GPUPromptChatMessageHistory.messages",
         lambda url, t: GPUPromptChatMessageHistory("s", base_url=url, timeout=t).messages),
        ("GPUPromptSemanticCache.lookup", lambda url, t: GPUPromptSemanticCache(base_url=url, timeout=t).lookup("p", "m")),
        ("GPUPromptSemanticCache.update",
         lambda url, t: GPUPromptSemanticCache(base_url=url, timeout=t).update("p", "m", [Generation(text="x")])),
        ("GPUPromptVectorStore.similarity_search",
         lambda url, t: GPUPromptVectorStore(GPUPromptEmbeddings(base_url=url, timeout=t), base_url=url, collection="kb",
                                             timeout=t).similarity_search("hi")),
        ("GPUPromptVectorStore.add_documents",
         lambda url, t: GPUPromptVectorStore(GPUPromptEmbeddings(base_url=url, timeout=t), base_url=url, collection="kb",
                                             timeout=t).add_documents([Document(page_content="x")])),
        ("GPUPromptStore.get", lambda url, t: GPUPromptStore(base_url=url, timeout=t).get(("users",), "k")),
        ("GPUPromptReranker.compress_documents",
         lambda url, t: GPUPromptReranker(base_url=url, timeout=t).compress_documents([Document(page_content="x")], "q")),
    ]


def _llamaindex() -> list[tuple[str, Callable[[str, float | None], Any]]]:
    from llama_index.core.llms import ChatMessage
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from llamaindex_gpuprompt import (
        GPUPromptContextMemoryBlock,
        GPUPromptEmbedding,
        GPUPromptLLM,
        GPUPromptRerank,
        GPUPromptVectorStore,
    )

    return [
        ("GPUPromptEmbedding.get_query_embedding",
         lambda url, t: GPUPromptEmbedding(base_url=url, timeout=t).get_query_embedding("hi")),
        ("GPUPromptLLM.complete", lambda url, t: GPUPromptLLM(base_url=url, timeout=t).complete("hi")),
        ("GPUPromptContextMemoryBlock.aput",
         lambda url, t: asyncio.run(GPUPromptContextMemoryBlock(base_url=url, timeout=t).aput(
             [ChatMessage(role="user", content="hi")]))),
        ("GPUPromptVectorStore.query",
         lambda url, t: GPUPromptVectorStore(base_url=url, collection="kb", timeout=t).query(
             VectorStoreQuery(query_embedding=[0.1] * 384, similarity_top_k=2))),
        ("GPUPromptRerank.postprocess_nodes",
         lambda url, t: GPUPromptRerank(base_url=url, timeout=t).postprocess_nodes(
             [NodeWithScore(node=TextNode(text="x"), score=0.0)], query_bundle=QueryBundle("q"))),
    ]


CASES = [pytest.param(name, call, id=name) for name, call in _langchain() + _llamaindex()]


@pytest.mark.parametrize(("name", "call"), CASES)
def test_every_remote_class_times_out_on_a_silent_server(silent_url: str, name: str, call) -> None:
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError):
        call(silent_url, TIMEOUT)
    waited = time.monotonic() - started
    assert waited <= TIMEOUT + 1.0, f"{name} waited {waited:.1f} s for a {TIMEOUT} s timeout"


@pytest.mark.parametrize(("name", "call"), CASES[:3] + CASES[-5:-3])
def test_gpuprompt_timeout_reaches_the_classes_given_none(silent_url: str, name: str, call, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROMPT_TIMEOUT", str(TIMEOUT))
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError):
        call(silent_url, None)
    assert time.monotonic() - started <= TIMEOUT + 1.0


async def test_the_async_paths_time_out_too(silent_url: str) -> None:
    from langchain_gpuprompt import ChatGPUPrompt, GPUPromptEmbeddings

    from gpuprompt import connect

    started = time.monotonic()
    for make in (lambda: GPUPromptEmbeddings(base_url=silent_url, timeout=TIMEOUT).aembed_query("hi"),
                 lambda: ChatGPUPrompt(base_url=silent_url, timeout=TIMEOUT, max_retries=0).ainvoke("hi"),
                 lambda: connect(silent_url, timeout=TIMEOUT).index(collection="kb").asearch_text(["hi"], 2)):
        began = time.monotonic()
        with pytest.raises(RequestTimeoutError):
            await asyncio.wait_for(make(), 30)
        assert time.monotonic() - began <= TIMEOUT + 1.0
    assert time.monotonic() - started <= 3 * (TIMEOUT + 1.0)
