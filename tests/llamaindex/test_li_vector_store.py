"""GPUPromptVectorStore contract: nodes kept whole, deletes, every filter operator and nesting,
id restrictions, MMR, async, persistence, typed errors that change nothing stored."""

from __future__ import annotations

import asyncio
import json
import os

import numpy as np
import pytest
from llama_index.core.schema import IndexNode, NodeRelationship, TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from gpuprompt.errors import (
    ConfigurationError,
    DimensionMismatchError,
    FilterError,
    InputTypeError,
    InvalidInputError,
    SnapshotError,
)
from gpuprompt.index.filters import matches
from llamaindex_gpuprompt import GPUPromptVectorStore, to_core_filter

F = MetadataFilter
OP = FilterOperator


@pytest.fixture
def nodes(catalogue_nodes):
    return catalogue_nodes()


@pytest.fixture
def store(nodes):
    store = GPUPromptVectorStore()
    store.add(nodes)
    return store


def _query(li_embed, text: str, k: int = 5, **fields) -> VectorStoreQuery:
    return VectorStoreQuery(query_embedding=li_embed.get_query_embedding(text), similarity_top_k=k, **fields)


def _cosine(nodes, vector) -> dict[str, float]:
    matrix = np.asarray([n.embedding for n in nodes])
    q = np.asarray(vector)
    sims = matrix @ q / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(q))
    return {n.node_id: float(s) for n, s in zip(nodes, sims)}


# ---------------------------------------------------------------------------------------- storage
def test_nodes_are_kept_whole(store, nodes) -> None:
    assert store.stores_text is True
    assert len(store.client) == 60
    wanted = [nodes[7].node_id, nodes[3].node_id, "missing-id"]
    got = store.get_nodes(wanted)
    assert [n.node_id for n in got] == wanted[:2]
    for original, loaded in zip([nodes[7], nodes[3]], got):
        assert isinstance(loaded, TextNode)
        assert loaded.text == original.text
        assert loaded.metadata == original.metadata
        assert loaded.ref_doc_id == original.ref_doc_id
        assert loaded.relationships == original.relationships
        assert loaded.hash == original.hash
        assert loaded.embedding is None


def test_node_types_and_excluded_keys_survive(li_embed) -> None:
    vector = li_embed.get_text_embedding("summary of dresses")
    index_node = IndexNode(text="summary of dresses", index_id="dress-index", id_="idx", embedding=vector,
                           metadata={"kind": "summary"}, excluded_llm_metadata_keys=["kind"])
    store = GPUPromptVectorStore()
    store.add([index_node])
    [loaded] = store.get_nodes(["idx"])
    assert isinstance(loaded, IndexNode)
    assert loaded.index_id == "dress-index"
    assert loaded.excluded_llm_metadata_keys == ["kind"]


def test_add_is_an_upsert(store, nodes) -> None:
    changed = nodes[0].model_copy(update={"text": "Renamed product", "metadata": {"type": "renamed"}})
    store.add([changed])
    assert len(store.client) == 60
    [loaded] = store.get_nodes([nodes[0].node_id])
    assert loaded.text == "Renamed product"
    assert loaded.metadata == {"type": "renamed"}


def test_rejected_adds_store_nothing(store, nodes) -> None:
    fresh = [TextNode(text="new", id_="new-1", embedding=nodes[0].embedding), TextNode(text="no vector", id_="new-2")]
    with pytest.raises(InvalidInputError, match=r"'nodes\[1\]' \(id 'new-2'\) has no embedding"):
        store.add(fresh)
    short = TextNode(text="short", id_="new-3", embedding=[0.1, 0.2])
    with pytest.raises(DimensionMismatchError, match="must have 384 dimensions") as info:
        store.add([fresh[0], short])
    assert (info.value.expected, info.value.got) == (384, 2)
    with pytest.raises(InvalidInputError, match="distinct ids"):
        store.add([fresh[0], fresh[0]])
    reserved = TextNode(text="x", id_="new-4", embedding=nodes[0].embedding, metadata={"_llamaindex_node": 1})
    with pytest.raises(InvalidInputError, match="reserved key"):
        store.add([reserved])
    with pytest.raises(InputTypeError, match=r"'nodes\[0\]' must be a LlamaIndex node"):
        store.add([{"text": "dict"}])
    assert len(store.client) == 60
    assert store.get_nodes(["new-1"]) == []


def test_delete_by_ref_doc_id_removes_every_node_of_the_document(store, nodes) -> None:
    doc = nodes[0].ref_doc_id
    members = {n.node_id for n in nodes if n.ref_doc_id == doc}
    assert len(members) == 6
    store.delete(doc)
    assert len(store.client) == 54
    assert not members & set(store.client.ids())
    store.delete("no-such-document")
    assert len(store.client) == 54
    with pytest.raises(InputTypeError, match="'ref_doc_id' must be a str"):
        store.delete(None)


def test_delete_nodes_by_ids_filters_and_both(store, nodes) -> None:
    store.delete_nodes([nodes[0].node_id, nodes[1].node_id])
    assert len(store.client) == 58
    cheap = MetadataFilters(filters=[F(key="price", value=60, operator=OP.LT)])
    expected = {n.node_id for n in nodes[2:] if n.metadata["price"] < 60}
    store.delete_nodes(filters=cheap)
    assert len(store.client) == 58 - len(expected)
    assert not expected & set(store.client.ids())
    dresses = MetadataFilters(filters=[F(key="type", value="dress")])
    dress_ids = [n.node_id for n in store.get_nodes(filters=dresses)]
    store.delete_nodes(node_ids=[dress_ids[0], nodes[5].node_id], filters=dresses)  # only the dress goes
    assert dress_ids[0] not in store.client.ids()
    assert nodes[5].node_id in store.client.ids() or nodes[5].metadata["price"] < 60
    store.delete_nodes()  # like SimpleVectorStore: no restriction means every node
    assert len(store.client) == 0


def test_get_nodes_with_filters(store, nodes) -> None:
    filters = MetadataFilters(filters=[F(key="type", value="coat"), F(key="price", value=100, operator=OP.GTE)])
    expected = [n.node_id for n in nodes if n.metadata["type"] == "coat" and n.metadata["price"] >= 100]
    assert expected
    assert sorted(n.node_id for n in store.get_nodes(filters=filters)) == sorted(expected)
    subset = [nodes[i].node_id for i in range(10)]
    both = store.get_nodes(subset, filters=MetadataFilters(filters=[F(key="type", value="coat")]))
    assert [n.node_id for n in both] == [i for i in subset if i in {n.node_id for n in nodes if n.metadata["type"] == "coat"}]
    assert len(store.get_nodes()) == 60
    assert store.get_nodes([]) == []


def test_clear(store, li_embed) -> None:
    store.clear()
    assert len(store.client) == 0
    assert store.query(_query(li_embed, "dress")).ids == []
    assert store.get_nodes() == []


# ---------------------------------------------------------------------------------------- queries
def test_query_returns_top_k_cosine_similarities_best_first(store, nodes, li_embed) -> None:
    query = _query(li_embed, "a red cotton dress for a summer wedding", k=5)
    result = store.query(query)
    cosines = _cosine(nodes, query.query_embedding)
    expected = sorted(cosines, key=cosines.get, reverse=True)[:5]
    assert result.ids == expected
    np.testing.assert_allclose(result.similarities, [cosines[i] for i in expected], atol=1e-5)
    assert result.similarities == sorted(result.similarities, reverse=True)
    assert [n.node_id for n in result.nodes] == expected
    assert result.nodes[0].text == next(n.text for n in nodes if n.node_id == expected[0])
    assert len(store.query(_query(li_embed, "dress", k=500)).ids) == 60
    assert store.query(_query(li_embed, "dress", k=0)).ids == []


def test_similarities_are_higher_is_better_for_every_metric(nodes, li_embed) -> None:
    query = _query(li_embed, "warm wool sweater", k=4)
    cosine = GPUPromptVectorStore(metric="cosine")
    l2 = GPUPromptVectorStore(metric="l2")
    cosine.add(nodes)
    l2.add(nodes)
    a, b = cosine.query(query), l2.query(query)
    assert a.ids == b.ids  # normalised vectors: the same ranking
    assert all(0 < s <= 1 for s in b.similarities)
    assert b.similarities == sorted(b.similarities, reverse=True)


FILTER_CASES = [
    MetadataFilters(filters=[F(key="type", value="dress")]),
    MetadataFilters(filters=[F(key="type", value="dress", operator=OP.NE)]),
    MetadataFilters(filters=[F(key="price", value=200, operator=OP.GT)]),
    MetadataFilters(filters=[F(key="price", value=200, operator=OP.GTE)]),
    MetadataFilters(filters=[F(key="price", value=40, operator=OP.LT)]),
    MetadataFilters(filters=[F(key="price", value=40, operator=OP.LTE)]),
    MetadataFilters(filters=[F(key="colour", value=["red", "teal"], operator=OP.IN)]),
    MetadataFilters(filters=[F(key="colour", value=["red", "teal"], operator=OP.NIN)]),
    MetadataFilters(filters=[F(key="tags", value=["sale", "silk"], operator=OP.ANY)]),
    MetadataFilters(filters=[F(key="tags", value=["sale", "cotton"], operator=OP.ALL)]),
    MetadataFilters(filters=[F(key="wash", value="40 C", operator=OP.TEXT_MATCH)]),
    MetadataFilters(filters=[F(key="wash", value="HAND", operator=OP.TEXT_MATCH_INSENSITIVE)]),
    MetadataFilters(filters=[F(key="tags", value="wool", operator=OP.CONTAINS)]),
    MetadataFilters(filters=[F(key="rating", value=None, operator=OP.IS_EMPTY)]),
    MetadataFilters(filters=[F(key="note", value=None, operator=OP.IS_EMPTY)]),
    MetadataFilters(filters=[F(key="type", value="dress"), F(key="price", value=100, operator=OP.LT)]),
    MetadataFilters(
        filters=[F(key="type", value="coat"), F(key="material", value="wool")], condition=FilterCondition.OR
    ),
    MetadataFilters(
        filters=[F(key="type", value="coat"), F(key="price", value=100, operator=OP.LT)], condition=FilterCondition.NOT
    ),
    MetadataFilters(
        filters=[
            MetadataFilters(filters=[F(key="type", value="dress"), F(key="colour", value="red")]),
            MetadataFilters(
                filters=[F(key="rating", value=4.0, operator=OP.GTE), F(key="price", value=50, operator=OP.LT)],
                condition=FilterCondition.OR,
            ),
        ],
        condition=FilterCondition.OR,
    ),
]


@pytest.mark.parametrize("filters", FILTER_CASES, ids=lambda f: json.dumps(to_core_filter(f))[:60])
async def test_filtered_queries_return_only_matches_and_never_come_back_short(store, nodes, li_embed, filters) -> None:
    core = to_core_filter(filters)
    matching = {n.node_id for n in nodes if matches(core, n.metadata)}
    assert 0 < len(matching) < 60
    query = _query(li_embed, "a comfortable item to wear", k=8, filters=filters)
    result = store.query(query)
    assert set(result.ids) <= matching
    assert len(result.ids) == min(8, len(matching))  # pre-filtered: k hits whenever k match
    cosines = _cosine([n for n in nodes if n.node_id in matching], query.query_embedding)
    assert result.ids == sorted(cosines, key=cosines.get, reverse=True)[:8]
    assert (await store.aquery(query)).ids == result.ids


def test_node_ids_and_doc_ids_restrict_and_empty_lists_do_not(store, nodes, li_embed) -> None:
    some = [nodes[i].node_id for i in (4, 9, 13, 21)]
    assert set(store.query(_query(li_embed, "jeans", k=10, node_ids=some)).ids) == set(some)
    docs = ["doc-coat", "doc-skirt"]
    result = store.query(_query(li_embed, "jeans", k=20, doc_ids=docs))
    assert {n.ref_doc_id for n in result.nodes} == set(docs)
    assert len(result.ids) == 12
    unrestricted = store.query(_query(li_embed, "jeans", k=3))
    assert store.query(_query(li_embed, "jeans", k=3, node_ids=[], doc_ids=[])).ids == unrestricted.ids
    both = store.query(
        _query(li_embed, "jeans", k=10, doc_ids=["doc-coat"], filters=MetadataFilters(filters=[F(key="price", value=100, operator=OP.LT)]))
    )
    assert all(n.ref_doc_id == "doc-coat" and n.metadata["price"] < 100 for n in both.nodes)


def test_mmr_trades_relevance_for_diversity(li_embed) -> None:
    texts = [
        "red cotton summer dress",
        "red cotton summer dress, short sleeves",
        "a red cotton dress for summer",
        "waterproof hiking boots",
        "navy wool winter coat",
        "green silk evening gown",
    ]
    vectors = li_embed.get_text_embedding_batch(texts)
    store = GPUPromptVectorStore()
    store.add([TextNode(text=t, id_=f"m{i}", embedding=v) for i, (t, v) in enumerate(zip(texts, vectors))])
    plain = store.query(_query(li_embed, "red summer dress", k=3))
    assert set(plain.ids) == {"m0", "m1", "m2"}
    relevance_only = store.query(_query(li_embed, "red summer dress", k=3, mode=VectorStoreQueryMode.MMR, mmr_threshold=1.0))
    assert relevance_only.ids == plain.ids
    diverse = store.query(_query(li_embed, "red summer dress", k=3, mode=VectorStoreQueryMode.MMR, mmr_threshold=0.3))
    assert diverse.ids[0] == plain.ids[0]
    assert len(set(diverse.ids) & {"m0", "m1", "m2"}) < 3
    via_kwargs = store.query(_query(li_embed, "red summer dress", k=3, mode=VectorStoreQueryMode.MMR), mmr_threshold=0.3)
    assert via_kwargs.ids == diverse.ids


async def test_async_mmr_and_filters(store, li_embed) -> None:
    query = _query(li_embed, "linen shirt", k=4, mode=VectorStoreQueryMode.MMR, mmr_threshold=0.5,
                   filters=MetadataFilters(filters=[F(key="type", value="shirt")]))
    result = await store.aquery(query)
    assert result.ids == store.query(query).ids
    assert len(result.ids) == 4 and all(n.metadata["type"] == "shirt" for n in result.nodes)


async def test_concurrent_aqueries_are_coalesced_into_batched_searches(store, li_embed) -> None:
    questions = [f"question {i}: a {c} item" for i, c in enumerate(["red", "navy", "olive", "teal"] * 4)]
    vectors = await li_embed.aget_text_embedding_batch(questions)
    await store.aquery(VectorStoreQuery(query_embedding=vectors[0], similarity_top_k=3))  # start the worker
    before = store.client.stats().batcher
    queries = [VectorStoreQuery(query_embedding=v, similarity_top_k=3) for v in vectors]
    results = await asyncio.gather(*(store.aquery(q) for q in queries))
    after = store.client.stats().batcher
    assert [r.ids for r in results] == [store.query(q).ids for q in queries]
    # 16 concurrent searches ran as fewer backend batches than calls.
    assert after.batches - before.batches < 16
    assert after.max_batch_size > 1


async def test_async_writes(nodes, li_embed) -> None:
    store = GPUPromptVectorStore()
    assert await store.async_add(nodes) == [n.node_id for n in nodes]
    assert len(await store.aget_nodes(filters=MetadataFilters(filters=[F(key="type", value="hoodie")]))) == 6
    await store.adelete("doc-hoodie")
    await store.adelete_nodes([nodes[0].node_id])
    assert len(store.client) == 53
    await store.aclear()
    assert len(store.client) == 0


def test_bad_queries_raise_typed_errors(store, li_embed) -> None:
    with pytest.raises(InvalidInputError, match="'query.query_embedding' must be a list of floats"):
        store.query(VectorStoreQuery(query_str="dress", similarity_top_k=2))
    with pytest.raises(DimensionMismatchError, match="must have 384 dimensions"):
        store.query(VectorStoreQuery(query_embedding=[0.1] * 10, similarity_top_k=2))
    with pytest.raises(InvalidInputError, match="'query.mode' must be one of 'default', 'mmr', 'hybrid', 'text_search'"):
        store.query(_query(li_embed, "dress", mode=VectorStoreQueryMode.SPARSE))
    with pytest.raises(InvalidInputError, match="'query.similarity_top_k' must be an int >= 0"):
        store.query(_query(li_embed, "dress", k=-1))
    with pytest.raises(InputTypeError, match="'query.node_ids' must be None or a list of str"):
        store.query(_query(li_embed, "dress", node_ids="P000001"))
    with pytest.raises(FilterError, match="IN filter must be a list"):
        store.query(_query(li_embed, "dress", filters=MetadataFilters(filters=[F(key="type", value="dress", operator=OP.IN)])))
    with pytest.raises(InvalidInputError, match="'mmr_threshold' must be a finite number >= 0.0 and <= 1.0"):
        store.query(_query(li_embed, "dress", mode=VectorStoreQueryMode.MMR, mmr_threshold=2.0))
    with pytest.raises(ConfigurationError, match="'index' must be a gpuprompt.VectorIndex"):
        GPUPromptVectorStore(index="nope")


# ---------------------------------------------------------------------------------------- persistence
def test_persist_and_reload_round_trip(store, nodes, li_embed, tmp_path) -> None:
    path = tmp_path / "storage" / "default__vector_store.json"
    store.persist(str(path))
    loaded = GPUPromptVectorStore.from_persist_dir(str(tmp_path / "storage"))
    assert len(loaded.client) == 60 and loaded.dim == 384 and loaded.metric == "cosine"
    query = _query(li_embed, "black wool coat", k=6, filters=MetadataFilters(filters=[F(key="price", value=150, operator=OP.LT)]))
    assert loaded.query(query).ids == store.query(query).ids
    [again] = loaded.get_nodes([nodes[11].node_id])
    assert again.relationships == nodes[11].relationships and again.metadata == nodes[11].metadata
    loaded.delete("doc-dress")
    assert len(loaded.client) == 54
    # The snapshot is JSON and numpy files, never pickle.
    assert not any(name.endswith((".pkl", ".pickle")) for name in os.listdir(path))


def test_tampered_or_missing_snapshots_are_refused(store, tmp_path) -> None:
    path = tmp_path / "vs"
    store.persist(str(path))
    records = path / "records.jsonl"
    records.write_text(records.read_text().replace("dress", "dross", 1))
    with pytest.raises(SnapshotError):
        GPUPromptVectorStore.from_persist_path(str(path))
    with pytest.raises(SnapshotError):
        GPUPromptVectorStore.from_persist_path(str(tmp_path / "nothing-here"))


def test_a_store_that_never_got_a_node_persists_and_comes_back_empty(nodes, li_embed, tmp_path) -> None:
    """An index built from no documents, persisted (StorageContext.persist), reloaded, filled, persisted
    again: as SimpleVectorStore allows. Before, the first persist raised (no dimension, no snapshot)."""
    from llama_index.core import StorageContext, VectorStoreIndex

    storage = StorageContext.from_defaults(vector_store=GPUPromptVectorStore(metric="ip"))
    VectorStoreIndex([], storage_context=storage, embed_model=li_embed)
    storage.persist(str(tmp_path / "kb"))
    empty = GPUPromptVectorStore.from_persist_dir(str(tmp_path / "kb"))
    assert empty.client is None and empty.dim is None and empty.metric == "ip"
    empty.add(nodes[:5])
    empty.persist(str(tmp_path / "kb" / "default__vector_store.json"))  # the snapshot takes the record's place
    again = GPUPromptVectorStore.from_persist_dir(str(tmp_path / "kb"))
    assert len(again.client) == 5 and again.metric == "ip"
    with pytest.raises(InvalidInputError, match="already holds something else"):  # never over a snapshot
        GPUPromptVectorStore().persist(str(tmp_path / "kb" / "default__vector_store.json"))
    assert len(GPUPromptVectorStore.from_persist_dir(str(tmp_path / "kb")).client) == 5


def test_persist_edge_cases(tmp_path) -> None:
    GPUPromptVectorStore().persist(str(tmp_path / "empty"))
    assert GPUPromptVectorStore.from_persist_path(str(tmp_path / "empty")).client is None
    GPUPromptVectorStore(dim=8).persist(str(tmp_path / "empty-with-dim"))
    assert len(GPUPromptVectorStore.from_persist_path(str(tmp_path / "empty-with-dim")).client) == 0

    class RemoteFS:
        protocol = ("s3", "s3a")

    with pytest.raises(ConfigurationError, match="local fsspec filesystem"):
        GPUPromptVectorStore(dim=8).persist(str(tmp_path / "x"), fs=RemoteFS())


def test_wraps_an_existing_core_index(nodes, li_embed) -> None:
    from gpuprompt import VectorIndex

    index = VectorIndex(384, metric="ip")
    store = GPUPromptVectorStore(index=index)
    assert store.metric == "ip" and store.dim == 384 and store.client is index
    store.add(nodes[:5])
    assert len(index) == 5
    assert store.query(_query(li_embed, "dress", k=2)).nodes[0].relationships[NodeRelationship.SOURCE]
    # what would configure a new index is refused next to one used as it is, never ignored
    for options, match in [({"metric": "cosine"}, "'metric' is 'cosine' but the given index uses 'ip'"),
                           ({"dim": 8}, "'dim' is 8 but the given index uses 384"),
                           ({"backend": "faiss"}, "'backend' configure a new index"),
                           ({"index_options": {"index_factory": "HNSW32"}}, "'index_options' configure a new index")]:
        with pytest.raises(ConfigurationError, match=match):
            GPUPromptVectorStore(index=index, **options)


@pytest.mark.parametrize("alpha", [2.0, -0.1, float("nan"), True])
def test_a_bad_alpha_is_refused_even_when_nothing_would_be_searched(alpha) -> None:
    """An empty store, or similarity_top_k=0, must not hide a bad ``alpha`` (the search would refuse it)."""
    store = GPUPromptVectorStore()
    for top_k in (0, 3):
        query = VectorStoreQuery(query_str="red", mode=VectorStoreQueryMode.HYBRID, alpha=alpha, similarity_top_k=top_k,
                                 query_embedding=[0.1] * 8)
        with pytest.raises(InvalidInputError, match="alpha"):
            store.query(query)
