"""langchain_gpuprompt under hostile input: GPUPromptEmbeddings, GPUPromptVectorStore,
GPUPromptStore, GPUPromptChatMessageHistory, GPUPromptSemanticCache. A typed error or a correct
answer, nothing stored changes on a refused call, accepted options and values never break later.

Errors LangGraph's own ``BaseStore`` methods raise before delegating to our ``batch``
(``InvalidNamespaceError``) are the framework's contract and are accepted; pydantic's
``ValidationError`` from our own classes' fields is not (the house rule wants a typed error).
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("langchain_core")
pytest.importorskip("langgraph")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import Generation  # noqa: E402
from langgraph.store.base import GetOp, InvalidNamespaceError, ListNamespacesOp, PutOp, SearchOp  # noqa: E402

import prop_helpers as H  # noqa: E402
from gpuprompt import ContextCache  # noqa: E402
from gpuprompt.errors import GPUPromptError  # noqa: E402
from langchain_gpuprompt import (  # noqa: E402
    GPUPromptChatMessageHistory,
    GPUPromptEmbeddings,
    GPUPromptSemanticCache,
    GPUPromptStore,
    GPUPromptVectorStore,
)

ints = st.one_of(st.integers(-2, 6), H.extreme_numbers, H.junk_scalars)


@pytest.fixture(scope="module")
def lc_embeddings(embedder) -> GPUPromptEmbeddings:
    emb = GPUPromptEmbeddings(device="cpu")
    emb._embedder = embedder  # share the session's loaded model
    return emb


# ---------------------------------------------------------------------------------------- embeddings
EMB_FIELDS = {
    "model": st.one_of(st.none(), H.junk_scalars),
    "device": st.one_of(st.just("cpu"), H.junk_scalars),
    "normalize": st.one_of(st.booleans(), H.junk_scalars),
    "dtype": st.one_of(st.none(), H.junk_scalars),
    "batch_size": ints,
    "max_batch_tokens": ints,
    "max_wait_ms": st.one_of(st.floats(0, 10), H.extreme_numbers, H.junk_scalars),
    "max_queue": ints,
    "cache_size": ints,
    "show_progress": st.one_of(st.booleans(), H.junk_scalars),
    "unknown_field": H.junk_scalars,
}


@pytest.mark.timeout(60)
@H.fast(150)
@given(data=st.data())
def test_embeddings_constructor_hostile(data: st.DataObject) -> None:
    H.count("GPUPromptEmbeddings")
    fields = data.draw(st.fixed_dictionaries({}, optional=EMB_FIELDS), label="fields")
    H.typed_or_ok(lambda: GPUPromptEmbeddings(**fields))


texts = st.one_of(
    st.lists(H.good_odd_text, max_size=3),
    st.lists(st.one_of(H.odd_text, H.junk_scalars), max_size=3),
    H.junk,
)


@pytest.mark.timeout(120)
@H.fast(50)
@given(data=st.data())
def test_embeddings_calls_hostile(lc_embeddings: GPUPromptEmbeddings, data: st.DataObject) -> None:
    H.count("GPUPromptEmbeddings")
    docs = data.draw(texts, label="texts")
    ok, out = H.typed_or_ok(lambda: lc_embeddings.embed_documents(docs))
    if ok:
        assert len(out) == len(docs) and all(len(v) == 384 and all(math.isfinite(x) for x in v) for v in out)
    ok_a, _ = H.typed_or_ok(lambda: asyncio.run(lc_embeddings.aembed_documents(docs)))
    assert ok_a == ok
    query = data.draw(st.one_of(H.good_odd_text, H.odd_text, H.junk_scalars), label="query")
    ok_q, vec = H.typed_or_ok(lambda: lc_embeddings.embed_query(query))
    if ok_q:
        assert len(vec) == 384
    ok_qa, _ = H.typed_or_ok(lambda: asyncio.run(lc_embeddings.aembed_query(query)))
    assert ok_qa == ok_q


# ---------------------------------------------------------------------------------------- vector store
def _store(lc_embeddings, backend: str = "torch") -> GPUPromptVectorStore:
    store = GPUPromptVectorStore(lc_embeddings, backend=backend, device="cpu")
    store.add_texts(
        ["red cotton dress", "blue denim jeans", "shipping to Norway"],
        [{"kind": "dress", "price": 49}, {"kind": "jeans", "price": 60}, None],
        ids=["p1", "p2", "p3"],
    )
    return store


def _state(store: GPUPromptVectorStore):
    return H.index_state(store.index, np.ones(store.index.dim, dtype=np.float32)) if store.index is not None else None


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["torch", "faiss"])
@H.fast(25)
@given(data=st.data())
def test_vectorstore_add_hostile(lc_embeddings, backend: str, data: st.DataObject) -> None:
    H.count("GPUPromptVectorStore(langchain)")
    store = _store(lc_embeddings, backend)
    n = data.draw(st.integers(0, 2), label="n")
    add_texts = data.draw(st.one_of(st.lists(H.good_odd_text, min_size=n, max_size=n), texts), label="texts")
    metadatas = data.draw(
        st.one_of(st.none(), st.lists(st.one_of(st.none(), H.hostile_metadata, st.dictionaries(H.good_odd_text, H.json_values, max_size=2)), min_size=n, max_size=n), H.junk),
        label="metadatas",
    )
    ids = data.draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.sampled_from(["p1", "new"]), H.odd_text, H.junk_scalars), min_size=n, max_size=n), H.junk), label="ids")
    before = _state(store)
    ok, result = H.typed_or_ok(lambda: store.add_texts(add_texts, metadatas, ids=ids))
    if not ok:
        assert _state(store) == before, f"refused add_texts changed the store ({type(result).__name__}: {result})"
        return
    assert len(result) == len(add_texts)
    docs = store.get_by_ids(result)
    assert {d.id for d in docs} == set(result)
    # rule 10: whatever was accepted saves and loads back unchanged
    with tempfile.TemporaryDirectory() as tmp:
        store.save_local(tmp, "kb")
        loaded = GPUPromptVectorStore.load_local(tmp, lc_embeddings, "kb", device="cpu")
        assert _state(loaded) == _state(store)


@pytest.fixture(scope="module")
def shared_store(lc_embeddings):
    return _store(lc_embeddings)


@pytest.mark.timeout(180)
@H.fast(60)
@given(data=st.data())
def test_vectorstore_reads_hostile(shared_store: GPUPromptVectorStore, data: st.DataObject) -> None:
    H.count("GPUPromptVectorStore(langchain)")
    store = shared_store
    before = _state(store)
    op = data.draw(st.sampled_from(["search", "search_score", "by_vector", "mmr", "mmr_vector", "get", "delete", "asearch"]), label="op")
    query = data.draw(st.one_of(st.just("red dress"), H.good_odd_text, H.odd_text, H.junk_scalars), label="query")
    k = data.draw(ints, label="k")
    flt = data.draw(st.one_of(st.none(), H.filters, H.junk), label="filter")
    vector = data.draw(
        st.one_of(st.just([0.1] * 384), st.lists(H.junk_scalars, max_size=4), st.lists(st.sampled_from([0.0, -0.0, 1e308, math.nan, math.inf, 1e39]), min_size=384, max_size=384), H.junk),
        label="embedding",
    )
    if op == "search":
        ok, out = H.typed_or_ok(lambda: store.similarity_search(query, k=k, filter=flt))
    elif op == "search_score":
        ok, out = H.typed_or_ok(lambda: store.similarity_search_with_score(query, k=k, filter=flt))
        if ok:
            assert all(math.isfinite(s) for _, s in out)
    elif op == "asearch":
        ok, out = H.typed_or_ok(lambda: asyncio.run(store.asimilarity_search(query, k=k, filter=flt)))
    elif op == "by_vector":
        ok, out = H.typed_or_ok(lambda: store.similarity_search_with_score_by_vector(vector, k=k, filter=flt))
        if ok:
            assert all(math.isfinite(s) for _, s in out)
    elif op == "mmr":
        fetch_k = data.draw(ints, label="fetch_k")
        lam = data.draw(st.one_of(st.floats(0, 1), H.extreme_numbers, H.junk_scalars), label="lambda_mult")
        ok, out = H.typed_or_ok(lambda: store.max_marginal_relevance_search(query, k=k, fetch_k=fetch_k, lambda_mult=lam, filter=flt))
    elif op == "mmr_vector":
        fetch_k = data.draw(ints, label="fetch_k")
        lam = data.draw(st.one_of(st.floats(0, 1), H.extreme_numbers, H.junk_scalars), label="lambda_mult")
        ok, out = H.typed_or_ok(lambda: store.max_marginal_relevance_search_by_vector(vector, k=k, fetch_k=fetch_k, lambda_mult=lam, filter=flt))
    elif op == "get":
        ids = data.draw(st.one_of(st.lists(st.one_of(st.sampled_from(["p1", "zz"]), H.odd_text, H.junk_scalars), max_size=3), H.junk), label="ids")
        ok, out = H.typed_or_ok(lambda: store.get_by_ids(ids))
    else:
        ids = data.draw(st.one_of(st.lists(st.one_of(st.just("zz"), H.odd_text, H.junk_scalars), max_size=3), H.junk), label="ids")
        if ids is None:
            return  # None deletes everything, by design
        ok, out = H.typed_or_ok(lambda: store.delete(ids))
    if ok and op in ("search", "asearch", "search_score", "by_vector"):
        assert len(out) <= k
    assert _state(store) == before


VS_OPTIONS = {
    "metric": st.one_of(st.sampled_from(["cosine", "ip", "l2"]), H.junk_scalars),
    "backend": st.one_of(st.sampled_from(["auto", "faiss", "torch"]), H.junk_scalars),
    "device": st.one_of(st.just("cpu"), H.junk_scalars),
    "index_factory": st.one_of(st.none(), st.sampled_from(["Flat", "bogus"]), H.junk_scalars),
    "max_queue": ints,
    "ef_search": st.one_of(st.none(), ints),
    "nonsense": H.junk_scalars,
}


@pytest.mark.timeout(120)
@H.fast(60)
@given(data=st.data())
def test_vectorstore_constructor_hostile(lc_embeddings, data: st.DataObject) -> None:
    """Options accepted at construction must not fail the first add (rule 10)."""
    H.count("GPUPromptVectorStore(langchain)")
    options = data.draw(st.fixed_dictionaries({}, optional=VS_OPTIONS), label="options")
    embedding = data.draw(st.one_of(st.just(lc_embeddings), H.junk_scalars), label="embedding")
    options.setdefault("device", "cpu")
    ok, store = H.typed_or_ok(lambda: GPUPromptVectorStore(embedding, **options))
    if not ok:
        return
    store.add_texts(["a red dress"], [{"x": 1}], ids=["a"])
    assert [d.id for d in store.similarity_search("dress", k=1)] == ["a"]


# ---------------------------------------------------------------------------------------- LangGraph store
def _store_state(store: GPUPromptStore):
    data = {(ns, key): json.dumps(entry.item.value, sort_keys=True, default=repr) for ns, keys in store._data.items() for key, entry in keys.items()}
    index = store._vectors.index if store._vectors is not None else None
    return data, (H.index_state(index) if index is not None else None)


@pytest.fixture(scope="module")
def lg_store(lc_embeddings):
    store = GPUPromptStore(index={"embed": lc_embeddings, "fields": ["text"]}, device="cpu")
    store.put(("users", "42"), "m1", {"text": "prefers cotton dresses", "n": 1})
    store.put(("users", "42"), "m2", {"text": "lives in Oslo", "n": 2})
    return store


namespaces = st.one_of(
    st.tuples(st.sampled_from(["users", "tmp"])),
    st.lists(st.one_of(st.text(max_size=3), H.odd_text, H.junk_scalars), max_size=3).map(tuple),
    H.junk,
)
values = st.one_of(
    st.fixed_dictionaries({"text": H.good_odd_text}),
    st.fixed_dictionaries({"text": st.one_of(H.odd_text, H.junk_scalars)}),
    H.hostile_metadata,
    st.builds(lambda d: {"text": "x", "deep": d}, H.structures),
    st.dictionaries(st.text(max_size=3), st.one_of(H.extreme_numbers, H.json_values), max_size=3),
)


def _is_users(ns) -> bool:
    """Whether a drawn namespace would touch the fixture's own items (compared without ==)."""
    return isinstance(ns, tuple) and len(ns) > 0 and isinstance(ns[0], str) and ns[0] == "users"


@pytest.mark.timeout(180)
@H.fast(80)
@given(data=st.data())
def test_langgraph_store_hostile(lg_store: GPUPromptStore, data: st.DataObject) -> None:
    H.count("GPUPromptStore")
    store = lg_store
    op = data.draw(st.sampled_from(["put", "get", "search", "list", "batch-get", "batch-list", "batch-search", "batch-put"]), label="op")
    before = _store_state(store)
    ns = data.draw(namespaces, label="namespace")
    key = data.draw(st.one_of(st.just("tmpkey"), H.odd_text, H.junk_scalars), label="key")

    def call():
        if op == "put":
            value = data.draw(values, label="value")
            index = data.draw(st.one_of(st.none(), st.just(False), st.lists(st.one_of(st.just("text"), H.junk_scalars), max_size=2), H.junk_scalars), label="index")
            ttl = data.draw(st.one_of(st.none(), st.floats(0.1, 10), H.extreme_numbers, H.junk_scalars), label="ttl")
            if _is_users(ns):
                return "skip"
            return store.put(ns, key, value, index=index, ttl=ttl)
        if op == "get":
            return store.get(ns, key)
        if op == "search":
            query = data.draw(st.one_of(st.none(), st.just("cotton"), H.odd_text, H.junk_scalars), label="query")
            flt = data.draw(st.one_of(st.none(), st.just({"n": {"$gt": 1}}), H.hostile_metadata, st.builds(lambda s: {"a": s}, H.structures)), label="filter")
            limit = data.draw(ints, label="limit")
            offset = data.draw(ints, label="offset")
            return store.search(ns if isinstance(ns, tuple) else ("users",), query=query, filter=flt, limit=limit, offset=offset)
        if op == "list":
            max_depth = data.draw(st.one_of(st.none(), ints), label="max_depth")
            limit = data.draw(ints, label="limit")
            offset = data.draw(ints, label="offset")
            return store.list_namespaces(prefix=ns if isinstance(ns, tuple) else None, max_depth=max_depth, limit=limit, offset=offset)
        if op == "batch-get":
            return store.batch([GetOp(ns, key)])
        if op == "batch-list":
            return store.batch([ListNamespacesOp(match_conditions=(), max_depth=data.draw(ints), limit=data.draw(ints), offset=data.draw(ints))])
        if op == "batch-search":
            flt = data.draw(st.one_of(st.none(), H.hostile_metadata, st.builds(lambda s: {"a": s}, H.structures)), label="filter")
            return store.batch([SearchOp(ns, filter=flt, limit=data.draw(ints), offset=data.draw(ints), query=data.draw(st.one_of(st.none(), st.just("oslo"), H.junk_scalars)))])
        value = data.draw(values, label="value")
        if _is_users(ns):
            return "skip"
        return store.batch([PutOp(ns, key, value, index=data.draw(st.one_of(st.none(), st.just(False), H.junk_scalars)), ttl=data.draw(st.one_of(st.none(), H.extreme_numbers)))])

    try:
        ok, out = H.typed_or_ok(call)
    except InvalidNamespaceError:
        ok, out = False, None  # LangGraph's own check, before our code
    if op in ("put", "batch-put") and ok:
        if out == "skip":
            return
        # accepted: readable, searchable, and nothing else changed; then remove it again
        found = store.get(ns, str(key)) if op == "put" else None
        if op == "put":
            assert found is not None
        store.search(("users",), query="cotton", limit=2)
        store.batch([PutOp(tuple(ns), key if op == "batch-put" else str(key), None)])
        assert _store_state(store)[0] == before[0]
        return
    if op in ("put", "batch-put") and not ok:
        assert _store_state(store) == before
        return
    assert _store_state(store) == before


STORE_OPTIONS = {
    "index": st.one_of(st.none(), st.just(False), st.fixed_dictionaries({}, optional={"fields": st.one_of(st.lists(st.one_of(st.just("text"), H.junk_scalars), max_size=2), H.junk_scalars), "dims": H.junk_scalars}), H.junk_scalars),
    "ttl": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"default_ttl": st.one_of(st.floats(0.1, 5), H.extreme_numbers, H.junk_scalars), "refresh_on_read": H.junk_scalars}), H.junk_scalars),
    "device": st.one_of(st.just("cpu"), H.junk_scalars),
    "clock": st.one_of(st.just(lambda: 0.0), st.just(lambda: "x"), st.just(lambda: math.nan), H.junk_scalars),
}


@pytest.mark.timeout(120)
@H.fast(60)
@given(data=st.data())
def test_langgraph_store_constructor_hostile(lc_embeddings, data: st.DataObject) -> None:
    """Options accepted at construction must not break the first put / search (rule 10)."""
    H.count("GPUPromptStore")
    options = data.draw(st.fixed_dictionaries({}, optional=STORE_OPTIONS), label="options")
    if isinstance(options.get("index"), dict):
        options["index"]["embed"] = lc_embeddings
    elif options.get("index") is None:
        options["index"] = {"embed": lc_embeddings}
    options.setdefault("device", "cpu")
    ok, store = H.typed_or_ok(lambda: GPUPromptStore(**options))
    if not ok:
        return
    store.put(("a",), "k", {"text": "hello"})
    assert store.get(("a",), "k").value == {"text": "hello"}
    store.search(("a",), query="hello", limit=1)
    store.list_namespaces()


# ---------------------------------------------------------------------------------------- chat history
@pytest.fixture(scope="module")
def lc_cache(embedder):
    return ContextCache(embedder)


messages = st.one_of(
    st.lists(
        st.one_of(
            st.builds(HumanMessage, content=H.good_odd_text),
            st.builds(AIMessage, content=H.good_odd_text),
            st.builds(SystemMessage, content=H.good_odd_text),
            st.builds(HumanMessage, content=H.odd_text),
            st.builds(lambda c: ToolMessage(content=c, tool_call_id="t"), H.good_odd_text),
            st.builds(lambda: AIMessage(content="", tool_calls=[{"name": "f", "args": {}, "id": "1"}])),
            st.builds(lambda: HumanMessage(content=[{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}])),
            H.junk_scalars,
        ),
        max_size=3,
    ),
    H.junk,
)


@pytest.mark.timeout(180)
@H.fast(80)
@given(data=st.data())
def test_chat_history_hostile(lc_cache: ContextCache, data: st.DataObject) -> None:
    H.count("GPUPromptChatMessageHistory")
    session = data.draw(st.one_of(st.just("h1"), H.odd_text, H.junk_scalars, st.just("x" * 2000)), label="session_id")
    cache_arg = data.draw(st.one_of(st.just(lc_cache), H.junk_scalars), label="context_cache")
    ok, history = H.typed_or_ok(lambda: GPUPromptChatMessageHistory(session, context_cache=cache_arg))
    if not ok:
        return
    if cache_arg is None:
        history._cache = lc_cache  # never the process-wide default in this test
    before = [(s, [t.text for t in lc_cache.turns(s)]) for s in lc_cache.sessions()]
    op = data.draw(st.sampled_from(["add", "aadd", "messages", "relevant", "arelevant"]), label="op")
    if op in ("add", "aadd"):
        msgs = data.draw(messages, label="messages")
        call = (lambda: history.add_messages(msgs)) if op == "add" else (lambda: asyncio.run(history.aadd_messages(msgs)))
        ok, _ = H.typed_or_ok(call)
        if ok:
            assert len(history.messages) >= len(msgs) or len(msgs) > 1000
            history.clear()
            return
    elif op == "messages":
        ok, _ = H.typed_or_ok(lambda: history.messages)
    else:
        query = data.draw(st.one_of(st.just("dress"), H.odd_text, H.junk_scalars), label="query")
        k = data.draw(ints, label="k")
        call = (lambda: history.relevant_messages(query, k)) if op == "relevant" else (lambda: asyncio.run(history.arelevant_messages(query, k)))
        ok, out = H.typed_or_ok(call)
        if ok:
            assert len(out) <= k
    after = [(s, [t.text for t in lc_cache.turns(s)]) for s in lc_cache.sessions()]
    assert after == before


# ---------------------------------------------------------------------------------------- semantic cache
@pytest.fixture(scope="module")
def semantic_cache(lc_embeddings):
    cache = GPUPromptSemanticCache(lc_embeddings, score_threshold=0.9, device="cpu")
    cache.update("What is your return policy?", "llm-a", [Generation(text="30 days.")])
    return cache


prompts = st.one_of(
    st.just("What's your return policy?"),
    H.good_odd_text,
    H.odd_text,
    H.junk_scalars,
    st.sampled_from(['[{"kwargs": 1}]', '[{"kwargs": {"content": 5}}]', '[{"kwargs": {"content": [1, {"type": "text"}]}}]', "[" * 3000 + "]" * 3000, "[1, 2", '[{"kwargs": []}]', '[null]']),
)


def _cache_state(cache: GPUPromptSemanticCache):
    """Every entry of the core AnswerCache behind the adapter: key, namespace, generations."""
    answers = cache.answer_cache
    with answers._lock:
        return sorted((key, entry.namespace, entry.value) for key, entry in answers._entries.items())


@pytest.mark.timeout(180)
@H.fast(80)
@given(data=st.data())
def test_semantic_cache_hostile(semantic_cache: GPUPromptSemanticCache, data: st.DataObject) -> None:
    H.count("GPUPromptSemanticCache")
    cache = semantic_cache
    before = _cache_state(cache)
    op = data.draw(st.sampled_from(["lookup", "alookup", "update", "aupdate"]), label="op")
    prompt = data.draw(prompts, label="prompt")
    llm_string = data.draw(st.one_of(st.just("llm-a"), H.odd_text, H.junk_scalars), label="llm_string")
    if op in ("lookup", "alookup"):
        call = (lambda: cache.lookup(prompt, llm_string)) if op == "lookup" else (lambda: asyncio.run(cache.alookup(prompt, llm_string)))
        ok, out = H.typed_or_ok(call)
        if ok:
            assert out is None or all(isinstance(g, Generation) for g in out)
        assert _cache_state(cache) == before
        return
    return_val = data.draw(st.one_of(st.just([Generation(text="x")]), st.lists(st.one_of(st.just(Generation(text="y")), H.junk_scalars), max_size=2), H.junk), label="return_val")
    call = (lambda: cache.update(prompt, llm_string, return_val)) if op == "update" else (lambda: asyncio.run(cache.aupdate(prompt, llm_string, return_val)))
    ok, _ = H.typed_or_ok(call)
    if not ok:
        assert _cache_state(cache) == before
        return
    assert cache.lookup(prompt, llm_string) == list(return_val)
    # rule 10: the accepted entry never breaks a later similarity search of its namespace (the
    # cache keeps answers in memory only, bounded by max_entries and ttl_seconds: nothing to save)
    found = cache.lookup("a prompt about something else entirely", llm_string)
    assert found is None or all(isinstance(g, Generation) for g in found)


CACHE_OPTIONS = {
    "score_threshold": st.one_of(st.floats(-1, 1), H.extreme_numbers, H.junk_scalars),
    "device": st.one_of(st.just("cpu"), H.junk_scalars),
}


@pytest.mark.timeout(120)
@H.fast(60)
@given(data=st.data())
def test_semantic_cache_constructor_hostile(lc_embeddings, data: st.DataObject) -> None:
    H.count("GPUPromptSemanticCache")
    options = data.draw(st.fixed_dictionaries({}, optional=CACHE_OPTIONS), label="options")
    embedding = data.draw(st.one_of(st.just(lc_embeddings), H.junk_scalars.filter(lambda v: v is not None)), label="embedding")
    options.setdefault("device", "cpu")
    ok, cache = H.typed_or_ok(lambda: GPUPromptSemanticCache(embedding, **options))
    if not ok:
        return
    cache.update("hello there", "m", [Generation(text="hi")])
    assert cache.lookup("hello there", "m") == [Generation(text="hi")]
