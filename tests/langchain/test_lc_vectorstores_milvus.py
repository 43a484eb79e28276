"""The langchain-tests standard vector-store suite with a MilvusIndex (Milvus Lite) under
GPUPromptVectorStore: the adapter takes any IndexLike and never asks which."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from langchain_gpuprompt import GPUPromptVectorStore

pytest.importorskip("pymilvus")
if importlib.util.find_spec("milvus_lite") is None:
    pytest.skip("milvus-lite is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def milvus_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.getbasetemp() / "lc_milvus.db")


def _store(embeddings, uri: str, **options) -> GPUPromptVectorStore:
    from gpuprompt.index import MilvusIndex

    dim = len(embeddings.embed_query("dimension"))
    index = MilvusIndex(dim, uri=uri, collection=f"lc_{uuid.uuid4().hex}", **options)
    return GPUPromptVectorStore(embeddings, index=index)


class TestGPUPromptVectorStoreOnMilvus(VectorStoreIntegrationTests):
    @pytest.fixture()
    def vectorstore(self, milvus_uri: str) -> Iterator[VectorStore]:
        store = _store(self.get_embeddings(), milvus_uri)
        try:
            yield store
        finally:
            store.delete()
            store.index.close()

    @property
    def has_sync(self) -> bool:
        return True

    @property
    def has_async(self) -> bool:
        return True

    @property
    def has_get_by_ids(self) -> bool:
        return True


def test_filters_mmr_and_save_local_on_milvus(milvus_uri: str, tmp_path) -> None:
    from langchain_core.embeddings import DeterministicFakeEmbedding

    embeddings = DeterministicFakeEmbedding(size=6)
    store = _store(embeddings, milvus_uri, scalar_fields={"color": "str"})
    docs = [Document(page_content=f"item {i}", metadata={"color": ["red", "blue"][i % 2], "price": i}) for i in range(10)]
    store.add_documents(docs, ids=[f"p{i}" for i in range(10)])
    found = store.similarity_search("item 3", k=10, filter={"color": "red", "price": {"$ne": 4}})
    assert sorted(d.id for d in found) == ["p0", "p2", "p6", "p8"]
    assert len(store.max_marginal_relevance_search("item 1", k=3, fetch_k=8, filter={"color": {"$icontains": "BLU"}})) == 3
    store.save_local(tmp_path / "kb")
    loaded = GPUPromptVectorStore.load_local(tmp_path / "kb", embeddings)
    assert sorted(d.id for d in loaded.get_by_ids(["p1", "p9", "nope"])) == ["p1", "p9"]
    assert type(loaded.index).__name__ == "MilvusIndex"
