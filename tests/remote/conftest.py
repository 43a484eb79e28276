"""Remote-mode fixtures: real ``gpuprompt serve`` apps under uvicorn on loopback ports.

The servers share the session's loaded models (the ``embedder`` fixture and the Runtime's
transformers engine), so the remote classes and the in-process ones run the very same models and
their answers can be compared exactly. Each server is started and stopped by its fixture.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.live import LiveServer, start_server, wait_until  # noqa: F401 - the shared server class


@pytest.fixture(scope="session")
def poll() -> Callable[..., bool]:
    """:func:`wait_until`, for the test modules (a conftest is not imported by name)."""
    return wait_until


@pytest.fixture(scope="session")
def remote_llm_engine():
    """The Runtime's transformers engine for the bundled SmolLM2: in-process reference and the
    servers' engine at once."""
    from gpuprompt import get_runtime

    return get_runtime().llm(backend="transformers").load()


@pytest.fixture(scope="session")
def live(embedder, remote_llm_engine) -> Iterator[LiveServer]:
    """The default server: no API key, default limits."""
    server = start_server(embedder=embedder, llm=remote_llm_engine)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def busy(embedder, remote_llm_engine) -> Iterator[LiveServer]:
    """A server that serves one model request at a time (``max_in_flight=1``, ``Retry-After: 2``)."""
    server = start_server(embedder=embedder, llm=remote_llm_engine, max_in_flight=1, retry_after_s=2)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def live_keyed(embedder, remote_llm_engine) -> Iterator[LiveServer]:
    """A server that wants the API key ``"sesame"``."""
    server = start_server(embedder=embedder, llm=remote_llm_engine, api_key="sesame")
    yield server
    server.stop()


@pytest.fixture
def dead_url() -> str:
    """A loopback address where nothing listens (a port bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A loopback server that accepts connections and never answers (a hung server)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            accepted.append(connection)  # held open, never read or answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for connection in accepted:
        connection.close()
    listener.close()


_HERE = str(Path(__file__).resolve().parent)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in this folder is marked ``remote`` (``pytest -m remote`` runs them alone)."""
    for item in items:
        if str(item.path).startswith(_HERE):
            item.add_marker(pytest.mark.remote)
