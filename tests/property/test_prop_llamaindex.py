"""llamaindex_gpuprompt under hostile input: GPUPromptEmbedding, GPUPromptVectorStore and
GPUPromptContextMemoryBlock (the memory). A typed error or a correct answer; nothing stored
changes on a refused call; accepted fields never break a later call (rule 10)."""

from __future__ import annotations

import asyncio
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ChatMessage  # noqa: E402
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

import prop_helpers as H  # noqa: E402
from gpuprompt import ContextCache  # noqa: E402
from llamaindex_gpuprompt import GPUPromptContextMemoryBlock, GPUPromptEmbedding, GPUPromptVectorStore  # noqa: E402

DIM = 8
ints = st.one_of(st.integers(-2, 6), H.extreme_numbers, H.junk_scalars)


# ---------------------------------------------------------------------------------------- embedding
EMB_FIELDS = {
    "device": st.one_of(st.just("cpu"), H.junk_scalars),
    "normalize": st.one_of(st.booleans(), H.junk_scalars),
    "query_instruction": st.one_of(st.none(), H.good_odd_text, H.odd_text, H.junk_scalars),
    "text_instruction": st.one_of(st.none(), H.good_odd_text, H.odd_text, H.junk_scalars),
    "embedder_options": st.one_of(st.dictionaries(st.sampled_from(["batch_size", "cache_size", "bogus", "model"]), H.junk_scalars, max_size=2), H.junk_scalars),
    "embed_batch_size": ints,
}


@pytest.mark.timeout(120)
@H.fast(100)
@given(data=st.data())
def test_embedding_hostile(embedder, data: st.DataObject) -> None:
    """Constructor fields, then calls: accepted fields never break a call (rule 10)."""
    H.count("GPUPromptEmbedding")
    fields = data.draw(st.fixed_dictionaries({}, optional={k: v for k, v in EMB_FIELDS.items() if k in ("query_instruction", "text_instruction", "embed_batch_size")}), label="fields")
    ok, emb = H.typed_or_ok_lenient(lambda: GPUPromptEmbedding(embedder=embedder, **fields))
    if not ok:
        return
    text = data.draw(st.one_of(st.just("red dress"), H.good_odd_text, H.odd_text, H.junk_scalars), label="text")
    for call in (emb.get_query_embedding, emb.get_text_embedding, lambda t: asyncio.run(emb.aget_query_embedding(t))):
        ok, vec = H.typed_or_ok(lambda: call(text))
        if ok:
            assert len(vec) == embedder.dim and all(math.isfinite(x) for x in vec)
    batch = data.draw(st.one_of(st.lists(st.one_of(H.good_odd_text, H.odd_text, H.junk_scalars), max_size=3), H.junk), label="texts")
    ok, vecs = H.typed_or_ok(lambda: emb.get_text_embedding_batch(batch))
    if ok:
        assert len(vecs) == len(batch)


@pytest.mark.timeout(60)
@H.fast(120)
@given(data=st.data())
def test_embedding_constructor_hostile(data: st.DataObject) -> None:
    H.count("GPUPromptEmbedding")
    fields = data.draw(st.fixed_dictionaries({}, optional=EMB_FIELDS), label="fields")
    model_name = data.draw(st.one_of(st.just("sentence-transformers/all-MiniLM-L6-v2"), H.junk_scalars), label="model_name")
    embedder = data.draw(st.one_of(st.none(), H.junk_scalars), label="embedder")
    H.typed_or_ok(lambda: GPUPromptEmbedding(model_name, embedder=embedder, **fields))


# ---------------------------------------------------------------------------------------- vector store
def _node(i: int, metadata=None, embedding=None, node_id=None) -> TextNode:
    node = TextNode(
        id_=node_id or f"n{i}",
        text=f"node {i} \u00e9",
        metadata={"i": i, "kind": "even" if i % 2 == 0 else "odd"} if metadata is None else metadata,
        embedding=embedding if embedding is not None else list(np.random.default_rng(i).standard_normal(DIM).astype(float)),
    )
    node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=f"doc{i % 2}")
    return node


def _li_store(backend: str = "torch") -> GPUPromptVectorStore:
    store = GPUPromptVectorStore(backend=backend, device="cpu")
    store.add([_node(i) for i in range(4)])
    return store


def _state(store: GPUPromptVectorStore):
    return H.index_state(store.client) if store.client is not None else None


node_metadata = st.one_of(
    st.dictionaries(H.good_odd_text, H.json_values, max_size=3),
    st.dictionaries(st.text(max_size=3), st.one_of(H.extreme_numbers, H.json_values), max_size=2),
    st.builds(lambda d: {"deep": d}, st.integers(30, 60).map(H.deep_dict)),
    st.just({"_llamaindex_node": 1}),
    st.dictionaries(st.sampled_from(["\ud800", "a"]), st.sampled_from(["\udfff", "ok"]), max_size=2),
)
embeddings = st.one_of(
    st.none(),
    st.lists(st.floats(-1, 1), min_size=DIM, max_size=DIM),
    st.lists(st.sampled_from([math.nan, math.inf, 1e308, -0.0, 1e39, 0.0]), min_size=DIM, max_size=DIM),
    st.lists(st.floats(-1, 1), min_size=0, max_size=DIM + 2),
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["torch", "faiss"])
@H.fast(30)
@given(data=st.data())
def test_vector_store_add_hostile(backend: str, data: st.DataObject) -> None:
    H.count("GPUPromptVectorStore(llamaindex)")
    store = _li_store(backend)
    specs = data.draw(st.lists(st.tuples(node_metadata, embeddings, st.one_of(st.none(), st.sampled_from(["n1", "dup"]), H.good_odd_text.filter(bool))), max_size=3), label="nodes")
    nodes = []
    for i, (metadata, embedding, node_id) in enumerate(specs):
        try:
            nodes.append(_node(10 + i, metadata, embedding if embedding is not None else None, node_id))
        except (ValueError, TypeError):
            pass  # LlamaIndex's own TextNode refused it: nothing reaches the store
        if embedding is None and nodes:
            nodes[-1].embedding = None
    extra = data.draw(st.one_of(st.just(None), H.junk_scalars), label="extra")
    arg = nodes if extra is None else (nodes + [extra] if data.draw(st.booleans(), label="append_junk") else extra)
    before = _state(store)
    ok, ids = H.typed_or_ok(lambda: store.add(arg))
    if not ok:
        assert _state(store) == before, f"refused add changed the store ({type(ids).__name__}: {ids})"
        return
    got = store.get_nodes(ids)
    assert [n.node_id for n in got] == [i for i in ids if i in {n.node_id for n in got}]
    with tempfile.TemporaryDirectory() as tmp:
        store.persist(str(Path(tmp) / "vs"))
        loaded = GPUPromptVectorStore.from_persist_path(str(Path(tmp) / "vs"), device="cpu")
        assert _state(loaded) == _state(store)


@pytest.fixture(scope="module")
def li_store():
    return _li_store()


li_filters = st.recursive(
    st.builds(
        lambda k, v, op: MetadataFilter.model_construct(key=k, value=v, operator=op),
        st.one_of(st.sampled_from(["i", "kind", "$bad", ""]), H.odd_text),
        st.one_of(st.sampled_from([1, 2.5, "even", ["a"], [1, 2], None, [], math.nan, 10**400]), H.junk_scalars),
        st.sampled_from(list(FilterOperator)),
    ),
    lambda inner: st.builds(
        lambda fs, c: MetadataFilters.model_construct(filters=fs, condition=c),
        st.lists(st.one_of(inner, H.junk_scalars), max_size=3),
        st.one_of(st.sampled_from(list(FilterCondition)), st.none()),
    ),
    max_leaves=5,
)


@pytest.mark.timeout(180)
@H.fast(70)
@given(data=st.data())
def test_vector_store_query_hostile(li_store: GPUPromptVectorStore, data: st.DataObject) -> None:
    H.count("GPUPromptVectorStore(llamaindex)")
    store = li_store
    before = _state(store)
    query = VectorStoreQuery(
        query_embedding=data.draw(st.one_of(embeddings, st.lists(H.junk_scalars, max_size=3), H.junk_scalars, st.just([[1.0] * DIM, [2.0]])), label="query_embedding"),
        similarity_top_k=data.draw(ints, label="similarity_top_k"),
        doc_ids=data.draw(st.one_of(st.none(), st.lists(st.one_of(st.just("doc0"), H.junk_scalars), max_size=2), H.junk_scalars), label="doc_ids"),
        node_ids=data.draw(st.one_of(st.none(), st.lists(st.one_of(st.just("n1"), H.junk_scalars), max_size=2), H.junk_scalars), label="node_ids"),
        mode=data.draw(st.one_of(st.sampled_from([VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.MMR, VectorStoreQueryMode.HYBRID]), H.junk_scalars), label="mode"),
        filters=data.draw(st.one_of(st.none(), li_filters, H.junk_scalars), label="filters"),
        mmr_threshold=data.draw(st.one_of(st.none(), st.floats(0, 1), H.extreme_numbers, H.junk_scalars), label="mmr_threshold"),
    )
    kwargs = data.draw(
        st.fixed_dictionaries({}, optional={"mmr_prefetch_factor": st.one_of(st.floats(1, 10), H.extreme_numbers, H.junk_scalars), "mmr_prefetch_k": st.one_of(st.integers(1, 30), H.extreme_numbers, H.junk_scalars), "filter": st.one_of(H.filters, H.junk)}),
        label="kwargs",
    )
    use_async = data.draw(st.booleans(), label="async")
    call = (lambda: asyncio.run(store.aquery(query, **kwargs))) if use_async else (lambda: store.query(query, **kwargs))
    ok, result = H.typed_or_ok(call)
    if ok:
        assert len(result.ids) == len(result.nodes) == len(result.similarities)
        assert all(math.isfinite(s) for s in result.similarities)
        assert len(result.ids) <= query.similarity_top_k
    assert _state(store) == before


@pytest.mark.timeout(180)
@H.fast(80)
@given(data=st.data())
def test_vector_store_delete_get_hostile(data: st.DataObject) -> None:
    H.count("GPUPromptVectorStore(llamaindex)")
    store = _li_store()
    before = _state(store)
    op = data.draw(st.sampled_from(["delete", "delete_nodes", "get_nodes"]), label="op")
    if op == "delete":
        ref = data.draw(st.one_of(st.just("doc0"), H.odd_text, H.junk_scalars), label="ref_doc_id")
        ok, _ = H.typed_or_ok(lambda: store.delete(ref))
        if ok:
            gone = {n.node_id for n in [_node(i) for i in range(4)] if n.ref_doc_id == ref}
            assert set(store.client.ids()) == {f"n{i}" for i in range(4)} - gone
            return
    else:
        node_ids = data.draw(st.one_of(st.none(), st.lists(st.one_of(st.sampled_from(["n1", "zz"]), H.odd_text, H.junk_scalars), max_size=3), H.junk), label="node_ids")
        filters = data.draw(st.one_of(st.none(), li_filters, H.junk_scalars), label="filters")
        if op == "get_nodes":
            ok, nodes = H.typed_or_ok(lambda: store.get_nodes(node_ids, filters))
        else:
            if node_ids is None and filters is None:
                return  # deletes everything, by design
            ok, _ = H.typed_or_ok(lambda: store.delete_nodes(node_ids, filters))
            if ok:
                return
    assert _state(store) == before


VS_FIELDS = {
    "dim": st.one_of(st.none(), ints),
    "metric": st.one_of(st.sampled_from(["cosine", "ip", "l2"]), H.junk_scalars),
    "backend": st.one_of(st.sampled_from(["auto", "faiss", "torch"]), H.junk_scalars),
    "device": st.one_of(st.just("cpu"), H.junk_scalars),
    "index_options": st.one_of(st.dictionaries(st.sampled_from(["index_factory", "max_queue", "bogus", "metric"]), H.junk_scalars, max_size=2), H.junk_scalars),
    "mmr_prefetch_factor": st.one_of(st.floats(1, 10), H.extreme_numbers, H.junk_scalars),
}


@pytest.mark.timeout(120)
@H.fast(80)
@given(data=st.data())
def test_vector_store_constructor_hostile(data: st.DataObject) -> None:
    """Fields accepted at construction must not fail the first add / query (rule 10)."""
    H.count("GPUPromptVectorStore(llamaindex)")
    fields = data.draw(st.fixed_dictionaries({}, optional=VS_FIELDS), label="fields")
    fields.setdefault("device", "cpu")
    ok, store = H.typed_or_ok_lenient(lambda: GPUPromptVectorStore(**fields))
    if not ok:
        return
    dim = store.dim or DIM
    node = TextNode(id_="a", text="x", embedding=[1.0] * dim)
    store.add([node])
    for mode in (VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.MMR):
        result = store.query(VectorStoreQuery(query_embedding=[1.0] * dim, similarity_top_k=1, mode=mode))
        assert result.ids == ["a"]


# ---------------------------------------------------------------------------------------- memory block
MEM_FIELDS = {
    "name": st.one_of(st.just("Rel"), H.odd_text, H.junk_scalars),
    "max_turns": ints,
    "max_tokens": st.one_of(st.none(), ints),
    "recent": ints,
    "query_messages": ints,
    # (never a width that would really allocate: "{role:>99999999999}" fails at once with MemoryError)
    "turn_template": st.one_of(st.just("{role}: {text}"), st.sampled_from(["{x}", "{", "{0}", "{role.__class__}", "{text!z}", "{role:>99999999999}"]), H.odd_text, H.junk_scalars),
    "default_session_id": st.one_of(st.just("default"), st.just(""), H.odd_text, H.junk_scalars, st.just("x" * 2000)),
}


@pytest.mark.timeout(180)
@H.fast(40)
@given(data=st.data())
def test_memory_block_hostile(embedder, data: st.DataObject) -> None:
    """Accepted fields never break a later put / get (rule 10); each call is typed or correct."""
    H.count("GPUPromptContextMemoryBlock")
    cache = ContextCache(embedder)
    fields = data.draw(st.fixed_dictionaries({}, optional=MEM_FIELDS), label="fields")
    ok, block = H.typed_or_ok_lenient(lambda: GPUPromptContextMemoryBlock(context_cache=cache, **fields))
    if not ok:
        return
    asyncio.run(block.aput([ChatMessage(role="user", content="I like red dresses"), ChatMessage(role="assistant", content="Noted!")]))
    text = asyncio.run(block.aget([ChatMessage(role="user", content="what do I like?")]))
    assert isinstance(text, str)
    messages = data.draw(
        st.lists(
            st.one_of(
                st.builds(lambda r, c: ChatMessage(role=r, content=c), st.sampled_from(["user", "assistant", "system", "tool", "developer", "model"]), st.one_of(H.good_odd_text, H.odd_text)),
                st.builds(lambda c, s: ChatMessage(role="user", content=c, additional_kwargs={"session_id": s}), H.good_odd_text, st.one_of(H.odd_text, H.junk_scalars)),
            ),
            max_size=3,
        ),
        label="messages",
    )
    before = [(s, [t.text for t in cache.turns(s)]) for s in cache.sessions()]
    ok, _ = H.typed_or_ok(lambda: asyncio.run(block.aput(messages)))
    if not ok:
        assert [(s, [t.text for t in cache.turns(s)]) for s in cache.sessions()] == before
    ok, text = H.typed_or_ok(lambda: asyncio.run(block.aget(messages)))
    if ok:
        assert isinstance(text, str)


@pytest.mark.timeout(60)
@H.fast(150)
@given(data=st.data())
def test_fields_refused_with_typed_errors(data: st.DataObject) -> None:
    """Bad field values of the three classes are refused with a GPUPromptError (a
    ConfigurationError), not pydantic's ValidationError; constructing loads nothing."""
    cls, fields = data.draw(
        st.one_of(
            st.tuples(st.just(GPUPromptVectorStore), st.fixed_dictionaries({}, optional=VS_FIELDS)),
            st.tuples(st.just(GPUPromptContextMemoryBlock), st.fixed_dictionaries({}, optional=MEM_FIELDS)),
            st.tuples(st.just(GPUPromptEmbedding), st.fixed_dictionaries({}, optional=EMB_FIELDS)),
        ),
        label="class and fields",
    )
    name = cls.__name__ + ("(llamaindex)" if cls is GPUPromptVectorStore else "")
    H.count(name)
    H.typed_or_ok(lambda: cls(**fields))
