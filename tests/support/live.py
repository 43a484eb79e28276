"""A live ``gpuprompt serve`` app under uvicorn on a loopback port (for the tests where the socket
matters: disconnects, 413s, streaming, other processes), vLLM's own OpenAI server in a subprocess,
and bounded polling. The one copy used
by tests/server and tests/remote; where a socket adds nothing, use :mod:`support.asgi`."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

STARTUP_TIMEOUT_S = 60.0


class LiveServer:
    """A uvicorn server running an app on a loopback port, in a daemon thread."""

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
        """The app's server state (components, metrics, gate)."""
        return self.app.state.gpuprompt

    def client(self, **options: Any) -> httpx.Client:
        options.setdefault("timeout", 120.0)
        return httpx.Client(base_url=self.url, **options)


def start_server(**kwargs: Any) -> LiveServer:
    """Build an app with ``create_app(**kwargs)`` and serve it on a free loopback port."""
    from gpuprompt.server import create_app

    return LiveServer(create_app(**kwargs)).start()


def metric_samples(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The server's ``/metrics``, parsed by prometheus_client: ``(name, sorted labels) -> value``."""
    from prometheus_client.parser import text_string_to_metric_families

    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def wait_until(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def vllm_api_server(model: str, log: Path, *args: str, timeout: float = 400.0) -> Iterator[str]:
    """vLLM's own OpenAI server (``vllm.entrypoints.openai.api_server``) for ``model`` on a free
    loopback port, with ``args`` added; yields its URL once ``/v1/models`` answers, and stops it
    (SIGTERM, then SIGKILL of its process group) on exit. Fails the test with the log's tail when
    the server exits or never answers."""
    import pytest

    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--port", str(port), "--host", "127.0.0.1", "--enforce-eager", *args]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            return True
        try:
            return httpx.get(f"{url}/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        if not wait_until(up, timeout, interval=0.5) or process.poll() is not None:
            pytest.fail(f"vLLM's server for {model} did not come up:\n{log.read_text(errors='replace')[-4000:]}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(30)
