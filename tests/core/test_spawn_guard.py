"""A script without ``if __name__ == "__main__":`` must not run twice when it starts an engine.

vLLM spawns its engine core; by default a spawned child re-imports the parent's ``__main__`` and so
re-runs an unguarded script's body (its side effects twice, throughput down ~3x).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None

SPAWN_SCRIPT = """
import multiprocessing, os, sys, time
with open(os.environ["MARK_FILE"], "a") as handle:
    handle.write(f"{os.getpid()}\\n")
from gpuprompt.llm.backends._spawn import no_main_reimport
context = multiprocessing.get_context("spawn")
if os.environ.get("HIDE_MAIN") == "1":
    with no_main_reimport():
        child = context.Process(target=time.sleep, args=(0,))
        child.start()
else:
    child = context.Process(target=time.sleep, args=(0,))
    child.start()
child.join(60)
print("exit", child.exitcode)
"""


def _run(tmp_path: Path, body: str, env: dict[str, str], timeout: float) -> tuple[subprocess.CompletedProcess, list[str]]:
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(body))
    marks = tmp_path / "marks"
    full_env = {**os.environ, "MARK_FILE": str(marks), "HF_HUB_OFFLINE": "1", **env}
    done = subprocess.run(
        [sys.executable, str(script)], check=False, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path
    )
    return done, marks.read_text().split() if marks.exists() else []


def test_spawned_child_does_not_rerun_an_unguarded_script(tmp_path: Path) -> None:
    done, marks = _run(tmp_path, SPAWN_SCRIPT, {"HIDE_MAIN": "1"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "exit 0" in done.stdout
    assert len(marks) == 1, f"the script body ran {len(marks)} times"


def test_without_the_guard_python_would_rerun_it(tmp_path: Path) -> None:
    # The control: plain spawn re-imports __main__, so the body runs in the child too.
    done, marks = _run(tmp_path, SPAWN_SCRIPT, {"HIDE_MAIN": "0"}, timeout=120)
    assert len(marks) == 2, (marks, done.stderr[-2000:])


# ---------------------------------------------------------------------- orphans
ORPHAN_SCRIPT = """
import multiprocessing, os, sys, time
from gpuprompt.llm.backends._spawn import no_main_reimport
with no_main_reimport():
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
    child.start()
print("CHILDREN", child.pid, flush=True)
time.sleep(600)
"""

# One engine start for two checks: an unguarded script (no ``if __name__ == "__main__":``) that
# starts vLLM through ChatGPUPrompt runs its body once and gets a reply; then its kill -9 leaves no
# engine core behind.
VLLM_UNGUARDED_SCRIPT = """
import os, time
with open(os.environ["MARK_FILE"], "a") as handle:
    handle.write(f"{os.getpid()}\\n")
import psutil
from langchain_gpuprompt import ChatGPUPrompt
llm = ChatGPUPrompt(max_tokens=4, backend="vllm", device="cpu", max_model_len=256,
                    engine_kwargs={"max_num_seqs": 1})
print("REPLY", repr(llm.invoke("Say hi").content), flush=True)
children = psutil.Process().children(recursive=True)
print("CHILDREN", " ".join(str(c.pid) for c in children), flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie is dead
    except FileNotFoundError:
        return True


def _kill_parent_and_check_children(tmp_path: Path, body: str, timeout: float,
                                    printed: list[str] | None = None) -> list[int]:
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "MARK_FILE": str(tmp_path / "marks")}
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env=env, text=True, cwd=tmp_path)
    children: list[int] = []
    try:
        deadline = time.monotonic() + timeout
        assert parent.stdout is not None
        for line in parent.stdout:
            if printed is not None:
                printed.append(line)
            if line.startswith("CHILDREN"):
                children = [int(pid) for pid in line.split()[1:]]
                break
            assert time.monotonic() < deadline, "the parent did not start its children in time"
        assert children, "the parent printed no child pids"
        assert not any(_gone(pid) for pid in children)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 15
        while not all(_gone(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in children if not _gone(pid)]
        assert not left, f"children {left} outlived their SIGKILLed parent"
        return children
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        for pid in children:  # never leave anything behind, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux only")
def test_a_spawned_child_dies_with_its_killed_parent(tmp_path: Path) -> None:
    assert len(_kill_parent_and_check_children(tmp_path, ORPHAN_SCRIPT, timeout=60)) == 1


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux only")
def test_an_unguarded_vllm_script_runs_once_and_its_kill_9_leaves_no_engine_core(tmp_path: Path) -> None:
    # The engine core (and the worker it starts) must not survive: on a GPU it would keep the memory.
    printed: list[str] = []
    children = _kill_parent_and_check_children(tmp_path, VLLM_UNGUARDED_SCRIPT, timeout=600, printed=printed)
    assert len(children) >= 1
    assert any(line.startswith("REPLY") for line in printed), printed
    marks = (tmp_path / "marks").read_text().split()
    assert len(marks) == 1, f"the script body ran {len(marks)} times"
