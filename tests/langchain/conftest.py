"""Session fixtures for the LangChain adapter tests: one embedder and one engine per backend."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def lc_embeddings():
    """GPUPromptEmbeddings on the bundled MiniLM, loaded once for the session."""
    from langchain_gpuprompt import GPUPromptEmbeddings

    embeddings = GPUPromptEmbeddings()
    embeddings.embedder.load()
    return embeddings
