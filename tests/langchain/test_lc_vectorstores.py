"""GPUPromptVectorStore with GPUPromptEmbeddings (the device path): search, filters, MMR, retrievers,
persistence without pickle, coalesced concurrent searches and bad input."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from langchain_core.documents import Document

from gpuprompt.errors import ConfigurationError, FilterError, InputTypeError, InvalidInputError, SnapshotError
from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptVectorStore

CATALOGUE = [
    Document(id="p1", page_content="Red cotton summer dress with short sleeves", metadata={"color": "red", "price": 49, "tags": ["dress", "summer"]}),
    Document(id="p2", page_content="Blue denim jeans, slim fit", metadata={"color": "blue", "price": 79, "tags": ["trousers"]}),
    Document(id="p3", page_content="Red leather ankle boots", metadata={"color": "red", "price": 129, "tags": ["shoes"]}),
    Document(id="p4", page_content="Green wool winter scarf", metadata={"color": "green", "price": 25, "tags": ["winter"]}),
    Document(id="p5", page_content="White running shoes with cushioned soles", metadata={"color": "white", "price": 99, "tags": ["shoes", "sport"]}),
    Document(id="p6", page_content="Return policy: items can be returned within 30 days", metadata={"kind": "policy"}),
]


@pytest.fixture()
def store(lc_embeddings: GPUPromptEmbeddings) -> GPUPromptVectorStore:
    store = GPUPromptVectorStore(lc_embeddings)
    store.add_documents(CATALOGUE)
    return store


def test_construction_loads_nothing() -> None:
    store = GPUPromptVectorStore(GPUPromptEmbeddings(batch_size=3))
    assert store.index is None
    assert store.embeddings.embedder is not None  # noqa: SIM300 - a lookup, still nothing loaded
    assert store.embeddings.embedder._model is None


def test_semantic_search_finds_the_right_product(store: GPUPromptVectorStore) -> None:
    assert store.similarity_search("a dress for hot weather", k=1)[0].id == "p1"
    assert store.similarity_search("can I send it back?", k=1)[0].id == "p6"
    docs = store.similarity_search("something to run in", k=1)
    assert docs == [Document(id="p5", page_content=CATALOGUE[4].page_content, metadata=CATALOGUE[4].metadata)]


def test_scores_are_cosine_and_descending(store: GPUPromptVectorStore, lc_embeddings: GPUPromptEmbeddings) -> None:
    import numpy as np

    scored = store.similarity_search_with_score("red shoes", k=6)
    scores = [s for _, s in scored]
    assert scores == sorted(scores, reverse=True)
    query = np.array(lc_embeddings.embed_query("red shoes"))
    top_doc, top_score = scored[0]
    expected = float(query @ np.array(lc_embeddings.embed_query(top_doc.page_content)))
    assert top_score == pytest.approx(expected, abs=1e-4)
    by_vector = store.similarity_search_with_score_by_vector(query.tolist(), k=6)
    assert [d.id for d, _ in by_vector] == [d.id for d, _ in scored]
    relevance = store.similarity_search_with_relevance_scores("red shoes", k=6)
    assert all(0.0 <= r <= 1.0 for _, r in relevance)
    assert [d.id for d, _ in relevance] == [d.id for d, _ in scored]


def test_filters_use_the_core_language_and_prefilter(store: GPUPromptVectorStore) -> None:
    red = store.similarity_search("footwear", k=5, filter={"color": "red"})
    assert {d.id for d in red} == {"p1", "p3"}  # exactly min(k, matches), never fewer
    assert red[0].id == "p3"
    cheap = store.similarity_search("clothes", k=10, filter={"price": {"$lt": 60}})
    assert {d.id for d in cheap} == {"p1", "p4"}
    either = store.similarity_search("x", k=10, filter={"$or": [{"color": "green"}, {"tags": {"$contains": "sport"}}]})
    assert {d.id for d in either} == {"p4", "p5"}
    assert store.similarity_search("x", k=3, filter={"color": "purple"}) == []
    with pytest.raises(FilterError):
        store.similarity_search("x", k=3, filter={"price": {"$between": [1, 2]}})


def test_a_bare_list_means_one_of_as_in_faiss(store: GPUPromptVectorStore, lc_embeddings) -> None:  # noqa: ANN001
    """LangChain's FAISS reads ``{"color": ["red", "blue"]}`` as one-of; so does this store, in every
    search (a list-valued field is not equal to a bare list, as in FAISS; ``$eq`` says equality)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.vectorstores import FAISS

    faiss = FAISS.from_documents(CATALOGUE, lc_embeddings)
    for condition in ({"color": ["red", "blue"]}, {"$or": [{"color": ["green"]}, {"price": 99}]}, {"tags": ["shoes"]},
                      {"color": {"$neq": "red"}}):
        want = {d.id for d in faiss.similarity_search("clothes", k=10, filter=condition, fetch_k=10)}
        assert {d.id for d in store.similarity_search("clothes", k=10, filter=condition)} == want, condition
    assert {d.id for d in store.similarity_search("clothes", k=10, filter={"color": ["red", "blue"]})} == {"p1", "p2", "p3"}
    assert {d.id for d in store.max_marginal_relevance_search("clothes", k=3, filter={"color": ["red", "blue"]})} \
        <= {"p1", "p2", "p3"}
    assert {d.id for d in store.hybrid_search("red", k=10, filter={"color": ["red", "blue"]})} == {"p1", "p2", "p3"}
    assert {d.id for d in store.lexical_search("red", k=10, filter={"color": ["white", "red"]})} == {"p1", "p3"}
    assert [d.id for d in store.similarity_search("x", k=3, filter={"tags": {"$eq": ["trousers"]}})] == ["p2"]


def test_mmr_trades_similarity_for_diversity(lc_embeddings: GPUPromptEmbeddings) -> None:
    texts = ["red summer dress", "red summer dress!", "a red dress for summer", "waterproof hiking boots"]
    store = GPUPromptVectorStore.from_texts(
        texts, lc_embeddings, metadatas=[{"n": i} for i in range(4)], ids=["a", "b", "c", "d"]
    )
    plain = [d.id for d in store.similarity_search("red summer dress", k=2)]
    assert set(plain) <= {"a", "b", "c"}
    diverse = [d.id for d in store.max_marginal_relevance_search("red summer dress", k=2, fetch_k=4, lambda_mult=0.1)]
    assert diverse[0] in {"a", "b"} and diverse[1] == "d"
    vector = lc_embeddings.embed_query("red summer dress")
    assert [d.id for d in store.max_marginal_relevance_search_by_vector(vector, k=2, fetch_k=4, lambda_mult=0.1)] == diverse
    filtered = store.max_marginal_relevance_search("red summer dress", k=3, fetch_k=4, filter={"n": {"$gte": 2}})
    assert {d.id for d in filtered} == {"c", "d"}


async def test_async_paths_equal_sync(store: GPUPromptVectorStore, lc_embeddings: GPUPromptEmbeddings) -> None:
    assert await store.asimilarity_search("warm scarf", k=2) == store.similarity_search("warm scarf", k=2)
    sync_scored = store.similarity_search_with_score("warm scarf", k=3)
    async_scored = await store.asimilarity_search_with_score("warm scarf", k=3)
    assert [d for d, _ in async_scored] == [d for d, _ in sync_scored]
    assert [s for _, s in async_scored] == pytest.approx([s for _, s in sync_scored], abs=1e-5)
    vector = await lc_embeddings.aembed_query("warm scarf")
    assert await store.asimilarity_search_by_vector(vector, k=2) == store.similarity_search_by_vector(vector, k=2)
    assert await store.amax_marginal_relevance_search("shoes", k=2, fetch_k=5) == store.max_marginal_relevance_search(
        "shoes", k=2, fetch_k=5
    )
    assert await store.aget_by_ids(["p2", "nope", "p1"]) == store.get_by_ids(["p2", "nope", "p1"])
    assert [d.id for d in store.get_by_ids(["p2", "nope", "p1"])] == ["p2", "p1"]


async def test_concurrent_searches_are_coalesced(store: GPUPromptVectorStore) -> None:
    questions = [f"question {i}: do you have {c} shoes?" for i, c in enumerate(["red", "blue", "white", "green"] * 8)]
    expected = [store.similarity_search(q, k=2) for q in questions]
    before = store.index.stats().batcher.batches
    found = await asyncio.gather(*(store.asimilarity_search(q, k=2) for q in questions))
    assert found == expected
    assert store.index.stats().batcher.batches - before < len(questions)


def test_upsert_replaces_and_delete_removes(store: GPUPromptVectorStore) -> None:
    store.add_texts(["Red cotton summer dress, now in linen"], [{"color": "red", "price": 59}], ids=["p1"])
    assert len(store.index) == len(CATALOGUE)
    assert store.get_by_ids(["p1"])[0].page_content.endswith("now in linen")
    assert store.delete(["p1", "missing"]) is True
    assert store.get_by_ids(["p1"]) == []
    store.delete()
    assert len(store.index) == 0


async def test_constructors(lc_embeddings: GPUPromptEmbeddings) -> None:
    from_docs = GPUPromptVectorStore.from_documents(CATALOGUE[:2], lc_embeddings, metric="ip")
    assert [d.id for d in from_docs.get_by_ids(["p1", "p2"])] == ["p1", "p2"]
    afrom = await GPUPromptVectorStore.afrom_texts(["x", "y"], lc_embeddings, metadatas=[{"n": 1}, {"n": 2}])
    assert len(afrom.index) == 2
    adocs = await GPUPromptVectorStore.afrom_documents(CATALOGUE[:3], lc_embeddings)
    assert sorted(adocs.index.ids()) == ["p1", "p2", "p3"]
    added = await adocs.aadd_texts(["z"])
    assert len(added) == 1 and len(added[0]) == 32  # a generated uuid4 hex id


def test_retrievers(store: GPUPromptVectorStore) -> None:
    similarity = store.as_retriever(search_kwargs={"k": 2, "filter": {"color": "red"}})
    assert {d.id for d in similarity.invoke("boots")} == {"p1", "p3"}
    mmr = store.as_retriever(search_type="mmr", search_kwargs={"k": 3, "fetch_k": 6})
    assert len(mmr.invoke("shoes")) == 3
    threshold = store.as_retriever(search_type="similarity_score_threshold", search_kwargs={"score_threshold": 0.5, "k": 6})
    hits = threshold.invoke("Red leather ankle boots")
    assert hits[0].id == "p3"
    assert all(d.id in {"p1", "p3", "p5"} for d in hits)
    assert len(hits) < 6


def test_save_and_load_without_pickle(store: GPUPromptVectorStore, lc_embeddings: GPUPromptEmbeddings, tmp_path: Path) -> None:
    store.save_local(tmp_path / "kb")
    files = [p.name for p in (tmp_path / "kb").rglob("*") if p.is_file()]
    assert files and not any(name.endswith((".pkl", ".pickle")) for name in files)
    loaded = GPUPromptVectorStore.load_local(tmp_path / "kb", lc_embeddings)
    assert loaded.similarity_search("a dress for hot weather", k=3) == store.similarity_search("a dress for hot weather", k=3)
    also = GPUPromptVectorStore.load_local(tmp_path / "kb", lc_embeddings, allow_dangerous_deserialization=True)
    assert len(also.index) == len(CATALOGUE)
    with pytest.raises(SnapshotError):
        GPUPromptVectorStore.load_local(tmp_path / "nothing-here", lc_embeddings)
    # options that configure an index apply to the load, or are refused: never silently ignored
    assert GPUPromptVectorStore.load_local(tmp_path / "kb", lc_embeddings, backend="faiss").index.backend_name.startswith("faiss")
    assert GPUPromptVectorStore.load_local(tmp_path / "kb", lc_embeddings, metric="cosine").index.metric == "cosine"
    with pytest.raises(ConfigurationError, match="'metric' is 'l2' but the given index uses 'cosine'"):
        GPUPromptVectorStore.load_local(tmp_path / "kb", lc_embeddings, metric="l2")
    with pytest.raises(ConfigurationError, match="'backend' configure a new index"):
        GPUPromptVectorStore(lc_embeddings, index=loaded.index, backend="faiss")
    with pytest.raises(ConfigurationError, match="'index_factory' configure a new index"):
        GPUPromptVectorStore(lc_embeddings, index=loaded.index, index_factory="HNSW32")


def test_bad_input_is_typed_and_changes_nothing(store: GPUPromptVectorStore) -> None:
    with pytest.raises(InvalidInputError, match="'metadatas' must have one entry per text"):
        store.add_texts(["a", "b"], [{"x": 1}])
    with pytest.raises(InvalidInputError, match="'ids'"):
        store.add_texts(["a", "b"], ids=["only-one"])
    with pytest.raises(InvalidInputError):
        store.add_texts(["a"], [{"bad": object()}], ids=["new"])
    assert len(store.index) == len(CATALOGUE)
    assert store.get_by_ids(["new"]) == []
    with pytest.raises(InvalidInputError, match="'k' must be an int >= 1"):
        store.similarity_search("x", k=0)
    with pytest.raises(InputTypeError, match="'query' must be a str"):
        store.similarity_search(123)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="unexpected search keyword"):
        store.similarity_search("x", k=1, fliter={"color": "red"})
    with pytest.raises(InputTypeError, match="wrap it in a list"):
        store.add_texts("just one string")
    with pytest.raises(InputTypeError):
        GPUPromptVectorStore("not embeddings")  # type: ignore[arg-type]
    from gpuprompt.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="'metric'"):
        GPUPromptVectorStore(store.embeddings, metric="manhattan")


def test_the_index_records_the_embedder_and_refuses_another(lc_embeddings) -> None:  # noqa: ANN001
    """Vectors of two gpuprompt embedders do not share a space: the store passes its embedder's
    identity, the index records it at the first add and refuses vectors of another one."""
    from gpuprompt.errors import EmbedderMismatchError
    from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptVectorStore

    store = GPUPromptVectorStore(lc_embeddings)
    store.add_texts(["red running shoes"], ids=["a"])
    assert store.ensure_index(lc_embeddings.embedder.dim).config.embedder == lc_embeddings.embedder.identity
    other = GPUPromptVectorStore(GPUPromptEmbeddings(normalize=False), index=store.ensure_index(lc_embeddings.embedder.dim))
    with pytest.raises(EmbedderMismatchError, match="allow_other_embedder"):
        other.add_texts(["blue boots"], ids=["b"])
    assert store.get_by_ids(["a", "b"])[0].id == "a" and len(store.get_by_ids(["b"])) == 0


async def test_queries_are_embedded_with_the_query_instruction_in_every_search() -> None:
    """Documents take ``embed_instruction``, queries ``query_instruction``: a search by text, dense
    or hybrid, sync or async, equals a search by the ``embed_query`` vector."""
    import numpy as np

    instructed = GPUPromptEmbeddings(query_instruction="query: ", embed_instruction="passage: ")
    store = GPUPromptVectorStore(instructed)
    store.add_documents(CATALOGUE)
    question = "shoes to run in"
    query = np.array(instructed.embed_query(question), dtype=np.float32)
    assert not np.allclose(query, instructed.embed_documents([question])[0], atol=1e-3)  # the prefixes differ
    assert np.allclose(store.embed_query_matrix(question).cpu().numpy()[0], query, atol=1e-6)
    assert np.allclose((await store.aembed_query_matrix(question)).cpu().numpy()[0], query, atol=1e-6)
    by_vector = store.similarity_search_with_score_by_vector(query.tolist(), k=6)
    for scored in (store.similarity_search_with_score(question, k=6),
                   await store.asimilarity_search_with_score(question, k=6)):
        assert [d.id for d, _ in scored] == [d.id for d, _ in by_vector]
        assert [s for _, s in scored] == pytest.approx([s for _, s in by_vector], abs=1e-5)
    want = [h.id for h in store.index.hybrid_search(query[None, :], [question], 4)[0]]
    assert [d.id for d in store.hybrid_search(question, k=4)] == want
    assert [d.id for d in await store.ahybrid_search(question, k=4)] == want
