"""Remote-mode fixtures: real ``gpuprompt serve`` apps under uvicorn on loopback ports.

The servers share the session's loaded models (the ``embedder`` fixture and the Runtime's
transformers engine), so the remote classes and the in-process ones run the very same models and
their answers can be compared exactly. Each server is started and stopped by its fixture.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

STARTUP_TIMEOUT_S = 60.0


class LiveServer:
    """An app served by uvicorn on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    def start(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._socket.close()

    @property
    def state(self) -> Any:
        """The app's server state (its engine, embedder, metrics, gate)."""
        return self.app.state.gpuprompt


def start_server(**options: Any) -> LiveServer:
    """``create_app(**options)`` served on a free loopback port."""
    from gpuprompt.server import create_app

    return LiveServer(create_app(**options)).start()


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass; return whether it became true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


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
