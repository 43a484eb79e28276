"""Session fixtures for the core LLM tests: one engine per backend for the whole session.

Both engines serve at most 4 requests at a time, so that a few requests are enough to fill them
(the cancellation and priority tests need a full engine) and float32 weights, so that greedy
outputs do not depend on how requests were batched.
"""

from __future__ import annotations

import importlib.util

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None

ENGINE_OPTIONS = {"device": "cpu", "max_num_seqs": 4, "dtype": "float32", "max_model_len": 2048}


@pytest.fixture(scope="session")
def tf_engine():
    """The bundled SmolLM2 on the transformers backend (CPU), loaded once."""
    from gpuprompt.llm import LLMEngine

    engine = LLMEngine(backend="transformers", **ENGINE_OPTIONS).load()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def vllm_engine():
    """The bundled SmolLM2 on vLLM (the CPU build here), started once (~30 s)."""
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed")
    from gpuprompt.llm import LLMEngine

    engine = LLMEngine(backend="vllm", **ENGINE_OPTIONS).load()
    yield engine
    engine.close()


@pytest.fixture(params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request: pytest.FixtureRequest):
    """Each backend's session engine in turn."""
    return request.getfixturevalue("tf_engine" if request.param == "transformers" else "vllm_engine")
