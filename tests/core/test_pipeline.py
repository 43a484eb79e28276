"""RAGPipeline on the bundled models: sources, history, stable prompt prefix, timings, concurrent
sessions sharing the batchers, typed errors that leave the sessions untouched; and the demo."""

from __future__ import annotations

import re

import asyncio

import pytest

from gpuprompt import ContextCache, RAGPipeline, VectorIndex
from gpuprompt.apps.demo import catalogue, customer_questions
from gpuprompt.errors import ConfigurationError, FilterError, InputTypeError

PRODUCTS = catalogue(60)


@pytest.fixture(scope="module")
def shop(embedder) -> VectorIndex:
    """A 60-product catalogue indexed with the session embedder."""
    index = VectorIndex(embedder.dim, metric="cosine")
    index.add(
        [p["id"] for p in PRODUCTS],
        embedder.embed([p["text"] for p in PRODUCTS]),
        documents=[p["text"] for p in PRODUCTS],
        metadatas=[p["metadata"] for p in PRODUCTS],
    )
    yield index
    index.close()


@pytest.fixture
def rag(shop, embedder, tf_engine) -> RAGPipeline:
    """A pipeline with its own (empty) session memory, short answers, greedy decoding."""
    return RAGPipeline(shop, tf_engine, embedder=embedder, memory=ContextCache(embedder), k=3, max_tokens=6)


def test_answer_has_sources_usage_and_stage_timings(rag: RAGPipeline, shop: VectorIndex, embedder) -> None:
    question = "Will the red dress shrink after washing?"
    reply = rag.answer("alice", question)

    assert reply.session_id == "alice" and reply.question == question
    assert isinstance(reply.answer, str) and reply.answer
    expected = shop.search(embedder.embed([question]), 3)[0]
    assert [hit.id for hit in reply.sources] == [hit.id for hit in expected]
    assert reply.history == []
    assert 0 < reply.usage.completion_tokens <= 6
    t = reply.timings
    stages = [t.embed_s, t.retrieve_s, t.context_s, t.generate_s]
    assert all(s >= 0 for s in stages) and t.generate_s > 0
    assert t.total_s >= sum(stages)


def test_turns_are_recorded_and_the_prompt_prefix_is_stable(rag: RAGPipeline) -> None:
    questions = ["I want a red dress.", "What is it made of?", "Will it shrink?"]
    replies = [rag.answer("bob", q) for q in questions]

    turns = rag.memory.turns("bob")
    assert [(t.role, t.text) for t in turns] == [
        pair for q, r in zip(questions, replies) for pair in (("user", q), ("assistant", r.answer))
    ]
    assert [t.text for t in replies[2].history] == [questions[0], replies[0].answer, questions[1], replies[1].answer]
    # Turn 3's prompt starts with turn 2's prompt minus its last message (which carried the facts):
    # the engine's prefix cache serves everything but the new question.
    second = rag.messages(questions[1], replies[1].sources, replies[1].history)
    third = rag.messages(questions[2], replies[2].sources, replies[2].history)
    assert third[: len(second) - 1] == second[:-1]
    assert second[0] == {"role": "system", "content": rag.system_prompt}
    assert "Product facts:" in third[-1]["content"] and all("Product facts:" not in m["content"] for m in third[:-1])


def test_filter_restricts_the_sources(rag: RAGPipeline) -> None:
    reply = rag.answer("carol", "something warm for winter", filter={"type": "coat"}, k=2)
    assert len(reply.sources) == 2
    assert all(hit.metadata["type"] == "coat" for hit in reply.sources)


def test_concurrent_sessions_share_batches_and_keep_their_own_history(rag: RAGPipeline, embedder) -> None:
    questions = customer_questions(8, seed=321)
    before = embedder.stats().batcher

    async def burst() -> list:
        return list(await asyncio.gather(*(rag.aanswer(f"c{i}", q) for i, q in enumerate(questions))))

    replies = asyncio.run(burst())
    after = embedder.stats().batcher

    assert [r.session_id for r in replies] == [f"c{i}" for i in range(8)]
    assert [r.question for r in replies] == questions
    for i, reply in enumerate(replies):
        assert [t.text for t in rag.memory.turns(f"c{i}")] == [questions[i], reply.answer]
    # 8 questions and 16 new turns went through the embedder in fewer forward passes than texts.
    assert after.batches - before.batches < after.items - before.items


def test_bad_input_is_refused_and_sessions_stay_intact(rag: RAGPipeline, shop, embedder, tf_engine) -> None:
    rag.answer("dora", "Do you have a navy coat?")
    kept = rag.memory.turns("dora")

    with pytest.raises(InputTypeError, match="session_id"):
        rag.answer("", "hello")
    with pytest.raises(InputTypeError, match="question"):
        rag.answer("dora", 42)  # type: ignore[arg-type]
    with pytest.raises(FilterError):
        rag.answer("dora", "a coat", filter={"price": {"$between": [1, 2]}})
    with pytest.raises(ConfigurationError, match="'k'"):
        RAGPipeline(shop, tf_engine, embedder=embedder, k=0)
    with pytest.raises(ConfigurationError, match="history_turns"):
        RAGPipeline(shop, tf_engine, embedder=embedder, history_turns=-1)

    assert rag.memory.turns("dora") == kept
    assert rag.answer("dora", "And in size M?").history == kept


def test_answer_works_inside_a_running_event_loop(rag: RAGPipeline) -> None:
    async def from_a_notebook() -> str:
        return rag.answer("erin", "How much is the black jeans?").answer

    assert asyncio.run(from_a_notebook())


def test_demo_prints_both_pipelines(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprompt.apps.demo import SCRIPT, run_demo

    assert run_demo(products=40, customers=4, naive_customers=2, max_tokens=4, llm_backend="transformers") == 0
    out = capsys.readouterr().out
    assert "40 products indexed" in out
    assert out.count("customer: ") == len(SCRIPT) + 1  # the scripted turns and the question naming a code
    named = re.search(r"\(asked for (P\d{6})\)", out).group(1)
    assert f"hybrid (BM25 + vectors, alpha 0.3): {named}" in out
    for stage in ("embed", "retrieve", "context", "generate", "total", "response", "answers/s"):
        assert f"\n{stage}" in out
    assert "naive serial, 2 cust. p50" in out and "gpuprompt, 4 cust. p50" in out
    assert f"history at turn {len(SCRIPT)} of the conversation: naive" in out
    assert "x the naive pipeline; device cpu, LLM backend transformers" in out


def test_demo_shows_the_rerank_stage_with_a_rerank_model(cross_encoder_path: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprompt.apps.demo import run_demo

    assert run_demo(products=30, customers=2, naive_customers=1, max_tokens=2, llm_backend="transformers",
                    rerank_model=cross_encoder_path) == 0
    out = capsys.readouterr().out
    assert "20 candidates retrieved, the best 4 kept" in out
    rerank = next(line for line in out.splitlines() if line.startswith("rerank "))
    assert rerank.split("|")[1].strip() == "-" and " ms" in rerank.split("|")[2]  # naive: no stage; ours: timed


def test_demo_refuses_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprompt.apps.cli import main
    from gpuprompt.apps.demo import run_demo

    with pytest.raises(ConfigurationError, match="'products' must be an int >= 1"):
        run_demo(products=0)
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--customers", "-3"])
    assert exit_info.value.code == 2
    assert "--customers: expected a whole number >= 1, got -3" in capsys.readouterr().err
