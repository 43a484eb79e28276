"""Server test fixtures: the app under uvicorn on 127.0.0.1 (a free port) in a background thread.

The server shares the session's loaded models (the ``embedder`` fixture and the Runtime's
transformers engine), so starting one costs no model load.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from server_helpers import LiveServer, start_server


@pytest.fixture(scope="session")
def server_llm():
    """The Runtime's transformers engine for the bundled SmolLM2 (shared with other suites)."""
    from gpuprompt import get_runtime

    return get_runtime().llm(backend="transformers").load()


@pytest.fixture(scope="session")
def live(embedder, server_llm) -> Iterator[LiveServer]:
    """The default server: no API key, default limits."""
    server = start_server(embedder=embedder, llm=server_llm)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def http(live: LiveServer) -> Iterator[httpx.Client]:
    """A raw HTTP client for the default server."""
    with live.client() as client:
        yield client


@pytest.fixture(scope="session")
def openai_client(live: LiveServer):
    """The official ``openai`` client pointed at the default server."""
    import openai

    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=120.0)
    yield client
    client.close()
