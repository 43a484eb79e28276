"""The remote semantic LLM cache against a live ``gpuprompt serve``: ``GPUPromptSemanticCache`` with
``base_url`` (or ``GPUPROMPT_URL``) serves repeats and similar prompts from the server's one
AnswerCache exactly as an in-process cache does; workers share entries, ``llm_string`` namespaces
never mix; the langchain-tests cache suites; typed errors; a worker imports no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
from langchain_core.caches import BaseCache
from langchain_core.globals import get_llm_cache, set_llm_cache
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, Generation, GenerationChunk
from langchain_tests.integration_tests import AsyncCacheTestSuite, SyncCacheTestSuite

from gpuprompt.errors import ConfigurationError, EngineDeadError, EngineError, InputTypeError, InvalidInputError
from gpuprompt.remote import RemoteAnswerCache, RemoteClient, RemoteConfig
from gpuprompt.remote._answer_cache import MAX_ANSWER_BYTES
from gpuprompt.server.routes.cache import MAX_ENTRIES, TTL_SECONDS, namespace_key
from langchain_gpuprompt import ChatGPUPrompt, GPUPromptEmbeddings, GPUPromptSemanticCache

LLM = "model=smollm2 temperature=0"
OTHER_LLM = "model=smollm2 temperature=0.7"
ANSWER = [Generation(text="Delivery takes 2-4 days.")]
ASKED = "How long does delivery take?"
SIMILAR = "How many days does shipping take?"  # cosine ~0.71 to ASKED under the bundled MiniLM
UNRELATED = "Is the scarf made of wool?"


@pytest.fixture
def fresh(live) -> Iterator[RemoteAnswerCache]:
    """The live server's cache, emptied before and after the test (one cache for the whole server)."""
    answers = RemoteAnswerCache(live.url)
    answers.clear()
    yield answers
    answers.clear()


@pytest.fixture
def global_cache() -> Iterator[None]:
    """Restores LangChain's global LLM cache after a test that sets it."""
    before = get_llm_cache()
    yield
    set_llm_cache(before)


def _requests(live) -> int:
    return live.state.llm.stats().requests


# ---------------------------------------------------------------------- conformance
class TestRemoteSemanticCacheSync(SyncCacheTestSuite):
    @pytest.fixture()
    def cache(self, live) -> BaseCache:
        cache = GPUPromptSemanticCache(base_url=live.url)
        cache.clear()  # the server's cache outlives this object: start empty
        return cache


class TestRemoteSemanticCacheAsync(AsyncCacheTestSuite):
    @pytest.fixture()
    async def cache(self, live) -> BaseCache:
        cache = GPUPromptSemanticCache(base_url=live.url)
        await cache.aclear()
        return cache


# ---------------------------------------------------------------------- with a chat model
def test_repeats_and_similar_prompts_never_reach_the_engine(live, fresh, global_cache) -> None:
    set_llm_cache(GPUPromptSemanticCache(base_url=live.url, score_threshold=0.6))
    chat = ChatGPUPrompt(base_url=live.url, max_tokens=8)
    before, counted = _requests(live), fresh.stats()
    first = chat.invoke(ASKED)
    assert _requests(live) == before + 1
    hit = chat.invoke(ASKED)  # the exact repeat: from the cache, message and metadata alike
    assert hit == first.model_copy(update={"usage_metadata": {**first.usage_metadata, "total_cost": 0}})
    assert chat.invoke(SIMILAR).content == first.content  # similar enough at 0.6
    assert _requests(live) == before + 1
    stats = fresh.stats()  # the counters count since the server started
    assert (stats.entries, stats.exact_hits - counted.exact_hits, stats.similar_hits - counted.similar_hits) == (1, 1, 1)

    set_llm_cache(GPUPromptSemanticCache(base_url=live.url, score_threshold=0.9))  # another worker's threshold
    chat.invoke(ASKED)
    assert _requests(live) == before + 1
    chat.invoke(SIMILAR)  # not similar enough at 0.9: generated, then cached too
    assert _requests(live) == before + 2
    assert fresh.stats().entries == 2


async def test_async_chat_over_the_remote_cache(live, fresh, global_cache) -> None:
    set_llm_cache(GPUPromptSemanticCache(base_url=live.url, score_threshold=0.6))
    chat = ChatGPUPrompt(base_url=live.url, max_tokens=8)
    before = _requests(live)
    first = await chat.ainvoke(ASKED)
    assert (await chat.ainvoke(SIMILAR)).content == first.content
    assert _requests(live) == before + 1


def test_hits_and_misses_equal_in_process(live, fresh) -> None:
    """The same updates and lookups on a remote and an in-process cache give the same answers, at
    every threshold (the same bundled embedder on both sides)."""
    prompts = [ASKED, "What is your return policy?", "Do you ship to Norway?"]
    queries = [ASKED, SIMILAR, "What's your return policy?", "How do I return an item I bought?",
               "Can you deliver to Oslo?", UNRELATED]
    local_embeddings = GPUPromptEmbeddings()
    for threshold in (0.1, 0.3, 0.6, 0.9, 0.995):  # best scores of the queries: 1, .71, .99, .47, .70, .15
        remote = GPUPromptSemanticCache(base_url=live.url, score_threshold=threshold)
        local = GPUPromptSemanticCache(local_embeddings, score_threshold=threshold)
        remote.clear()
        for i, prompt in enumerate(prompts):
            for cache in (remote, local):
                cache.update(prompt, LLM, [Generation(text=f"answer {i}")])
        got = [remote.lookup(q, LLM) for q in queries]
        assert got == [local.lookup(q, LLM) for q in queries], threshold
        assert got[0] == [Generation(text="answer 0")]  # an exact repeat always hits
    assert [remote.lookup(q, LLM) is None for q in queries[1:]] == [True] * 5  # at 0.995


def test_generations_round_trip(live, fresh) -> None:
    cache = GPUPromptSemanticCache(base_url=live.url)
    message = AIMessage(
        "Let me check.",
        tool_calls=[{"name": "order_status", "args": {"order_id": 42, "nested": {"a": [1, 2.5, None]}},
                     "id": "c1", "type": "tool_call"}],
        usage_metadata={"input_tokens": 9, "output_tokens": 4, "total_tokens": 13},
        response_metadata={"finish_reason": "tool_calls", "model_name": "smollm2"},
        id="run-1",
    )
    for value in (
        [ChatGeneration(message=message, generation_info={"finish_reason": "tool_calls", "logprobs": None})],
        [ChatGenerationChunk(message=AIMessageChunk("par", id="x")), ChatGeneration(message=AIMessage("two"))],
        [Generation(text="a", generation_info={"n": 1}), GenerationChunk(text="b"), Generation(text="")],
        [],
    ):
        cache.update(ASKED, LLM, value)
        got = cache.lookup(ASKED, LLM)
        assert got == value and [type(g) for g in got] == [type(g) for g in value]


async def test_two_workers_share_entries(live, fresh, monkeypatch) -> None:
    """Two worker processes are two clients (two pools): each reads the other's answers at once."""
    one = GPUPromptSemanticCache(base_url=live.url)
    monkeypatch.setenv("GPUPROMPT_URL", live.url)
    two = GPUPromptSemanticCache(score_threshold=0.6)  # GPUPROMPT_URL: remote, this worker's threshold
    assert isinstance(two.answer_cache, RemoteAnswerCache)
    other_pool = RemoteAnswerCache(client=RemoteClient(RemoteConfig(base_url=live.url)))
    assert other_pool.client is not two.answer_cache.client
    one.update(ASKED, LLM, ANSWER)
    assert two.lookup(ASKED, LLM) == ANSWER
    assert two.lookup(SIMILAR, LLM) == ANSWER and one.lookup(SIMILAR, LLM) is None  # each its own threshold
    await two.aupdate(UNRELATED, LLM, [Generation(text="Yes, merino.")])
    assert await one.alookup(UNRELATED, LLM) == [Generation(text="Yes, merino.")]
    # A third client, with its own pool: the llm_string is the namespace, whoever writes.
    assert other_pool.lookup(UNRELATED, LLM) == [{"type": "Generation", "generation_info": None, "text": "Yes, merino."}]
    assert other_pool.stats().entries == 2


def test_llm_strings_never_share(live, fresh, global_cache) -> None:
    cache = GPUPromptSemanticCache(base_url=live.url, score_threshold=-1.0)  # anything of a namespace hits
    cache.update(ASKED, LLM, ANSWER)
    assert cache.lookup(UNRELATED, LLM) == ANSWER
    assert cache.lookup(ASKED, OTHER_LLM) is None
    cache.update(ASKED, OTHER_LLM, [Generation(text="other")])
    assert cache.lookup(ASKED, LLM) == ANSWER and cache.lookup(ASKED, OTHER_LLM) == [Generation(text="other")]
    # Two chat models of different settings: the second is not served the first one's answer.
    set_llm_cache(cache)
    short, longer = ChatGPUPrompt(base_url=live.url, max_tokens=4), ChatGPUPrompt(base_url=live.url, max_tokens=6)
    before = _requests(live)
    short.invoke("Name a colour.")
    longer.invoke("Name a colour.")
    short.invoke("Name a fruit.")  # similar at -1.0: a hit for the same model
    assert _requests(live) == before + 2


async def test_clear_one_llm_string_or_all(live, fresh) -> None:
    one, two = GPUPromptSemanticCache(base_url=live.url), GPUPromptSemanticCache(base_url=live.url)
    one.update(ASKED, LLM, ANSWER)
    one.update(ASKED, OTHER_LLM, ANSWER)
    two.clear(llm_string=LLM)
    assert one.lookup(ASKED, LLM) is None and one.lookup(ASKED, OTHER_LLM) == ANSWER
    await two.aclear(llm_string="never used")  # idempotent
    await one.aupdate(ASKED, LLM, ANSWER)
    await two.aclear()
    assert await one.alookup(ASKED, LLM) is None and one.lookup(ASKED, OTHER_LLM) is None
    assert fresh.stats().entries == 0


def test_the_server_keeps_one_bounded_cache(live, fresh) -> None:
    cache = GPUPromptSemanticCache(base_url=live.url, score_threshold=0.8)
    assert (cache.max_entries, cache.ttl_seconds) == (MAX_ENTRIES, TTL_SECONDS)
    assert cache.score_threshold == 0.8
    assert repr(cache) == f"<GPUPromptSemanticCache over <RemoteAnswerCache '{live.url}/v1' score_threshold=0.8>>"
    assert repr(cache.answer_cache).startswith("<RemoteAnswerCache")
    cache.update(ASKED, LLM * 1000, ANSWER)  # a long llm_string is held by its hash
    server_cache = live.app.state.gpuprompt.answers
    assert server_cache.lookup(ASKED, namespace_key(LLM * 1000)) == [
        {"type": "Generation", "generation_info": None, "text": ANSWER[0].text}]
    assert isinstance(cache.embeddings, GPUPromptEmbeddings) and cache.embeddings.base_url == live.url


# ---------------------------------------------------------------------- typed errors and configuration
def test_bad_arguments_are_typed_and_send_nothing(dead_url) -> None:
    cache = GPUPromptSemanticCache(base_url=dead_url)  # nothing listens: a sent request would fail otherwise
    with pytest.raises(InputTypeError, match="'prompt' must be a str"):
        cache.lookup(None, LLM)  # type: ignore[arg-type]
    with pytest.raises(InputTypeError, match="'llm_string'"):
        cache.update("p", 5, ANSWER)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="lone surrogate"):
        cache.lookup("lone \ud800", LLM)
    with pytest.raises(InputTypeError, match=r"'return_val\[0\]' must be a Generation"):
        cache.update("p", LLM, ["not a generation"])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match=r"'value\[0\]\.generation_info.*finite"):
        cache.update("p", LLM, [Generation(text="x", generation_info={"score": float("nan")})])
    with pytest.raises(InvalidInputError, match=f"at most {MAX_ANSWER_BYTES} bytes"):
        cache.update("p", LLM, [Generation(text="x" * MAX_ANSWER_BYTES)])
    with pytest.raises(InputTypeError, match="'namespace'"):
        cache.answer_cache.clear(3)  # type: ignore[arg-type]
    answers = RemoteAnswerCache(dead_url)
    with pytest.raises(InvalidInputError, match="'score_threshold'"):
        answers.lookup("p", LLM, score_threshold=2)
    with pytest.raises(InvalidInputError, match="other than null"):
        answers.update("p", LLM, None)


def test_the_server_checks_raw_requests_too(live, fresh) -> None:
    client = fresh.client
    ok = {"namespace": LLM, "prompt": "p"}
    for path, body, match in [
        ("/cache/lookup", {**ok, "score_threshold": 1.5}, "score_threshold"),
        ("/cache/lookup", {**ok, "score_threshold": "0.5"}, "score_threshold"),
        ("/cache/lookup", {**ok, "k": 2}, "k"),
        ("/cache/lookup", {"prompt": "p"}, "namespace"),
        ("/cache/update", ok, "answer"),
        ("/cache/update", {**ok, "answer": None}, "'answer' must be a JSON value other than null"),
        ("/cache/update", {**ok, "answer": "x" * (MAX_ANSWER_BYTES + 1)}, f"at most {MAX_ANSWER_BYTES} bytes"),
        ("/cache/update", {**ok, "answer": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
         "nested"),
        ("/cache/clear", {}, "namespace"),
        ("/cache/clear", {"namespace": 7}, "namespace"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            client.request("POST", path, body, idempotent=False)
    assert fresh.stats().entries == 0


def test_an_entry_of_another_writer_fails_typed(live, fresh) -> None:
    fresh.update(ASKED, LLM, {"not": "generations"})  # a raw client under the same llm_string
    cache = GPUPromptSemanticCache(base_url=live.url)
    with pytest.raises(EngineError, match="not a list of LangChain generations.*clear"):
        cache.lookup(ASKED, LLM)
    assert fresh.lookup(ASKED, LLM) == {"not": "generations"}


def test_dead_server_fails_fast_and_typed(dead_url) -> None:
    import asyncio

    started = time.monotonic()
    cache = GPUPromptSemanticCache(base_url=dead_url)
    with pytest.raises(EngineDeadError, match="could not connect"):
        cache.update(ASKED, LLM, ANSWER)
    with pytest.raises(EngineDeadError):
        cache.lookup(ASKED, LLM)  # a lookup is retried (twice, with backoff), then fails
    with pytest.raises(EngineDeadError):
        asyncio.run(cache.alookup(ASKED, LLM))
    with pytest.raises(EngineDeadError):
        cache.clear()
    assert time.monotonic() - started < 10


def test_api_key(live_keyed, monkeypatch) -> None:
    with pytest.raises(EngineError, match="api_key"):
        GPUPromptSemanticCache(base_url=live_keyed.url, api_key="wrong").lookup(ASKED, LLM)
    GPUPromptSemanticCache(base_url=live_keyed.url, api_key="sesame").update(ASKED, "keyed " + LLM, ANSWER)
    monkeypatch.setenv("GPUPROMPT_URL", live_keyed.url)
    monkeypatch.setenv("GPUPROMPT_API_KEY", "sesame")
    cache = GPUPromptSemanticCache()
    assert cache.lookup(ASKED, "keyed " + LLM) == ANSWER
    assert "sesame" not in repr(cache)
    cache.clear(llm_string="keyed " + LLM)


def test_remote_configuration(live, monkeypatch) -> None:
    monkeypatch.delenv("GPUPROMPT_URL", raising=False)
    monkeypatch.delenv("GPUPROMPT_API_KEY", raising=False)
    embeddings = GPUPromptEmbeddings()
    for bad in ({"embedding": embeddings}, {"device": "cpu"}, {"max_entries": 5}, {"ttl_seconds": None}):
        name = next(iter(bad))
        with pytest.raises(ConfigurationError, match=rf"in-process option\(s\) \['{name}'\].*base_url"):
            GPUPromptSemanticCache(base_url=live.url, **bad)
    with pytest.raises(ConfigurationError, match="'score_threshold'"):
        GPUPromptSemanticCache(base_url=live.url, score_threshold=1.5)
    with pytest.raises(ConfigurationError, match="api_key"):
        GPUPromptSemanticCache(api_key="k")
    with pytest.raises(ConfigurationError, match="base_url"):
        GPUPromptSemanticCache(base_url="localhost:8000")
    assert not isinstance(GPUPromptSemanticCache().answer_cache, RemoteAnswerCache)  # no server: in process
    monkeypatch.setenv("GPUPROMPT_URL", live.url)
    assert isinstance(GPUPromptSemanticCache().answer_cache, RemoteAnswerCache)
    # A given embedding keeps the cache in process (the environment only chooses for the default).
    assert not isinstance(GPUPromptSemanticCache(embeddings).answer_cache, RemoteAnswerCache)
    with pytest.raises(ConfigurationError, match=r"\['device'\].*GPUPROMPT_URL"):
        GPUPromptSemanticCache(device="cpu")
    with pytest.raises(ConfigurationError, match="'client' must be a RemoteClient"):
        RemoteAnswerCache(client="http://x")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the worker process
def test_a_remote_cache_worker_imports_no_torch(live, fresh) -> None:
    code = textwrap.dedent(
        """
        import asyncio, json, sys
        from langchain_core.globals import set_llm_cache
        from langchain_gpuprompt import ChatGPUPrompt, GPUPromptSemanticCache

        set_llm_cache(GPUPromptSemanticCache(score_threshold=0.6))
        chat = ChatGPUPrompt(max_tokens=8)
        out = {"first": chat.invoke("How long does delivery take?").content}
        out["repeat"] = chat.invoke("How long does delivery take?").content
        out["similar"] = asyncio.run(chat.ainvoke("How many days does shipping take?")).content
        heavy = ("torch", "transformers", "sentence_transformers", "vllm", "faiss", "safetensors", "accelerate")
        out["heavy"] = sorted(m for m in heavy if m in sys.modules)
        print(json.dumps(out))
        """
    )
    env = {**os.environ, "GPUPROMPT_URL": live.url, "HF_HUB_OFFLINE": "1"}
    env.pop("GPUPROMPT_API_KEY", None)
    before = _requests(live)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    assert out["first"] == out["repeat"] == out["similar"]
    assert _requests(live) == before + 1
    # This process sees the worker's answer (same llm_string: same model settings and server).
    chat = ChatGPUPrompt(base_url=live.url, max_tokens=8)
    local_view = GPUPromptSemanticCache(base_url=live.url)
    found = local_view.lookup(_chat_prompt("How long does delivery take?"), chat._get_llm_string())
    assert found is not None and found[0].text == out["first"]


def _chat_prompt(text: str) -> str:
    """The cache prompt LangChain builds for one user message to a chat model."""
    from langchain_core.load import dumps
    from langchain_core.messages import HumanMessage

    return dumps([HumanMessage(text)])
