"""The other core classes under hostile input: MicroBatcher, Embedder, ContextCache,
GenerationRequest and RAGPipeline. A typed error or a correct answer; nothing stored changes on a
refused call; an accepted constructor option never breaks a later call (rule 10)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from concurrent.futures import Future

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import prop_helpers as H
from gpuprompt import ContextCache, MicroBatcher, RAGPipeline, VectorIndex
from gpuprompt.errors import GPUPromptError, QueueFullError
from gpuprompt.llm import GenerationRequest, GenerationResult, Timings, Usage

ints = st.one_of(st.integers(-2, 70), H.extreme_numbers, H.junk_scalars)
numbers = st.one_of(st.floats(-1, 100), H.extreme_numbers, H.junk_scalars)


# ---------------------------------------------------------------------------------------- MicroBatcher
def _double(items: list) -> list:
    out = []
    for item in items:
        if item == "bad":
            raise ValueError("bad item")
        out.append(item * 2)
    return out


BATCHER_OPTIONS = {
    "name": st.one_of(st.text(max_size=5), H.junk_scalars),
    "max_batch_size": ints,
    "max_batch_cost": st.one_of(st.none(), ints),
    "cost": st.one_of(st.none(), st.just(lambda item: 1), st.just(lambda item: 10**400), st.just(lambda item: -5), H.junk_scalars),
    "max_wait_ms": numbers,
    "max_queue": ints,
    "isolate_failures": st.one_of(st.booleans(), H.junk_scalars),
    "fatal": st.one_of(st.just((ValueError,)), st.just(()), H.junk, st.just(("x",)), st.just(ValueError)),
}


def _is_bad_item(error: BaseException | None) -> bool:
    return isinstance(error, ValueError) and str(error) == "bad item"


@pytest.mark.timeout(120)
@H.fast(100)
@given(data=st.data())
def test_microbatcher_options_and_submit(data: st.DataObject) -> None:
    """Accepted options give a batcher whose worker survives a failing item and answers the rest:
    the bad item gets its own ValueError (the whole batch gets it only when isolation is off or
    ValueError is declared fatal), never an error born in the worker from an accepted option."""
    H.count("MicroBatcher")
    options = data.draw(st.fixed_dictionaries({}, optional=BATCHER_OPTIONS), label="options")
    ok, batcher = H.typed_or_ok(lambda: MicroBatcher(_double, **options))
    if not ok:
        return
    try:
        priority = data.draw(st.one_of(st.integers(-5, 5), H.extreme_numbers, H.junk_scalars), label="priority")
        items = [1, "bad", 3]
        ok_p, futures = H.typed_or_ok(lambda: batcher.submit_many(items, priority=priority))
        if not ok_p and not isinstance(futures, QueueFullError):  # the priority was refused
            ok_p, futures = H.typed_or_ok(lambda: batcher.submit_many(items))
        if not ok_p:
            # A queue shorter than the three items refuses them all at once (nothing is queued) and
            # says so; then the items go one at a time, each after the one before has run.
            assert isinstance(futures, QueueFullError), f"{type(futures).__name__}: {futures}"
            assert batcher.max_queue < len(items), f"refused with room in the queue: {futures}"
            futures = []
            for item in items[:2]:
                futures.append(batcher.submit(item))
                futures[-1].exception(timeout=20)
        first = futures[0].exception(timeout=20)
        assert first is None or _is_bad_item(first), f"good item failed: {type(first).__name__}: {first}"
        error = futures[1].exception(timeout=20)
        assert _is_bad_item(error) or isinstance(error, GPUPromptError), f"{type(error).__name__}: {error}"
        assert batcher.submit(5).result(timeout=20) == 10
    finally:
        batcher.close(timeout=5)


@pytest.mark.timeout(120)
@H.fast(60)
@given(timeout=st.one_of(st.none(), st.floats(0, 0.05), H.extreme_numbers, H.junk_scalars))
def test_microbatcher_close_timeout(timeout) -> None:
    """close(timeout=...) on a started batcher: a typed error or a clean close, never a builtin error."""
    H.count("MicroBatcher")
    batcher = MicroBatcher(_double)
    assert batcher.submit(1).result(timeout=20) == 2
    H.typed_or_ok(lambda: batcher.close(timeout=timeout))
    batcher.close(timeout=5)
    assert batcher.closed


# ---------------------------------------------------------------------------------------- Embedder
texts_strategy = st.one_of(
    st.lists(H.good_odd_text, max_size=3),
    st.lists(H.odd_text, max_size=3),
    st.lists(st.one_of(H.junk_scalars, H.good_odd_text), max_size=3),
    H.junk,
    H.good_odd_text,
)


@pytest.mark.timeout(240)
@H.fast(60)
@given(data=st.data())
def test_embedder_hostile(embedder, data: st.DataObject) -> None:
    H.count("Embedder")
    texts = data.draw(texts_strategy, label="texts")
    priority = data.draw(st.one_of(st.just(0), H.extreme_numbers, H.junk_scalars), label="priority")
    ok, out = H.typed_or_ok(lambda: embedder.embed(texts, priority=priority))
    if ok:
        assert out.shape == (len(texts), embedder.dim)
        assert np.isfinite(out).all()
        for text in texts:
            text.encode("utf-8")  # only well-formed text is embedded
    ok_a, out_a = H.typed_or_ok(lambda: asyncio.run(embedder.aembed(texts, priority=priority)))
    assert ok_a == ok, f"embed and aembed disagree: {H.short(out)} vs {H.short(out_a)}"
    ok_c, counts = H.typed_or_ok(lambda: embedder.count_tokens(texts))
    if ok_c:
        assert len(counts) == len(texts) and all(isinstance(c, int) and c >= 0 for c in counts)


EMBEDDER_OPTIONS = {
    "device": st.one_of(st.just("cpu"), H.junk_scalars),
    "normalize": st.one_of(st.booleans(), H.junk_scalars),
    "dtype": st.one_of(st.none(), st.sampled_from(["float32", "int8"]), H.junk_scalars),
    "batch_size": ints,
    "max_batch_tokens": ints,
    "max_wait_ms": numbers,
    "max_queue": ints,
    "cache_size": ints,
    "show_progress": st.one_of(st.booleans(), H.junk_scalars),
    "bogus": H.junk_scalars,
}


@pytest.mark.timeout(60)
@H.fast(150)
@given(data=st.data())
def test_embedder_constructor_hostile(data: st.DataObject) -> None:
    """Constructing loads nothing: a bad option is a ConfigurationError, never another error."""
    from gpuprompt import Embedder

    H.count("Embedder")
    model = data.draw(st.one_of(st.none(), H.junk_scalars), label="model")
    options = data.draw(st.fixed_dictionaries({}, optional=EMBEDDER_OPTIONS), label="options")
    H.typed_or_ok(lambda: Embedder(model, **options))


# ---------------------------------------------------------------------------------------- ContextCache
def _cache_state(cache: ContextCache) -> tuple:
    sessions = cache.sessions()
    return tuple(sessions), tuple((s, tuple((t.role, t.text, t.index) for t in cache.turns(s))) for s in sessions)


session_ids = st.one_of(st.sampled_from(["s1", "s2", "new"]), H.odd_text, H.junk_scalars, st.just("x" * 1025))
roles = st.one_of(st.sampled_from(["user", "assistant", "system", "tool", "bot", "USER"]), H.junk_scalars)
turn_items = st.one_of(
    st.tuples(roles, st.one_of(H.good_odd_text, H.odd_text, H.junk_scalars)),
    st.fixed_dictionaries({"role": roles, "content": st.one_of(H.good_odd_text, H.odd_text, H.junk_scalars)}),
    st.lists(st.sampled_from(["user", "hi", "x"]), max_size=3),
    H.junk,
)


@pytest.fixture(scope="module")
def context_cache(embedder):
    cache = ContextCache(embedder, max_sessions=5, max_turns_per_session=6)
    cache.extend("s1", [("user", "I want a red dress"), ("assistant", "We have the Aurora dress.")])
    cache.append("s2", "user", "Do you ship to Norway?")
    return cache


@pytest.mark.timeout(240)
@H.fast(100)
@given(data=st.data())
def test_context_cache_hostile(context_cache: ContextCache, data: st.DataObject) -> None:
    H.count("ContextCache")
    cache = context_cache
    op = data.draw(st.sampled_from(["append", "extend", "window", "turns", "clear", "awindow"]), label="op")
    session = data.draw(session_ids, label="session_id")
    before = _cache_state(cache)
    if op == "append":
        role = data.draw(roles, label="role")
        text = data.draw(st.one_of(H.good_odd_text, H.odd_text, H.junk_scalars), label="text")
        ok, turn = H.typed_or_ok(lambda: cache.append(session, role, text))
        if ok:
            assert cache.turns(session)[-1] == turn and turn.text == text and turn.role == role
            text.encode("utf-8")
            cache.clear(session)  # keep the fixture small
            return
    elif op == "extend":
        turns = data.draw(st.one_of(st.lists(turn_items, max_size=3), H.junk), label="turns")
        ok, stored = H.typed_or_ok(lambda: cache.extend(session, turns))
        if ok:
            if stored:
                assert [t.text for t in cache.turns(session)][-len(stored[-6:]):] == [t.text for t in stored[-6:]]
                cache.clear(session)
            return
    elif op in ("window", "awindow"):
        query = data.draw(st.one_of(st.none(), H.good_odd_text, H.odd_text, H.junk_scalars), label="query")
        max_turns = data.draw(st.one_of(st.integers(0, 5), H.extreme_numbers, H.junk_scalars), label="max_turns")
        max_tokens = data.draw(st.one_of(st.none(), st.integers(0, 50), H.extreme_numbers, H.junk_scalars), label="max_tokens")
        recent = data.draw(st.one_of(st.none(), st.integers(0, 5), H.extreme_numbers, H.junk_scalars), label="recent")
        if op == "window":
            ok, turns = H.typed_or_ok(lambda: cache.window(session, query, max_turns, max_tokens, recent=recent))
        else:
            ok, turns = H.typed_or_ok(lambda: asyncio.run(cache.awindow(session, query, max_turns, max_tokens, recent=recent)))
        if ok:
            assert len(turns) <= max_turns
            if max_tokens is not None:
                assert sum(t.tokens for t in turns) <= max_tokens
            assert [t.index for t in turns] == sorted(t.index for t in turns)
    elif op == "turns":
        ok, _ = H.typed_or_ok(lambda: cache.turns(session))
    else:
        if session is None or (isinstance(session, str) and session in ("s1", "s2")):  # None clears all, by design
            return
        ok, _ = H.typed_or_ok(lambda: cache.clear(session))
    assert _cache_state(cache) == before


CACHE_OPTIONS = {
    "max_sessions": ints,
    "ttl_seconds": st.one_of(st.none(), numbers),
    "max_turns_per_session": ints,
    "token_counter": st.one_of(st.none(), st.just(len), st.just(lambda t: -1), st.just(lambda t: 10**400), st.just(lambda t: 1.5), st.just(lambda t: True), H.junk_scalars),
    "clock": st.one_of(st.just(lambda: 0.0), st.just(lambda: math.nan), st.just(lambda: "x"), H.junk_scalars),
}


@pytest.mark.timeout(240)
@H.fast(60)
@given(data=st.data())
def test_context_cache_constructor_hostile(embedder, data: st.DataObject) -> None:
    """Accepted options never break append / window later (rule 10)."""
    H.count("ContextCache")
    options = data.draw(st.fixed_dictionaries({}, optional=CACHE_OPTIONS), label="options")
    ok, cache = H.typed_or_ok(lambda: ContextCache(embedder, **options))
    if not ok:
        return
    cache.append("s", "user", "hello there")
    cache.extend("s", [("assistant", "hi!"), ("user", "what is the return policy?")])
    turns = cache.window("s", "returns", max_turns=2, max_tokens=100)
    assert len(turns) <= 2
    assert cache.stats().sessions <= 1


# ---------------------------------------------------------------------------------------- GenerationRequest
REQUEST_FIELDS = {
    "max_tokens": ints,
    "temperature": numbers,
    "top_p": numbers,
    "seed": st.one_of(st.none(), ints),
    "stop": st.one_of(st.lists(st.one_of(H.good_odd_text, H.odd_text, H.junk_scalars), max_size=3), H.junk),
    "priority": ints,
    "response_format": st.one_of(
        st.none(),
        st.just({"type": "json_object"}),
        st.builds(lambda s: {"type": "json_schema", "json_schema": {"schema": s}}, st.one_of(H.json_values, H.junk)),
        st.dictionaries(st.text(max_size=3), st.one_of(H.json_values, H.junk), max_size=3),
        H.junk,
    ),
    "truncate": st.one_of(st.sampled_from(["error", "left", "right"]), H.junk_scalars),
    "request_id": st.one_of(st.none(), H.good_odd_text, H.odd_text, H.junk_scalars),
}
messages = st.one_of(
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"role": roles, "content": st.one_of(H.good_odd_text, H.odd_text, H.junk_scalars)}),
            H.junk,
        ),
        max_size=3,
    ),
    H.junk,
)


@pytest.mark.timeout(60)
@H.fast(300)
@given(data=st.data())
def test_generation_request_hostile(data: st.DataObject) -> None:
    """A request is refused with a typed error or holds only values every backend can take."""
    H.count("GenerationRequest")
    use_prompt = data.draw(st.booleans(), label="use_prompt")
    kwargs = data.draw(st.fixed_dictionaries({}, optional=REQUEST_FIELDS), label="fields")
    if use_prompt:
        kwargs["prompt"] = data.draw(st.one_of(H.good_odd_text, H.odd_text, H.junk_scalars), label="prompt")
    else:
        kwargs["messages"] = data.draw(messages, label="messages")
    ok, request = H.typed_or_ok(lambda: GenerationRequest(**kwargs))
    if not ok:
        return
    assert isinstance(request.max_tokens, int) and not isinstance(request.max_tokens, bool) and request.max_tokens >= 1
    assert isinstance(request.temperature, float) and math.isfinite(request.temperature)
    assert isinstance(request.top_p, float) and 0 < request.top_p <= 1
    assert request.seed is None or (isinstance(request.seed, int) and -(2**63) <= request.seed < 2**63)
    assert isinstance(request.priority, int) and not isinstance(request.priority, bool)
    assert request.truncate in ("error", "left") and isinstance(request.truncate, str)
    assert all(isinstance(s, str) and s for s in request.stop)
    for s in request.stop:
        s.encode("utf-8")
    if request.prompt is not None:
        request.prompt.encode("utf-8")
    for message in request.messages or ():
        assert isinstance(message["content"], str) and isinstance(message["role"], str)
        message["content"].encode("utf-8")
    if request.request_id is not None:
        request.request_id.encode("utf-8")
    if request.guided is not None:
        json.dumps(request.guided, allow_nan=False).encode("utf-8")


# ---------------------------------------------------------------------------------------- RAGPipeline
class FakeLLM:
    """Stands in for an LLMEngine: answers every request with the same text (no model runs)."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        return GenerationResult("An answer.", "stop", Usage(3, 2, 5), Timings(0.0, 0.0, 0.0), "fake", "r")


@pytest.fixture(scope="module")
def rag_parts(embedder):
    docs = ["Aurora dress: red, 100% cotton, 49 EUR.", "Boreal jeans: blue denim, 60 EUR.", "Shipping to Norway takes 5 days."]
    index = VectorIndex(embedder.dim, backend="torch", device="cpu")
    index.add(["d0", "d1", "d2"], embedder.embed(docs), documents=docs, metadatas=[{"kind": "dress"}, {"kind": "jeans"}, {"kind": "info"}])
    yield index
    index.close()


RAG_OPTIONS = {
    "system_prompt": st.one_of(H.good_odd_text, H.odd_text, H.junk_scalars),
    "k": ints,
    "history_turns": ints,
    "history_tokens": st.one_of(st.none(), ints),
    "max_tokens": ints,
    "temperature": numbers,
}


@pytest.mark.timeout(240)
@H.fast(60)
@given(data=st.data())
def test_rag_pipeline_hostile(embedder, rag_parts, data: st.DataObject) -> None:
    H.count("RAGPipeline")
    options = data.draw(st.fixed_dictionaries({}, optional=RAG_OPTIONS), label="options")
    llm = FakeLLM()
    memory = ContextCache(embedder)
    ok, rag = H.typed_or_ok(lambda: RAGPipeline(rag_parts, llm, embedder=embedder, memory=memory, **options))
    if not ok:
        return
    session = data.draw(session_ids, label="session_id")
    question = data.draw(st.one_of(st.just("Will the red dress shrink?"), H.good_odd_text, H.odd_text, H.junk_scalars), label="question")
    k = data.draw(st.one_of(st.none(), ints), label="k")
    flt = data.draw(st.one_of(st.none(), H.filters, H.junk), label="filter")
    max_tokens = data.draw(st.one_of(st.none(), ints), label="max_tokens")
    priority = data.draw(st.one_of(st.just(0), ints), label="priority")
    before = H.index_state(rag_parts)
    ok, answer = H.typed_or_ok(lambda: rag.answer(session, question, k=k, filter=flt, max_tokens=max_tokens, priority=priority))
    assert H.index_state(rag_parts) == before
    if not ok:
        assert memory.sessions() == [], "a refused answer() stored turns"
        assert not llm.requests or True
        return
    assert answer.answer == "An answer."
    assert len(answer.sources) <= (k or rag.k)
    assert [t.text for t in memory.turns(session)][-2:] == [question, "An answer."]


@pytest.mark.timeout(120)
@H.fast(60)
@given(data=st.data())
def test_rag_pipeline_components_hostile(embedder, rag_parts, data: st.DataObject) -> None:
    """Components of the wrong type are refused at construction, never by a later AttributeError."""
    H.count("RAGPipeline")
    parts = {"index": rag_parts, "llm": FakeLLM(), "embedder": embedder, "memory": ContextCache(embedder)}
    name = data.draw(st.sampled_from(sorted(parts)), label="component")
    parts[name] = data.draw(st.one_of(H.junk_scalars, st.just(object()), st.just(FakeLLM()), st.just(embedder)), label="value")
    index, llm = parts.pop("index"), parts.pop("llm")
    ok, rag = H.typed_or_ok(lambda: RAGPipeline(index, llm, **parts))
    if not ok:
        return
    H.typed_or_ok(lambda: rag.answer("s", "Will the red dress shrink?"))
