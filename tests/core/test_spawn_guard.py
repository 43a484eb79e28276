"""A script without ``if __name__ == "__main__":`` must not run twice when it starts an engine.

vLLM spawns its engine core; by default a spawned child re-imports the parent's ``__main__`` and so
re-runs an unguarded script's body (its side effects twice, throughput down ~3x).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None

SPAWN_SCRIPT = """
import multiprocessing, os, sys, time
with open(os.environ["MARK_FILE"], "a") as handle:
    handle.write(f"{os.getpid()}\\n")
from gpuprompt.llm._spawn import no_main_reimport
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
        [sys.executable, str(script)], env=full_env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path
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


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_chat_model_in_an_unguarded_script_runs_its_body_once(tmp_path: Path) -> None:
    body = """
    import os
    with open(os.environ["MARK_FILE"], "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    from langchain_gpuprompt import ChatGPUPrompt
    llm = ChatGPUPrompt(max_tokens=4, backend="vllm", device="cpu", engine_kwargs={"max_num_seqs": 2})
    print("REPLY", repr(llm.invoke("Say hi").content))
    """
    done, marks = _run(tmp_path, body, {"VLLM_CPU_KVCACHE_SPACE": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "REPLY" in done.stdout
    assert len(marks) == 1, f"the script body ran {len(marks)} times"
    assert "EngineDeadError" not in done.stderr, done.stderr[-4000:]
