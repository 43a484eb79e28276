"""The peer embedding servers of ``embed-peer``: infinity-emb installed as a user installs it (its own
virtual environment under a cache folder, reused), its ONNX export of the bundled MiniLM, and a
server process measured from ``/proc`` (CPU time and resident memory of its whole process tree).

Nothing here imports torch: the bench's parent process stays a light HTTP client.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuprompt.errors import ConfigurationError, DependencyError, EngineError

__all__ = [
    "INFINITY_REQUIREMENTS",
    "ServerProcess",
    "bench_cache",
    "infinity_onnx",
    "infinity_venv",
    "machine_busy_s",
    "tree_cpu_s",
    "tree_rss_bytes",
]

logger = logging.getLogger("gpuprompt.apps.bench")

INFINITY_REQUIREMENTS = ("torch==2.13.0+cpu", "infinity-emb[server,torch,optimum]==0.0.78")
"""What ``pip install`` gets in infinity's own environment: the CPU torch build (the plain ``torch``
would pull a multi-GB CUDA build) and infinity-emb 0.0.78 with its server, torch and ONNX extras
(it pins sentence-transformers < 4 and numpy < 2, so it cannot share gpuprompt's environment)."""
CACHE_ENV = "GPUPROMPT_BENCH_CACHE"
"""Overrides the bench's cache folder (default ``~/.cache/gpuprompt/bench``)."""
_INSTALL_TIMEOUT_S = 3600
_EXPORT_TIMEOUT_S = 900
_READY = ".gpuprompt-ready"  # written last: a folder without it is a broken install, rebuilt

_EXPORT = """
import sys
from optimum.onnxruntime import ORTModelForFeatureExtraction
from transformers import AutoTokenizer

source, target = sys.argv[1], sys.argv[2]
ORTModelForFeatureExtraction.from_pretrained(source, export=True).save_pretrained(target)
AutoTokenizer.from_pretrained(source).save_pretrained(target)
"""


def bench_cache() -> Path:
    """The bench's cache folder: ``$GPUPROMPT_BENCH_CACHE``, else ``~/.cache/gpuprompt/bench``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/gpuprompt/bench").expanduser()


def _run(command: list[str], what: str, timeout: float, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    if done.returncode != 0:
        raise DependencyError(f"{what} failed (exit {done.returncode}): {' '.join(command)}\n"
                          f"{(done.stderr or done.stdout)[-3000:]}")


def infinity_venv(cache: Path | None = None) -> Path:
    """infinity-emb's virtual environment, installed on first use and reused after.

    Args:
        cache: the bench's cache folder (default :func:`bench_cache`); the environment is its
            ``infinity-venv`` folder (about 1.6 GB).

    Returns:
        The environment's folder (``bin/infinity_emb`` is the server).

    Raises:
        DependencyError: ``python -m venv`` or ``pip install`` failed (the message has pip's output).
    """
    folder = (cache or bench_cache()) / "infinity-venv"
    ready = folder / _READY
    wanted = " ".join(INFINITY_REQUIREMENTS)
    if ready.exists() and ready.read_text().strip() == wanted and (folder / "bin" / "infinity_emb").exists():
        return folder
    if folder.exists():
        shutil.rmtree(folder)  # a half-made or outdated environment
    folder.parent.mkdir(parents=True, exist_ok=True)
    logger.warning("installing %s into %s (once; about 1.6 GB)", wanted, folder)
    _run([sys.executable, "-m", "venv", str(folder)], "creating infinity's virtual environment", 600)
    env = {**os.environ, "DO_NOT_TRACK": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run([str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet", *INFINITY_REQUIREMENTS],
         f"pip install {wanted}", _INSTALL_TIMEOUT_S, env)
    ready.write_text(wanted + "\n")
    return folder


def infinity_onnx(venv: Path, model: str, cache: Path | None = None) -> Path:
    """``model`` exported to ONNX by infinity's own optimum (reused once made).

    infinity's ONNX engine serves only a folder that holds a ``.onnx`` file, and from a local
    folder it must be started inside it with ``--model-id .``.

    Args:
        venv: infinity's environment (:func:`infinity_venv`).
        model: the sentence-transformers folder to export.
        cache: the bench's cache folder.

    Returns:
        The exported folder (``model.onnx``, ``config.json`` and the tokenizer).
    """
    folder = (cache or bench_cache()) / f"onnx-{Path(model).parent.name}-{Path(model).name}"
    ready = folder / _READY
    if ready.exists() and ready.read_text().strip() == model and (folder / "model.onnx").exists():
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    _run([str(venv / "bin" / "python"), "-c", _EXPORT, model, str(folder)], "exporting the model to ONNX",
         _EXPORT_TIMEOUT_S, env)
    ready.write_text(model + "\n")
    return folder


# ---------------------------------------------------------------------- /proc
def _children() -> dict[int, list[int]]:
    table: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        table.setdefault(parent, []).append(int(entry))
    return table


def _tree(pid: int) -> list[int]:
    table, found, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(table.get(current, []))
    return found


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live descendants, plus the
    children they have already waited for."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for member in _tree(pid):
        try:
            with open(f"/proc/{member}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return total / ticks


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and every descendant (``VmRSS`` summed)."""
    total = 0
    for member in _tree(pid):
        try:
            with open(f"/proc/{member}/status", encoding="ascii", errors="replace") as handle:
                line = next((line for line in handle if line.startswith("VmRSS:")), None)
        except OSError:
            continue
        if line is not None:
            total += int(line.split()[1]) * 1024
    return total


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (``/proc/stat``)."""
    with open("/proc/stat", encoding="ascii") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    busy = values[0] + values[1] + values[2] + sum(values[5:8])  # user nice system irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------- one server process
@dataclass
class ServerProcess:
    """One embedding server started alone, waited for, measured and stopped.

    Attributes:
        name: how the report names it.
        command: the command line (its ``--port`` already chosen).
        url: its API root (``http://127.0.0.1:PORT/v1``).
        log: where its output goes.
        cwd: the folder it starts in (None: this one).
        env: its environment.
    """

    name: str
    command: list[str]
    url: str
    log: Path
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    process: subprocess.Popen[bytes] | None = None
    start_s: float = 0.0

    def start(self, timeout: float = 900.0) -> ServerProcess:
        """Start it and wait until ``GET /v1/models`` answers 200.

        Raises:
            EngineError: it exited, or did not answer in ``timeout`` seconds (with its log's tail).
        """
        import httpx

        if not sys.platform.startswith("linux"):
            raise ConfigurationError("embed-peer measures servers through /proc: run it on Linux.")
        started = time.perf_counter()
        with open(self.log, "wb") as handle:
            self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=handle,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise EngineError(f"{self.name} exited ({self.process.returncode}) before answering:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/models", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"{self.name} did not answer GET /v1/models in {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.25)
        self.start_s = time.perf_counter() - started
        return self

    @property
    def pid(self) -> int:
        """The server's process id (the root of its tree)."""
        assert self.process is not None
        return self.process.pid

    def tail(self, chars: int = 3000) -> str:
        """The end of its log."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM its process group, then SIGKILL after 60 s."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
