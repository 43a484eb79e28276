"""Session fixtures for the LangChain adapter tests: one embedder and one engine per backend."""

from __future__ import annotations

import importlib.util

import pytest
from support.engines import LC_VLLM


@pytest.fixture(scope="session")
def lc_embeddings():
    """GPUPromptEmbeddings on the bundled MiniLM, loaded once for the session."""
    from langchain_gpuprompt import GPUPromptEmbeddings

    embeddings = GPUPromptEmbeddings()
    embeddings.embedder.load()
    return embeddings


@pytest.fixture(scope="session")
def lc_chat():
    """ChatGPUPrompt on the transformers backend (bundled SmolLM2), its engine started once.

    The standard suites build ``ChatGPUPrompt(backend="transformers")`` per test; the Runtime hands
    them this same engine.
    """
    from langchain_gpuprompt import ChatGPUPrompt

    chat = ChatGPUPrompt(backend="transformers", max_tokens=8)
    _ = chat.engine
    return chat


@pytest.fixture(scope="session")
def lc_chat_vllm():
    """ChatGPUPrompt on vLLM (its CPU build here), started once (~30 s); skipped without vLLM."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from langchain_gpuprompt import ChatGPUPrompt

    chat = ChatGPUPrompt(**LC_VLLM, max_tokens=48)  # the session's one vLLM engine
    _ = chat.engine
    return chat
