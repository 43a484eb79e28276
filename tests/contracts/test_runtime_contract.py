"""The seam: ``connect()`` in process and ``connect(url)`` over a gpuprompt serve hand out
components that answer the same calls alike. Each protocol (EmbedderLike, RerankerLike,
EngineLike, ContextLike) is driven on both sides and the answers compared."""

from __future__ import annotations

import numpy as np
import pytest
from support.asgi import InProcessServer

from gpuprompt import get_runtime
from gpuprompt._corpus import prose_paragraphs
from gpuprompt.errors import InputTypeError, InvalidInputError
from gpuprompt.protocols import ContextLike, EmbedderLike, EngineLike, RerankerLike


@pytest.fixture(scope="module")
def engine():
    return get_runtime().llm(backend="transformers")


@pytest.fixture(scope="module")
def sides(embedder, reranker, engine):
    """(local components, remote components) over the same models."""
    from gpuprompt.context import ContextCache
    from gpuprompt.server import create_app

    memory = ContextCache(embedder)
    served = InProcessServer(create_app(embedder=embedder, llm=engine, reranker=reranker, memory=memory,
                                        preload=False)).start()
    remote = served.connect()
    local = {"embedder": embedder, "reranker": reranker, "llm": engine, "context": ContextCache(embedder)}
    far = {"embedder": remote.embedder(), "reranker": remote.reranker(), "llm": remote.llm(),
           "context": remote.context_cache()}
    yield local, far
    served.stop()


def test_each_side_satisfies_the_protocols(sides) -> None:
    for side in sides:
        assert isinstance(side["embedder"], EmbedderLike)
        assert isinstance(side["reranker"], RerankerLike)
        assert isinstance(side["llm"], EngineLike)
        assert isinstance(side["context"], ContextLike)


async def test_embeddings_are_equal(sides) -> None:
    local, far = sides
    texts = prose_paragraphs()[:6] + ["a", "SKU-48213-QX"]
    assert far["embedder"].dim == local["embedder"].dim and far["embedder"].identity == local["embedder"].identity
    assert np.allclose(far["embedder"].embed(texts), local["embedder"].embed(texts), atol=1e-5)
    assert np.allclose(await far["embedder"].aembed(texts[:2]), local["embedder"].embed(texts[:2]), atol=1e-5)
    for side in sides:
        with pytest.raises(InputTypeError):
            side["embedder"].embed("a bare str")
        with pytest.raises(InvalidInputError):
            side["embedder"].embed(["bad \ud800"])


async def test_rankings_are_equal(sides) -> None:
    local, far = sides
    docs = prose_paragraphs()[40:52]
    query = "How does a for statement iterate?"
    near, remote = local["reranker"].rerank(query, docs, top_n=5), far["reranker"].rerank(query, docs, top_n=5)
    assert [h.index for h in remote] == [h.index for h in near]
    assert [h.score for h in remote] == pytest.approx([h.score for h in near], abs=1e-5)
    assert far["reranker"].score([(query, docs[0])]) == pytest.approx(local["reranker"].score([(query, docs[0])]),
                                                                          abs=1e-5)
    assert [h.index for h in await far["reranker"].arerank(query, docs, top_n=3)] == [h.index for h in near[:3]]


async def test_generations_are_equal(sides) -> None:
    from gpuprompt.llm import GenerationRequest

    local, far = sides
    request = GenerationRequest(messages=[{"role": "user", "content": "Name a colour."}], max_tokens=6, temperature=0.0)
    near, remote = await local["llm"].agenerate(request), await far["llm"].agenerate(request)
    assert remote.text == near.text and remote.finish_reason == near.finish_reason
    assert remote.usage.completion_tokens == near.usage.completion_tokens


async def test_conversation_windows_are_equal(sides) -> None:
    local, far = sides
    turns = [("user", "I need a red dress."), ("assistant", "We have the Aurora dress."),
             ("user", "Does it shrink?"), ("assistant", "About 3% at 40 C.")]
    for side in (local, far):
        side["context"].extend("contract-1", turns)
    near = local["context"].window("contract-1", query="shrinking", max_turns=3)
    remote = far["context"].window("contract-1", query="shrinking", max_turns=3)
    assert [(t.role, t.text, t.index, t.tokens) for t in remote] == [(t.role, t.text, t.index, t.tokens) for t in near]
    for side in (local, far):
        side["context"].clear("contract-1")
        assert side["context"].window("contract-1") == []
        with pytest.raises((InputTypeError, InvalidInputError)):
            side["context"].extend("", turns)


async def test_tool_turns_and_their_windows_are_equal(sides) -> None:
    local, far = sides
    call = {"id": "c1", "type": "function", "function": {"name": "shrinkage", "arguments": '{"fabric": "cotton"}'}}
    turns = [{"role": "user", "content": "Does cotton shrink?"},
             {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "content": "3% at 40 C", "tool_call_id": "c1", "name": "shrinkage", "status": "success"},
             {"role": "assistant", "content": "About 3% at 40 C."}]
    for side in (local, far):
        await side["context"].aextend("contract-2", turns)
    near, remote = local["context"].turns("contract-2"), await far["context"].aturns("contract-2")
    assert [t.as_message() for t in remote] == [t.as_message() for t in near] == turns
    for options in ({"max_turns": 2}, {"max_turns": 3}, {"query": "shrinking", "max_turns": 3, "recent": 0}):
        assert [t.index for t in far["context"].window("contract-2", **options)] == [
            t.index for t in local["context"].window("contract-2", **options)], options
    for side in (local, far):
        side["context"].clear("contract-2")
        with pytest.raises(InvalidInputError, match="only an 'assistant' turn calls tools"):
            side["context"].extend("contract-2", [{"role": "user", "content": "x", "tool_calls": [call]}])
