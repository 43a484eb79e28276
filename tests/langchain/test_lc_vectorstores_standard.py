"""langchain-tests standard suite for GPUPromptVectorStore (sync, async and get_by_ids).

The suite's own DeterministicFakeEmbedding (6-d, hash-seeded) drives it, as the suite requires; the
same store with GPUPromptEmbeddings on the device path is covered in test_lc_vectorstores.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from langchain_gpuprompt import GPUPromptVectorStore


class TestGPUPromptVectorStore(VectorStoreIntegrationTests):
    @pytest.fixture()
    def vectorstore(self) -> Iterator[VectorStore]:
        store = GPUPromptVectorStore(self.get_embeddings())
        try:
            yield store
        finally:
            store.delete()

    @property
    def has_sync(self) -> bool:
        return True

    @property
    def has_async(self) -> bool:
        return True

    @property
    def has_get_by_ids(self) -> bool:
        return True
