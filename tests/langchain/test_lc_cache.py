"""GPUPromptSemanticCache: the langchain-tests cache suites, semantic hits, isolation and errors."""

from __future__ import annotations

import time

import pytest
from langchain_core.caches import BaseCache
from langchain_core.outputs import Generation
from langchain_tests.integration_tests import AsyncCacheTestSuite, SyncCacheTestSuite

from gpuprompt.errors import ConfigurationError, InputTypeError
from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptSemanticCache


class TestGPUPromptSemanticCacheSync(SyncCacheTestSuite):
    @pytest.fixture()
    def cache(self, lc_embeddings: GPUPromptEmbeddings) -> BaseCache:
        return GPUPromptSemanticCache(lc_embeddings)


class TestGPUPromptSemanticCacheAsync(AsyncCacheTestSuite):
    @pytest.fixture()
    async def cache(self, lc_embeddings: GPUPromptEmbeddings) -> BaseCache:
        return GPUPromptSemanticCache(lc_embeddings)


LLM = "model=smollm2 temperature=0"
ANSWER = [Generation(text="You can return items within 30 days.")]


def test_similar_prompt_hits_and_unrelated_misses(lc_embeddings: GPUPromptEmbeddings) -> None:
    cache = GPUPromptSemanticCache(lc_embeddings, score_threshold=0.85)
    cache.update("What is your return policy?", LLM, ANSWER)
    assert cache.lookup("What's your return policy?", LLM) == ANSWER
    assert cache.lookup("Do you ship to Norway?", LLM) is None


def test_entries_never_cross_llm_strings(lc_embeddings: GPUPromptEmbeddings) -> None:
    cache = GPUPromptSemanticCache(lc_embeddings, score_threshold=0.5)
    cache.update("What is your return policy?", LLM, ANSWER)
    assert cache.lookup("What is your return policy?", "another model") is None
    other = [Generation(text="30 days, free of charge.")]
    cache.update("What is your return policy?", "another model", other)
    assert cache.lookup("What is your return policy?", "another model") == other
    assert cache.lookup("What is your return policy?", LLM) == ANSWER


def test_exact_repeats_always_hit(lc_embeddings: GPUPromptEmbeddings) -> None:
    cache = GPUPromptSemanticCache(lc_embeddings, score_threshold=1.0)
    cache.update("Where is my order 42?", LLM, ANSWER)
    assert cache.lookup("Where is my order 42?", LLM) == ANSWER
    assert cache.lookup("Where is my order 43?", LLM) is None
    cache.update("Where is my order 42?", LLM, [Generation(text="updated")])
    assert cache.lookup("Where is my order 42?", LLM) == [Generation(text="updated")]


async def test_async_semantic_hit(lc_embeddings: GPUPromptEmbeddings) -> None:
    cache = GPUPromptSemanticCache(lc_embeddings, score_threshold=0.85)
    await cache.aupdate("How long does delivery take?", LLM, ANSWER)
    assert await cache.alookup("How long does the delivery take?", LLM) == ANSWER
    assert await cache.alookup("Is the scarf made of wool?", LLM) is None
    await cache.aclear()
    assert await cache.alookup("How long does delivery take?", LLM) is None


def test_cache_stays_bounded(lc_embeddings: GPUPromptEmbeddings) -> None:
    cache = GPUPromptSemanticCache(lc_embeddings, score_threshold=0.99, max_entries=2)
    prompts = ["Where is my order?", "Is the scarf made of wool?", "Do you ship to Norway?"]
    for i, prompt in enumerate(prompts):
        cache.update(prompt, LLM, [Generation(text=f"answer {i}")])
    assert len(cache.answer_cache) == 2 and cache.answer_cache.stats().evicted == 1
    assert cache.lookup(prompts[0], LLM) is None  # the least recently used went first
    assert cache.lookup(prompts[2], LLM) == [Generation(text="answer 2")]


def test_entries_expire(lc_embeddings: GPUPromptEmbeddings) -> None:
    cache = GPUPromptSemanticCache(lc_embeddings, ttl_seconds=0.05)
    cache.update("What is your return policy?", LLM, ANSWER)
    time.sleep(0.2)
    assert cache.lookup("What is your return policy?", LLM) is None
    assert cache.lookup("What's your return policy?", LLM) is None
    assert len(cache.answer_cache) == 0 and cache.answer_cache.stats().expired == 1


def test_defaults_come_from_the_core_and_the_embedder_is_shared(lc_embeddings: GPUPromptEmbeddings) -> None:
    from gpuprompt.answer_cache import DEFAULT_MAX_ENTRIES, DEFAULT_TTL_SECONDS

    cache = GPUPromptSemanticCache(lc_embeddings)
    assert (cache.max_entries, cache.ttl_seconds) == (DEFAULT_MAX_ENTRIES, DEFAULT_TTL_SECONDS)
    assert cache.answer_cache.embedder is lc_embeddings.embedder


def test_chat_prompts_differing_only_in_roles_keep_their_own_answers(lc_embeddings: GPUPromptEmbeddings) -> None:
    from langchain_core.load import dumps
    from langchain_core.messages import HumanMessage, SystemMessage

    as_system = dumps([SystemMessage("Be brief."), HumanMessage("Hi")])
    as_human = dumps([HumanMessage("Be brief."), HumanMessage("Hi")])
    cache = GPUPromptSemanticCache(lc_embeddings)
    cache.update(as_system, LLM, [Generation(text="system")])
    cache.update(as_human, LLM, [Generation(text="human")])
    assert cache.lookup(as_system, LLM) == [Generation(text="system")]
    assert cache.lookup(as_human, LLM) == [Generation(text="human")]


def test_any_langchain_embeddings_work(lc_embeddings: GPUPromptEmbeddings) -> None:
    from langchain_core.embeddings import Embeddings

    class Wrapped(Embeddings):  # not a GPUPromptEmbeddings: goes through the float-list path
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return lc_embeddings.embed_documents(texts)

        def embed_query(self, text: str) -> list[float]:
            return lc_embeddings.embed_query(text)

    cache = GPUPromptSemanticCache(Wrapped(), score_threshold=0.85, device="cpu")
    cache.update("What is your return policy?", LLM, ANSWER)
    assert cache.lookup("What's your return policy?", LLM) == ANSWER
    assert cache.lookup("Do you ship to Norway?", LLM) is None


def test_bad_input(lc_embeddings: GPUPromptEmbeddings) -> None:
    with pytest.raises(ConfigurationError, match="'score_threshold'"):
        GPUPromptSemanticCache(lc_embeddings, score_threshold=1.5)
    with pytest.raises(ConfigurationError, match="'max_entries'"):
        GPUPromptSemanticCache(lc_embeddings, max_entries=0)
    with pytest.raises(ConfigurationError, match="'ttl_seconds'"):
        GPUPromptSemanticCache(lc_embeddings, ttl_seconds=0)
    with pytest.raises(ConfigurationError, match="'device'"):
        GPUPromptSemanticCache(lc_embeddings, device=None)  # type: ignore[arg-type]
    cache = GPUPromptSemanticCache(lc_embeddings)
    with pytest.raises(InputTypeError, match="'return_val\\[0\\]' must be a Generation"):
        cache.update("p", LLM, ["not a generation"])  # type: ignore[list-item]
    with pytest.raises(InputTypeError, match="'prompt' must be a str"):
        cache.lookup(None, LLM)  # type: ignore[arg-type]
    assert cache.lookup("p", LLM) is None
