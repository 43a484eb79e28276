"""The vector stores in remote mode against a live ``gpuprompt serve``: the langchain-tests standard
suite and the LlamaIndex contract tests (tests/llamaindex/test_li_vector_store.py) with a fresh server
collection per test, answers equal to the same store in process, construction rules, and worker
processes that import no torch."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from gpuprompt.errors import ConfigurationError, DimensionMismatchError
from gpuprompt.remote import RemoteIndex
from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptVectorStore
from llamaindex_gpuprompt import GPUPromptVectorStore as LlamaVectorStore

SERVER_DIM = 384
"""The dimension of the server's collections (the bundled MiniLM's)."""
_LLAMAINDEX_TESTS = Path(__file__).resolve().parents[1] / "llamaindex"


def _collection(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _load(name: str, path: Path) -> ModuleType:
    """A test module loaded by path (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------- LangChain
class TestGPUPromptVectorStoreRemote(VectorStoreIntegrationTests):
    """The standard suite on a server collection (one per test, dropped after it)."""

    @staticmethod
    def get_embeddings() -> Embeddings:
        # The suite's own fake, at the dimension of the server's collections (they take no other).
        return DeterministicFakeEmbedding(size=SERVER_DIM)

    @pytest.fixture()
    def vectorstore(self, live: Any) -> Iterator[VectorStore]:
        store = GPUPromptVectorStore(self.get_embeddings(), base_url=live.url, collection=_collection("lc"))
        try:
            yield store
        finally:
            store.delete()  # drops the server collection

    @property
    def has_sync(self) -> bool:
        return True

    @property
    def has_async(self) -> bool:
        return True

    @property
    def has_get_by_ids(self) -> bool:
        return True


@pytest.fixture(scope="module")
def products() -> list[Document]:
    from gpuprompt.apps.demo import catalogue

    return [Document(id=p["id"], page_content=p["text"], metadata=p["metadata"]) for p in catalogue(40)]


def _scored(pairs: list[tuple[Document, float]]) -> list[tuple[str | None, float]]:
    return [(doc.id, round(score, 5)) for doc, score in pairs]


async def test_a_remote_store_answers_as_the_same_store_in_process(live: Any, products: list[Document]) -> None:
    embeddings = GPUPromptEmbeddings(base_url=live.url)  # the very same vectors for both stores
    local = GPUPromptVectorStore(embeddings)
    remote = GPUPromptVectorStore(embeddings, base_url=live.url, collection=_collection("lc"))
    try:
        for store in (local, remote):
            assert store.add_documents(products) == [d.id for d in products]
        assert isinstance(remote.index, RemoteIndex) and len(remote.index) == 40
        assert remote.index.embedder == embeddings.embedder.identity  # the embedder record travelled
        for query, filter in (("warm wool coat", None), ("summer dress", {"price": {"$lt": 100}}),
                              ("jeans", {"$or": [{"colour": "navy"}, {"material": "cotton"}]})):
            assert _scored(remote.similarity_search_with_score(query, k=6, filter=filter)) == _scored(
                local.similarity_search_with_score(query, k=6, filter=filter))
            assert _scored(await remote.asimilarity_search_with_relevance_scores(query, k=3, filter=filter)) == _scored(
                local.similarity_search_with_relevance_scores(query, k=3, filter=filter))
            assert [d.id for d in remote.max_marginal_relevance_search(query, k=4, fetch_k=12, lambda_mult=0.3,
                                                                       filter=filter)] == [
                d.id for d in local.max_marginal_relevance_search(query, k=4, fetch_k=12, lambda_mult=0.3, filter=filter)]
        vector = embeddings.embed_query("silk shirt")
        assert [d.id for d in await remote.amax_marginal_relevance_search_by_vector(vector, k=3)] == [
            d.id for d in local.max_marginal_relevance_search_by_vector(vector, k=3)]
        retriever = remote.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 8})
        assert [d.id for d in retriever.invoke("linen")] == [
            d.id for d in local.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 8}).invoke("linen")]
        for store in (local, remote):
            assert store.delete([products[0].id, "missing"])
            assert await store.aadd_documents([Document(id=products[1].id, page_content="renamed", metadata={"x": 1})])
        assert remote.get_by_ids([products[1].id, products[0].id, products[2].id]) == local.get_by_ids(
            [products[1].id, products[0].id, products[2].id])
        assert len(remote.index) == 39
    finally:
        remote.delete()


def test_remote_construction_rules(live: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = DeterministicFakeEmbedding(size=SERVER_DIM)
    monkeypatch.delenv("GPUPROMPT_URL", raising=False)
    monkeypatch.delenv("GPUPROMPT_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="collection='kb'.*but no server"):
        GPUPromptVectorStore(fake, collection="kb")
    with pytest.raises(ConfigurationError, match="but no collection"):
        GPUPromptVectorStore(fake, base_url=live.url)
    with pytest.raises(ConfigurationError, match=r"in-process option\(s\) \['device', 'index_factory'\]"):
        GPUPromptVectorStore(fake, base_url=live.url, collection="kb", device="cpu", index_factory="HNSW32")
    with pytest.raises(ConfigurationError, match="index= together with a server collection"):
        GPUPromptVectorStore(fake, index=RemoteIndex(live.url, collection="kb"), collection="kb")
    with pytest.raises(ConfigurationError, match="'api_key' but no server"):
        GPUPromptVectorStore(fake, api_key="secret")
    with pytest.raises(ConfigurationError, match="in-process option"):
        LlamaVectorStore(base_url=live.url, collection="kb", backend="faiss")
    with pytest.raises(ConfigurationError, match="but no server"):
        LlamaVectorStore(collection="kb")
    # GPUPROMPT_URL alone keeps the index in process (remote embeddings may feed it); a collection
    # name makes the store remote, on that server.
    monkeypatch.setenv("GPUPROMPT_URL", live.url)
    assert GPUPromptVectorStore(fake).index is None
    named = GPUPromptVectorStore(fake, collection="kb")
    assert isinstance(named.index, RemoteIndex) and named.index.client.config.base_url == live.url
    li = LlamaVectorStore(collection="kb")
    assert isinstance(li.client, RemoteIndex) and li.base_url == live.url
    assert LlamaVectorStore().client is None


def test_a_dimension_the_server_does_not_hold_is_refused(live: Any) -> None:
    store = GPUPromptVectorStore(DeterministicFakeEmbedding(size=6), base_url=live.url, collection=_collection("lc"))
    with pytest.raises(DimensionMismatchError, match="must have dimension 384"):
        store.add_texts(["foo"])
    li = LlamaVectorStore(base_url=live.url, collection=_collection("li"), dim=8)
    from llama_index.core.schema import TextNode

    with pytest.raises(ConfigurationError, match=r"dim=384.*asked for dim=8"):
        li.add([TextNode(text="x", id_="x", embedding=[0.1] * 8)])


def test_worker_processes_use_the_server_collection_and_import_no_torch(live: Any) -> None:
    lc_name, li_name = _collection("lc"), _collection("li")
    code = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptVectorStore
        from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptVectorStore as LlamaStore
        from llama_index.core.schema import TextNode
        from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode

        out = {{}}
        store = GPUPromptVectorStore(GPUPromptEmbeddings(), collection={lc_name!r})
        store.add_texts(["red summer dress", "blue denim jeans", "red wool scarf"], ids=["a", "b", "c"],
                        metadatas=[{{"colour": "red"}}, {{"colour": "blue"}}, {{"colour": "red"}}])
        out["lc_filtered"] = [d.id for d in store.similarity_search("something to wear", k=3, filter={{"colour": "red"}})]
        out["lc_mmr"] = [d.id for d in store.max_marginal_relevance_search("red", k=2, fetch_k=3)]
        out["lc_async"] = [d.id for d in asyncio.run(store.asimilarity_search("jeans", k=1))]
        embed = GPUPromptEmbedding()
        li = LlamaStore(collection={li_name!r})
        texts = ["a linen shirt", "a silk gown"]
        li.add([TextNode(text=t, id_=f"n{{i}}", embedding=v) for i, (t, v) in
                enumerate(zip(texts, embed.get_text_embedding_batch(texts)))])
        query = VectorStoreQuery(query_embedding=embed.get_query_embedding("evening gown"), similarity_top_k=1)
        out["li"] = li.query(query).ids
        out["li_mmr"] = asyncio.run(li.aquery(VectorStoreQuery(query_embedding=query.query_embedding,
                                    similarity_top_k=2, mode=VectorStoreQueryMode.MMR))).ids
        heavy = ("torch", "transformers", "sentence_transformers", "vllm", "faiss", "safetensors", "accelerate")
        out["heavy"] = sorted(m for m in heavy if m in sys.modules)
        print(json.dumps(out))
        """
    )
    env = {**os.environ, "GPUPROMPT_URL": live.url, "HF_HUB_OFFLINE": "1"}
    env.pop("GPUPROMPT_API_KEY", None)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    assert out["lc_filtered"] in (["a", "c"], ["c", "a"]) and out["lc_async"] == ["b"] and len(out["lc_mmr"]) == 2
    assert out["li"] == ["n1"] and sorted(out["li_mmr"]) == ["n0", "n1"]
    # The records live on the server, where any other process sees them.
    shared = RemoteIndex(live.url, collection=lc_name)
    assert sorted(shared.ids()) == ["a", "b", "c"]
    shared.clear()
    RemoteIndex(live.url, collection=li_name).clear()


# ---------------------------------------------------------------------------------------- LlamaIndex
# The LlamaIndex contract tests that run against the `store` fixture, collected here under a store on
# a server collection (as tests/llamaindex/test_li_vector_store_milvus.py does with Milvus); their
# session fixtures come from tests/llamaindex/conftest.py.
_li_fixtures = _load("_li_conftest_for_remote", _LLAMAINDEX_TESTS / "conftest.py")
li_embed = _li_fixtures.li_embed
catalogue_nodes = _li_fixtures.catalogue_nodes
contract = _load("_li_vector_store_contract_for_remote", _LLAMAINDEX_TESTS / "test_li_vector_store.py")
for _name, _test in vars(contract).items():
    if _name.startswith("test_") and "store" in inspect.signature(_test).parameters:
        globals()[f"{_name}_remote"] = _test
nodes = contract.nodes


@pytest.fixture
def store(nodes: list[Any], live: Any) -> Iterator[LlamaVectorStore]:
    store = LlamaVectorStore(base_url=live.url, collection=_collection("li"))
    store.add(nodes)
    yield store
    store.clear()  # drops the server collection
    store.client.close()


def test_the_contract_tests_were_found() -> None:
    found = [name for name in globals() if name.startswith("test_") and name.endswith("_remote")]
    assert len(found) >= 13, found


def test_the_store_wraps_a_remote_index(store: LlamaVectorStore) -> None:
    assert isinstance(store.client, RemoteIndex) and store.dim == SERVER_DIM


async def test_a_query_engine_over_a_server_collection(live: Any) -> None:
    from llama_index.core import Document as LlamaDocument
    from llama_index.core import StorageContext, VectorStoreIndex

    from llamaindex_gpuprompt import GPUPromptEmbedding

    store = LlamaVectorStore(base_url=live.url, collection=_collection("li"))
    embed = GPUPromptEmbedding(base_url=live.url)
    documents = [LlamaDocument(text=t, doc_id=f"d{i}") for i, t in enumerate(
        ["Returns are free within 30 days.", "Delivery to Norway takes four days.", "The Aurora dress is red."])]
    try:
        index = VectorStoreIndex.from_documents(documents, storage_context=StorageContext.from_defaults(
            vector_store=store), embed_model=embed)
        retriever = index.as_retriever(similarity_top_k=1)
        assert (await retriever.aretrieve("How long does shipping to Norway take?"))[0].node.ref_doc_id == "d1"
        again = VectorStoreIndex.from_vector_store(
            LlamaVectorStore(base_url=live.url, collection=store.collection), embed_model=embed)
        assert again.as_retriever(similarity_top_k=1).retrieve("colour of the dress")[0].node.ref_doc_id == "d2"
        await asyncio.to_thread(store.delete, "d2")
        assert len(store.client) == 2
    finally:
        store.clear()
