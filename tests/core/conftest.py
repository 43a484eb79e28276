"""Session fixtures for the core LLM tests: one engine per backend for the whole session.

Both engines serve at most 4 requests at a time, so that a few requests are enough to fill them
(the cancellation and priority tests need a full engine) and float32 weights, so that greedy
outputs do not depend on how requests were batched.
"""

from __future__ import annotations

import importlib.util

import pytest
from support.engines import ENGINE_OPTIONS
from support.engines import vllm_engine as _session_vllm_engine

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="session")
def tf_engine():
    """The bundled SmolLM2 on the transformers backend (CPU), loaded once."""
    from gpuprompt.llm import LLMEngine

    engine = LLMEngine(backend="transformers", **ENGINE_OPTIONS).load()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def vllm_engine():
    """The bundled SmolLM2 on vLLM (the CPU build here), started once (~30 s): the Runtime's engine,
    shared with the LangChain, LlamaIndex and remote suites (support.engines)."""
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed")
    return _session_vllm_engine()


@pytest.fixture(params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request: pytest.FixtureRequest):
    """Each backend's session engine in turn."""
    return request.getfixturevalue("tf_engine" if request.param == "transformers" else "vllm_engine")


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory: pytest.TempPathFactory):
    """Two vLLM OpenAI servers for the bundled SmolLM2 (started together, one core each, ~45 s),
    shared by the fleet tests (vllm-router in front) and the remote backend's vLLM-server checks
    (which use whichever is alive: the fleet's last test kills one)."""
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed")
    import os

    from support.vllm_servers import start_vllm, wait_ready

    from gpuprompt.models import resolve_chat_model

    model = resolve_chat_model(None)
    logs = tmp_path_factory.mktemp("vllm-pair")
    cpus = sorted(os.sched_getaffinity(0))
    servers = []
    try:
        for index in range(2):
            servers.append(start_vllm(index, cpus[index % len(cpus)], model, logs))
        wait_ready(servers, 400)
        yield servers
    finally:
        for server in servers:
            server.stop()
