"""Reranking on every surface: LangChain (drop-in for CrossEncoderReranker), LlamaIndex (drop-in for
SentenceTransformerRerank), the pipeline's rerank stage, the server's /v1/rerank and /score, and
remote mode, each checked against the stock class or the in-process core on the same model."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.asgi import InProcessServer

from gpuprompt import RAGPipeline, VectorIndex, connect, get_runtime
from gpuprompt._corpus import prose_paragraphs
from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError

QUERY = "When is a name rebound in an assignment?"


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return prose_paragraphs()[20:40]


@pytest.fixture(scope="module")
def server(embedder, reranker) -> InProcessServer:
    from gpuprompt.server import create_app

    app = create_app(embedder=embedder, llm=get_runtime().llm(backend="transformers"), reranker=reranker,
                     preload=False)
    served = InProcessServer(app).start()
    yield served
    served.stop()


# ---------------------------------------------------------------------- LangChain
def test_langchain_order_equals_cross_encoder_reranker(cross_encoder_path: str, reranker, docs) -> None:
    from langchain_classic.retrievers.document_compressors import CrossEncoderReranker
    from langchain_community.cross_encoders import HuggingFaceCrossEncoder
    from langchain_core.documents import Document

    from langchain_gpuprompt import GPUPromptReranker

    documents = [Document(page_content=d, metadata={"n": i}, id=f"d{i}") for i, d in enumerate(docs)]
    stock = CrossEncoderReranker(model=HuggingFaceCrossEncoder(model_name=cross_encoder_path,
                                                               model_kwargs={"device": "cpu"}), top_n=4)
    ours = GPUPromptReranker(model=cross_encoder_path, device="cpu", top_n=4)
    expected = stock.compress_documents(documents, QUERY)
    got = ours.compress_documents(documents, QUERY)
    assert [d.id for d in got] == [d.id for d in expected]
    assert [d.metadata["n"] for d in got] == [d.metadata["n"] for d in expected]
    scores = [d.metadata["relevance_score"] for d in got]
    assert scores == sorted(scores, reverse=True)
    assert ours.reranker is reranker  # the process's shared reranker and batch queue
    assert "relevance_score" not in documents[0].metadata  # the caller's documents are untouched


async def test_langchain_async_and_contextual_compression(cross_encoder_path: str, embedder, docs) -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever

    from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptReranker, GPUPromptVectorStore

    store = GPUPromptVectorStore.from_texts(docs, GPUPromptEmbeddings(device="cpu"),
                                            metadatas=[{"i": i} for i in range(len(docs))])
    reranker = GPUPromptReranker(model=cross_encoder_path, device="cpu", top_n=3)
    retriever = ContextualCompressionRetriever(base_compressor=reranker,
                                               base_retriever=store.as_retriever(search_kwargs={"k": 10}))
    sync = retriever.invoke(QUERY)
    assert len(sync) == 3 and all("relevance_score" in d.metadata and "i" in d.metadata for d in sync)
    results = await asyncio.gather(*(retriever.ainvoke(QUERY) for _ in range(4)))
    assert all([d.page_content for d in r] == [d.page_content for d in sync] for r in results)
    assert await reranker.acompress_documents([], QUERY) == []


def test_langchain_bad_input_and_settings(cross_encoder_path: str) -> None:
    from langchain_core.documents import Document

    from langchain_gpuprompt import GPUPromptReranker

    # A setting refused as a setting, before pydantic would read True as 1 or "3" as 3.
    for top_n in (0, "three", "3", True, 2.0):
        with pytest.raises(ConfigurationError, match="top_n"):
            GPUPromptReranker(model=cross_encoder_path, top_n=top_n)
    with pytest.raises(ConfigurationError, match="batch"):
        GPUPromptReranker(model=cross_encoder_path, batch_size=0)
    with pytest.raises(ConfigurationError, match="model_name"):
        GPUPromptReranker(model=cross_encoder_path, model_name=cross_encoder_path)
    reranker = GPUPromptReranker(model=cross_encoder_path, device="cpu")
    with pytest.raises(InputTypeError, match=r"documents\[1\]"):
        reranker.compress_documents([Document(page_content="a"), "not a document"], QUERY)
    with pytest.raises(InputTypeError, match="'query'"):
        reranker.compress_documents([Document(page_content="a")], None)


# ---------------------------------------------------------------------- LlamaIndex
def test_llamaindex_order_equals_sentence_transformer_rerank(cross_encoder_path: str, docs) -> None:
    from llama_index.core.postprocessor import SentenceTransformerRerank
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from llamaindex_gpuprompt import GPUPromptRerank

    def nodes() -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(text=d, id_=f"n{i}", metadata={"topic": "assignment"}), score=0.5)
                for i, d in enumerate(docs)]

    stock = SentenceTransformerRerank(model=cross_encoder_path, top_n=3, device="cpu")
    ours = GPUPromptRerank(model=cross_encoder_path, top_n=3, device="cpu", keep_retrieval_score=True)
    expected = stock.postprocess_nodes(nodes(), query_bundle=QueryBundle(QUERY))
    got = ours.postprocess_nodes(nodes(), query_bundle=QueryBundle(QUERY))
    assert [n.node.id_ for n in got] == [n.node.id_ for n in expected]
    np.testing.assert_allclose([n.score for n in got], [n.score for n in expected], atol=1e-4)
    assert got[0].node.metadata["retrieval_score"] == 0.5
    for top_n in (0, "3", True):  # the same setting error as the LangChain class
        with pytest.raises(ConfigurationError, match="top_n"):
            GPUPromptRerank(model=cross_encoder_path, top_n=top_n)
    # SentenceTransformerRerank's positional order (top_n, model, device, keep_retrieval_score)
    positional = GPUPromptRerank(3, cross_encoder_path, "cpu", True)
    assert (positional.top_n, positional.model, positional.device, positional.keep_retrieval_score) == (
        3, cross_encoder_path, "cpu", True)
    with pytest.raises(ConfigurationError, match="'top_n' twice"):
        GPUPromptRerank(3, top_n=2)
    with pytest.raises(ConfigurationError, match="at most 4 positional"):
        GPUPromptRerank(3, cross_encoder_path, "cpu", True, 5)


async def test_llamaindex_async_query_engine(cross_encoder_path: str, docs) -> None:
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.schema import QueryBundle

    from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptRerank, GPUPromptVectorStore

    index = VectorStoreIndex.from_documents(
        [Document(text=d) for d in docs], storage_context=StorageContext.from_defaults(vector_store=GPUPromptVectorStore()),
        embed_model=GPUPromptEmbedding(device="cpu"))
    rerank = GPUPromptRerank(model=cross_encoder_path, top_n=2, device="cpu")
    retriever = index.as_retriever(similarity_top_k=8)
    nodes = await retriever.aretrieve(QUERY)
    kept = await rerank.apostprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    assert len(kept) == 2 and kept[0].score >= kept[1].score
    with pytest.raises(InvalidInputError, match="query"):
        rerank.postprocess_nodes(nodes)


# ---------------------------------------------------------------------- the pipeline
async def test_pipeline_reranks_fetch_k_candidates(embedder, reranker, docs) -> None:
    index = VectorIndex(embedder.dim, device="cpu")
    index.add(None, embedder.embed(docs), documents=docs)

    class Echo:  # the generation stage is not under test: an engine that answers at once
        async def agenerate(self, request):  # noqa: ANN001, ANN201
            from gpuprompt.llm import GenerationResult, Timings, Usage

            return GenerationResult(text="ok", finish_reason="stop", usage=Usage(1, 1, 2),
                                    timings=Timings(0, 0, 0), model="echo", request_id="r")

    rag = RAGPipeline(index, Echo(), embedder=embedder, reranker=reranker, k=3, fetch_k=12)
    answer = await rag.aanswer("s1", QUERY)
    candidates = index.search(embedder.embed_tensor([QUERY]), 12)[0]
    expected = reranker.rerank(QUERY, [h.document for h in candidates], top_n=3)
    assert [h.document for h in answer.sources] == [e.document for e in expected]
    assert [round(h.score, 5) for h in answer.sources] == [round(e.score, 5) for e in expected]
    assert answer.timings.rerank_s > 0
    with pytest.raises(ConfigurationError, match="fetch_k"):
        RAGPipeline(index, Echo(), embedder=embedder, fetch_k=10)


# ---------------------------------------------------------------------- the server
async def test_rerank_route_in_the_shape_vllm_and_cohere_serve(server: InProcessServer, reranker, docs) -> None:
    expected = reranker.rerank(QUERY, docs, top_n=5)
    async with server.client() as http:
        for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
            reply = await http.post(path, json={"query": QUERY, "documents": docs, "top_n": 5})
            assert reply.status_code == 200, reply.text
            body = reply.json()
            assert body["model"] == reranker.model_id and body["usage"]["total_tokens"] > 0
            assert [r["index"] for r in body["results"]] == [h.index for h in expected]
            np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], [h.score for h in expected],
                                       atol=1e-5)
            assert body["results"][0]["document"] == {"text": docs[expected[0].index]}
        objects = await http.post("/v1/rerank", json={"query": QUERY, "documents": [{"text": d} for d in docs[:3]],
                                                      "return_documents": False})
        assert objects.status_code == 200 and all("document" not in r for r in objects.json()["results"])  # as Cohere
        # Cohere's structured documents carry other keys: accepted, only the text is ranked.
        titled = await http.post("/v1/rerank", json={"query": QUERY, "top_n": 2, "documents": [
            {"text": d, "title": f"doc {i}", "id": i} for i, d in enumerate(docs)]})
        assert titled.status_code == 200, titled.text
        assert [r["index"] for r in titled.json()["results"]] == [h.index for h in expected[:2]]
        # top_n past the documents (and past the 1,000-document cap) keeps them all, as in process.
        every = await http.post("/v1/rerank", json={"query": QUERY, "documents": docs[:3], "top_n": 5000})
        assert every.status_code == 200 and len(every.json()["results"]) == 3
        score = await http.post("/score", json={"text_1": QUERY, "text_2": docs[:4]})
        assert score.status_code == 200
        np.testing.assert_allclose([d["score"] for d in score.json()["data"]],
                                   reranker.score([(QUERY, d) for d in docs[:4]]), atol=1e-5)
        models = (await http.get("/v1/models")).json()["data"]
        assert reranker.model_id in [m["id"] for m in models]
        assert (await http.get("/health")).json()["rerank_model"] == reranker.model_id


async def test_rerank_route_in_text_embeddings_inference_shape(server: InProcessServer, reranker, docs) -> None:
    """TEI's ``POST /rerank``: ``texts`` in, a bare list of ``{index, score[, text]}`` out, best first."""
    expected = reranker.rerank(QUERY, docs)
    async with server.client() as http:
        reply = await http.post("/rerank", json={"query": QUERY, "texts": docs, "truncate": True})
        assert reply.status_code == 200, reply.text
        ranks = reply.json()
        assert isinstance(ranks, list) and [r["index"] for r in ranks] == [h.index for h in expected]
        np.testing.assert_allclose([r["score"] for r in ranks], [h.score for h in expected], atol=1e-5)
        assert all(set(r) == {"index", "score"} for r in ranks)
        echoed = (await http.post("/rerank", json={"query": QUERY, "texts": docs[:3], "return_text": True})).json()
        assert [r["text"] for r in echoed] == [docs[r["index"]] for r in echoed]
        assert (await http.post("/rerank", json={"query": QUERY, "texts": []})).json() == []
        raw = await http.post("/rerank", json={"query": QUERY, "texts": docs[:2], "raw_scores": True})
        if reranker.activation == "identity":
            assert raw.status_code == 200
        else:
            assert raw.status_code == 400 and raw.json()["error"]["param"] == "raw_scores"
        for bad, param in [({"query": QUERY, "texts": "a bare string"}, "texts"), ({"texts": ["a"]}, "query"),
                           ({"query": QUERY, "texts": ["a"], "truncation_direction": "Left"}, "truncation_direction")]:
            reply = await http.post("/rerank", json=bad)
            assert reply.status_code == 400, reply.text
            assert param in (reply.json()["error"]["param"] or "")
        wrong = await http.post("/rerank", json=["not", "an", "object"])
        assert wrong.status_code == 400 and wrong.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": QUERY, "documents": "a bare string"}, "documents"),
        ({"query": QUERY, "documents": ["a", None]}, "documents"),
        ({"query": None, "documents": ["a"]}, "query"),
        ({"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": QUERY, "documents": ["a"], "top_n": True}, "top_n"),
        ('{"query": "\\ud800", "documents": ["a"]}', "query"),  # a lone surrogate, as JSON escapes it
        ({"query": QUERY, "documents": ["a"] * 1001}, "documents"),
        ({"documents": ["a"]}, "query"),
    ],
)
async def test_bad_rerank_requests_are_openai_style_400s(server: InProcessServer, path: str, body, param) -> None:
    async with server.client() as http:
        if isinstance(body, str):
            reply = await http.post(path, content=body, headers={"Content-Type": "application/json"})
        else:
            reply = await http.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and param in (error["param"] or "")


async def test_a_server_without_a_reranker_answers_404_naming_the_flag(embedder) -> None:
    from gpuprompt.server import create_app

    plain = InProcessServer(create_app(embedder=embedder, llm=get_runtime().llm(backend="transformers"),
                                       preload=False)).start()
    try:
        async with plain.client() as http:
            reply = await http.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
            assert reply.status_code == 404 and "--rerank-model" in reply.json()["error"]["message"]
        with pytest.raises(ConfigurationError, match="--rerank-model"):
            plain.connect().reranker().rerank("q", ["a"])
    finally:
        plain.stop()


# ---------------------------------------------------------------------- remote mode
async def test_remote_reranking_equals_in_process(server: InProcessServer, reranker, cross_encoder_path: str,
                                                  docs) -> None:
    from langchain_core.documents import Document

    from langchain_gpuprompt import GPUPromptReranker
    from llamaindex_gpuprompt import GPUPromptRerank

    remote = server.connect().reranker()
    assert type(remote).__name__ == "RemoteReranker" and remote.model_id == reranker.model_id
    local = reranker.rerank(QUERY, docs, top_n=4)
    got = remote.rerank(QUERY, docs, top_n=4)
    assert [h.index for h in got] == [h.index for h in local]
    np.testing.assert_allclose([h.score for h in got], [h.score for h in local], atol=1e-5)
    assert [h.index for h in await remote.arerank(QUERY, docs, top_n=4)] == [h.index for h in local]
    np.testing.assert_allclose(remote.score([(QUERY, d) for d in docs[:3]]),
                               reranker.score([(QUERY, d) for d in docs[:3]]), atol=1e-5)
    with pytest.raises(InputTypeError, match=r"documents\[0\]"):
        remote.rerank(QUERY, [None])  # checked here, before anything is sent
    assert [h.index for h in remote.rerank(QUERY, docs[:3], top_n=5000)] == [h.index for h in reranker.rerank(
        QUERY, docs[:3])]  # more than there are keeps them all, as in process
    lc = GPUPromptReranker(base_url=server.url, top_n=4)
    documents = [Document(page_content=d) for d in docs]
    assert [d.page_content for d in lc.compress_documents(documents, QUERY)] == [h.document for h in local]
    with pytest.raises(ConfigurationError, match="device"):
        GPUPromptReranker(base_url=server.url, device="cpu")
    li = GPUPromptRerank(base_url=server.url, top_n=4)
    assert li.reranker is remote or li.reranker.model_id == remote.model_id
    assert connect(server.url) is server.connect()


@pytest.mark.parametrize(
    ("results", "problem"),
    [
        ([{"index": 0, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.5}], "twice"),
        ([{"index": -1, "relevance_score": 0.9}, {"index": 1, "relevance_score": 0.5}], "index"),
        ([{"index": 5, "relevance_score": 0.9}, {"index": 1, "relevance_score": 0.5}], "index"),
        ([{"index": True, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.5}], "index"),
        ([{"index": 0, "relevance_score": float("nan")}, {"index": 1, "relevance_score": 0.5}], "finite"),
        ([{"index": 0, "relevance_score": "0.9"}, {"index": 1, "relevance_score": 0.5}], "finite"),
        ([{"index": 0, "relevance_score": 0.9}], "ranked 1 of the 2"),
        ([{"index": 0}], "malformed"),
    ],
)
def test_a_remote_reranker_checks_what_the_server_answers(results: list, problem: str) -> None:
    """A peer's answer is checked before it becomes hits: each index once and in range, finite scores."""
    import json

    import httpx

    from gpuprompt.errors import EngineError
    from gpuprompt.remote import mount, unmount

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "peer-reranker", "object": "model"}]})
        if request.url.path.endswith("/health"):
            return httpx.Response(404)
        body = json.dumps({"id": "r", "model": "peer-reranker", "results": results}, allow_nan=True)
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    url = "http://peer-reranker.invalid"
    mount(url, httpx.MockTransport(answer))
    try:
        with pytest.raises(EngineError, match=problem):
            connect(url).reranker().rerank("q", ["a", "b"])
    finally:
        unmount(url)


def test_a_peer_that_ignores_top_n_is_cut_to_it() -> None:
    import httpx

    from gpuprompt.remote import mount, unmount

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "peer-reranker", "object": "model"}]})
        if request.url.path.endswith("/health"):
            return httpx.Response(404)
        return httpx.Response(200, json={"results": [{"index": 1, "relevance_score": 0.2},
                                                     {"index": 0, "relevance_score": 0.7}]})

    url = "http://peer-reranker-top-n.invalid"
    mount(url, httpx.MockTransport(answer))
    try:
        hits = connect(url).reranker().rerank("q", ["a", "b"], top_n=1)
        assert [(h.index, h.document) for h in hits] == [(0, "a")]
    finally:
        unmount(url)
