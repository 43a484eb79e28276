"""langchain-tests standard suites for GPUPromptEmbeddings (unit + integration, real bundled model)."""

from __future__ import annotations

from typing import Any

from langchain_tests.integration_tests import EmbeddingsIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests

from langchain_gpuprompt import GPUPromptEmbeddings


class TestGPUPromptEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[GPUPromptEmbeddings]:
        return GPUPromptEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"device": "auto", "batch_size": 32}


class TestGPUPromptEmbeddingsIntegration(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self) -> type[GPUPromptEmbeddings]:
        return GPUPromptEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {}
