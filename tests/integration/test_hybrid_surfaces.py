"""Hybrid search on every surface: LangChain (search_type hybrid / lexical, against the stock
BM25Retriever and EnsembleRetriever), LlamaIndex (HYBRID, TEXT_SEARCH end to end), RAGPipeline, the
server's collection routes and remote mode (the same hits as in process)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.asgi import InProcessServer

from gpuprompt import RAGPipeline, VectorIndex, get_runtime
from gpuprompt._corpus import sku_catalogue, sku_questions
from gpuprompt.errors import InvalidInputError
from gpuprompt.index._lexical_text import tokenize

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def products() -> list[dict]:
    return sku_catalogue(300)


@pytest.fixture(scope="module")
def asked(products) -> list[tuple[str, str]]:
    return sku_questions(products, 24, seed=21)


@pytest.fixture(scope="module")
def vectors(embedder, products) -> np.ndarray:
    return embedder.embed([p["text"] for p in products])


def _recall(asked, ids_per_question) -> float:
    return sum(want in ids for (_, want), ids in zip(asked, ids_per_question)) / len(asked)


# ---------------------------------------------------------------------- LangChain
@pytest.fixture(scope="module")
def lc_store(embedder, products):
    from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptVectorStore

    return GPUPromptVectorStore.from_texts([p["text"] for p in products], GPUPromptEmbeddings(),
                                           metadatas=[p["metadata"] for p in products], ids=[p["id"] for p in products])


def test_langchain_retrievers_against_bm25retriever_and_the_ensemble(lc_store, products, asked) -> None:
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.retrievers import BM25Retriever

    texts = [p["text"] for p in products]
    stock = BM25Retriever.from_texts(texts, metadatas=[{"id": p["id"]} for p in products], k=5)
    tokenized = BM25Retriever.from_texts(texts, metadatas=[{"id": p["id"]} for p in products], k=5,
                                         preprocess_func=tokenize)
    questions = [q for q, _ in asked]
    assert _recall(asked, [[d.metadata["id"] for d in stock.invoke(q)] for q in questions]) < 0.2  # whitespace split
    assert _recall(asked, [[d.metadata["id"] for d in tokenized.invoke(q)] for q in questions]) == 1.0
    lexical = lc_store.as_retriever(search_type="lexical", search_kwargs={"k": 5})
    got = [[d.id for d in lexical.invoke(q)] for q in questions]
    assert _recall(asked, got) == 1.0
    # the drop-in: the first hit is BM25Retriever's own (with a tokenizer that keeps the codes)
    assert [ids[0] for ids in got] == [tokenized.invoke(q)[0].metadata["id"] for q in questions]
    hybrid = lc_store.as_retriever(search_type="hybrid", search_kwargs={"k": 5})
    dense = lc_store.as_retriever(search_kwargs={"k": 5})
    dense_recall = _recall(asked, [[d.id for d in dense.invoke(q)] for q in questions])
    rrf = _recall(asked, [[d.id for d in hybrid.invoke(q)] for q in questions])
    ensemble = EnsembleRetriever(retrievers=[stock, dense], weights=[0.5, 0.5])
    assert rrf >= dense_recall
    assert rrf > _recall(asked, [[d.id or d.metadata.get("id") for d in ensemble.invoke(q)][:5] for q in questions])
    # a weight towards the words for questions that name codes (README: when to pick alpha)
    weighted = lc_store.as_retriever(search_type="hybrid", search_kwargs={"k": 5, "alpha": 0.3})
    assert _recall(asked, [[d.id for d in weighted.invoke(q)] for q in questions]) >= max(0.95, dense_recall)


async def test_langchain_async_filters_and_scores(lc_store, asked) -> None:
    question, want = asked[0]
    docs = await lc_store.as_retriever(search_type="hybrid", search_kwargs={"k": 3, "alpha": 0.3}).ainvoke(question)
    assert docs[0].id == want
    size = docs[0].metadata["size"]
    filtered = await lc_store.ahybrid_search_with_score(question, k=4, filter={"size": size}, fetch_k=40)
    assert filtered[0][0].id == want and all(d.metadata["size"] == size for d, _ in filtered)
    assert [s for _, s in filtered] == sorted((s for _, s in filtered), reverse=True)
    many = await asyncio.gather(*(lc_store.alexical_search(q, k=1) for q, _ in asked))
    assert [d[0].id for d in many] == [w for _, w in asked]
    with pytest.raises(InvalidInputError, match="'alpha'"):
        lc_store.as_retriever(search_type="hybrid", search_kwargs={"alpha": 7}).invoke(question)
    with pytest.raises(InvalidInputError, match="must hold words"):
        lc_store.lexical_search("   ")
    with pytest.raises(InvalidInputError, match="unknown keyword"):
        lc_store.hybrid_search(question, lambda_mult=0.5)


# ---------------------------------------------------------------------- LlamaIndex
def test_llamaindex_hybrid_and_text_search_end_to_end(embedder, products, asked) -> None:
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores import MetadataFilter, MetadataFilters
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode

    from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptVectorStore

    store = GPUPromptVectorStore()
    nodes = [TextNode(text=p["text"], id_=p["id"], metadata=p["metadata"]) for p in products]
    index = VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(vector_store=store),
                             embed_model=GPUPromptEmbedding(embedder=embedder))
    questions = [q for q, _ in asked]
    hybrid = index.as_retriever(vector_store_query_mode="hybrid", alpha=0.5, similarity_top_k=5)
    assert _recall(asked, [[n.node.node_id for n in hybrid.retrieve(q)] for q in questions]) >= 0.95
    text = index.as_retriever(vector_store_query_mode="text_search", similarity_top_k=3)
    assert [text.retrieve(q)[0].node.node_id for q in questions] == [w for _, w in asked]
    rrf = index.as_retriever(vector_store_query_mode="hybrid", similarity_top_k=20, sparse_top_k=20, hybrid_top_k=3)
    assert all(len(rrf.retrieve(q)) == 3 for q in questions[:3])
    size = products[0]["metadata"]["size"]
    only = MetadataFilters(filters=[MetadataFilter(key="size", value=size)])
    filtered = index.as_retriever(vector_store_query_mode="hybrid", filters=only, similarity_top_k=4)
    assert all(n.node.metadata["size"] == size for n in filtered.retrieve(questions[0]))
    weighted = index.as_retriever(vector_store_query_mode="hybrid", alpha=0.3, similarity_top_k=5)
    found = asyncio.run(weighted.aretrieve(questions[1]))
    assert asked[1][1] in [n.node.node_id for n in found]
    # TEXT_SEARCH needs no embedding at all
    result = store.query(VectorStoreQuery(query_str=questions[2], similarity_top_k=2, mode=VectorStoreQueryMode.TEXT_SEARCH))
    assert result.ids[0] == asked[2][1]
    with pytest.raises(InvalidInputError, match="query_str"):
        store.query(VectorStoreQuery(query_str=" ", similarity_top_k=2, mode=VectorStoreQueryMode.TEXT_SEARCH))
    with pytest.raises(InvalidInputError, match="'query.alpha'"):
        index.as_retriever(vector_store_query_mode="hybrid", alpha=-1.0).retrieve(questions[0])


# ---------------------------------------------------------------------- the pipeline
class _Echo:
    """The generation stage is not under test: an engine that answers at once."""

    async def agenerate(self, request):  # noqa: ANN001, ANN201
        from gpuprompt.llm import GenerationResult, Timings, Usage

        return GenerationResult(text="ok", finish_reason="stop", usage=Usage(1, 1, 2), timings=Timings(0, 0, 0),
                                model="echo", request_id="r")


async def test_pipeline_retrieves_by_mode(embedder, products, vectors, asked) -> None:
    from gpuprompt.rag import check_retrieval

    index = VectorIndex(embedder.dim, device="cpu")
    index.add([p["id"] for p in products], vectors, documents=[p["text"] for p in products])
    question, want = asked[3]
    hybrid = RAGPipeline(index, _Echo(), embedder=embedder, retrieval="hybrid", k=3)
    fused = (await hybrid.aanswer("s", question)).sources
    assert len(fused) == 3 and fused == index.hybrid_search(embedder.embed([question]), [question], 3)[0]
    lexical = await hybrid.aanswer("s2", question, retrieval=check_retrieval("lexical"))
    assert lexical.sources[0].id == want and lexical.timings.embed_s < 0.01
    weighted = RAGPipeline(index, _Echo(), embedder=embedder, retrieval="hybrid", alpha=0.2, k=3)
    assert (await weighted.aanswer("s3", question)).sources[0].id == want
    from gpuprompt.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="'alpha'"):
        RAGPipeline(index, _Echo(), embedder=embedder, retrieval="dense", alpha=0.5)
    index.close()


# ---------------------------------------------------------------------- the server and remote mode
@pytest.fixture(scope="module")
def server(embedder, products) -> InProcessServer:
    from gpuprompt.server import create_app

    app = create_app(embedder=embedder, llm=get_runtime().llm(backend="transformers"), preload=False)
    served = InProcessServer(app).start()

    async def fill() -> None:
        async with served.client() as client:
            body = {"documents": [p["text"] for p in products], "ids": [p["id"] for p in products],
                    "metadatas": [p["metadata"] for p in products]}
            assert (await client.post("/v1/collections/kb/documents", json=body)).status_code == 200

    asyncio.run(fill())
    yield served
    served.stop()


async def test_server_query_and_records_search_by_mode(server, asked, embedder, products, vectors) -> None:
    local = VectorIndex(embedder.dim, device="cpu")
    local.add([p["id"] for p in products], vectors, documents=[p["text"] for p in products],
              metadatas=[p["metadata"] for p in products])
    question, want = asked[4]
    async with server.client() as client:
        for mode, extra in (("lexical", {}), ("hybrid", {"alpha": 0.25})):
            answer = await client.post("/v1/collections/kb/query", json={"query": question, "k": 4, "mode": mode, **extra})
            assert answer.status_code == 200, answer.text
            assert answer.json()["hits"][0]["id"] == want
        answer = await client.post("/v1/collections/kb/query", json={"query": question, "k": 4, "mode": "hybrid"})
        expected = local.hybrid_search(embedder.embed([question]), [question], 4)[0]
        assert [h["id"] for h in answer.json()["hits"]] == [h.id for h in expected]
        body = {"searches": [{"texts": [q for q, _ in asked[:6]], "k": 3, "mode": "lexical"},
                             {"texts": [question], "k": 3, "mode": "hybrid", "fusion": "weighted", "fetch_k": 30},
                             {"texts": [question], "k": 3, "mode": "hybrid", "filter": {"size": "S"}}]}
        answer = (await client.post("/v1/collections/kb/records/search", json=body)).json()["results"]
        assert [hits[0]["id"] for hits in answer[0]] == [w for _, w in asked[:6]]
        expected = local.hybrid_search(embedder.embed([question]), [question], 3, fusion="weighted", fetch_k=30)[0]
        assert [h["id"] for h in answer[1][0]] == [h.id for h in expected]
        assert all(h["metadata"]["size"] == "S" for h in answer[2][0])
        for bad, param in (({"query": question, "mode": "hybrid", "alpha": 2}, "alpha"),
                           ({"query": question, "mode": "lexical", "alpha": 0.5}, None),
                           ({"query": "  ", "mode": "lexical"}, "query"),
                           ({"query": question, "mode": "semantic"}, "mode")):
            answer = await client.post("/v1/collections/kb/query", json=bad)
            assert answer.status_code == 400, (bad, answer.text)
            if param:
                assert answer.json()["error"]["param"] == param
        empty = await client.post("/v1/collections/nothing/records/search",
                                  json={"searches": [{"texts": ["SKU"], "k": 2, "mode": "lexical"}]})
        assert empty.json()["results"] == [[[]]]
    local.close()


def test_remote_index_lexical_and_hybrid_equal_in_process(server, asked, embedder, products, vectors) -> None:
    local = VectorIndex(embedder.dim, device="cpu")
    local.add([p["id"] for p in products], vectors, documents=[p["text"] for p in products],
              metadatas=[p["metadata"] for p in products])
    remote = server.connect().index(collection="kb")
    texts = [q for q, _ in asked[:8]]
    queries = embedder.embed(texts)
    assert [[h.id for h in r] for r in remote.lexical_search(texts, 3)] == \
        [[h.id for h in r] for r in local.lexical_search(texts, 3)]
    for options in ({}, {"alpha": 0.4}, {"fusion": "weighted", "fetch_k": 25}):
        want = [[h.id for h in r] for r in local.hybrid_search(queries, texts, 3, **options)]
        assert [[h.id for h in r] for r in remote.hybrid_search(queries, texts, 3, **options)] == want
        assert [[h.id for h in r] for r in remote.search_text(texts, 3, mode="hybrid", **options)] == want
    got = asyncio.run(remote.ahybrid_search(queries[:1], texts[:1], 3, {"size": "L"}))
    assert got == [[h for h in local.hybrid_search(queries[:1], texts[:1], 3, {"size": "L"})[0]]] or \
        [h.id for h in got[0]] == [h.id for h in local.hybrid_search(queries[:1], texts[:1], 3, {"size": "L"})[0]]
    with pytest.raises(InvalidInputError, match="'alpha'"):
        remote.hybrid_search(queries[:1], texts[:1], 3, alpha=3.0)  # checked here: nothing is sent
    with pytest.raises(InvalidInputError, match="mode 'hybrid'"):
        remote.search_text(texts[:1], 3, alpha=0.3)
    remote.close()
    local.close()


def test_remote_vector_stores_search_hybrid_on_the_server(server, asked) -> None:
    from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptVectorStore
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode

    from llamaindex_gpuprompt import GPUPromptVectorStore as LIStore

    store = GPUPromptVectorStore(GPUPromptEmbeddings(base_url=server.url), base_url=server.url, collection="kb")
    question, want = asked[5]
    assert store.as_retriever(search_type="hybrid", search_kwargs={"k": 3, "alpha": 0.3}).invoke(question)[0].id == want
    assert store.as_retriever(search_type="lexical", search_kwargs={"k": 3}).invoke(question)[0].id == want
    li = LIStore(base_url=server.url, collection="kb")
    result = li.query(VectorStoreQuery(query_str=question, similarity_top_k=2, mode=VectorStoreQueryMode.TEXT_SEARCH))
    assert result.ids[0] == want


async def test_collection_chat_takes_the_mode(server, asked) -> None:
    question, want = asked[6]
    async with server.client() as client:
        answer = await client.post("/v1/collections/kb/chat", json={"session_id": "h1", "question": question,
                                                                     "mode": "hybrid", "alpha": 0.3, "k": 2,
                                                                     "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        assert answer.json()["sources"][0]["id"] == want
        bad = await client.post("/v1/collections/kb/chat", json={"session_id": "h1", "question": question,
                                                                  "mode": "dense", "alpha": 0.3})
        assert bad.status_code == 400
