"""GPUPromptSemanticCache: the langchain-tests cache suites, semantic hits, isolation and errors."""

from __future__ import annotations

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


def test_bad_input(lc_embeddings: GPUPromptEmbeddings) -> None:
    with pytest.raises(ConfigurationError, match="'score_threshold'"):
        GPUPromptSemanticCache(lc_embeddings, score_threshold=1.5)
    cache = GPUPromptSemanticCache(lc_embeddings)
    with pytest.raises(InputTypeError, match="'return_val\\[0\\]' must be a Generation"):
        cache.update("p", LLM, ["not a generation"])  # type: ignore[list-item]
    with pytest.raises(InputTypeError, match="'prompt' must be a str"):
        cache.lookup(None, LLM)  # type: ignore[arg-type]
    assert cache.lookup("p", LLM) is None
