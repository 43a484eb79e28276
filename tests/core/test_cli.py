"""The ``gpuprompt`` command and the bench report writer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprompt.apps.bench import BenchContext, Chart, ScenarioResult, run_scenario, scenario, scenarios, write_summary
from gpuprompt.apps.cli import main
from gpuprompt.errors import ConfigurationError

EXPECTED_SCENARIOS = {
    "embed-concurrency", "context-turns", "search-concurrency", "search-ann", "llm-concurrency",
    "llm-prefix-cache", "lc-retriever", "li-query", "rag-e2e", "gpu-smoke", "embed-quant", "agent-tools",
    "milvus-concurrency", "index-bulk", "multiproc", "rerank", "hybrid", "rag-rerank",
}


def test_every_scenario_is_registered() -> None:
    assert EXPECTED_SCENARIOS <= set(scenarios())


def test_bench_list_and_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in EXPECTED_SCENARIOS)
    assert main(["bench", "no-such-scenario"]) == 2
    assert "unknown scenario 'no-such-scenario'" in capsys.readouterr().err


@scenario("test-arith", "a tiny scenario used by the report-writer test")
def _arith(ctx: BenchContext) -> ScenarioResult:
    values = iter([3.0, 1.0, 2.0])
    metrics, runs = ctx.repeat(lambda: {"x": next(values)})
    return ScenarioResult(metrics=metrics, runs=runs, goal="x >= 2", goal_met=metrics["x"] >= 2, ratio=metrics["x"],
                          ratio_label="x", chart=Chart(kind="bar", title="t", ylabel="y", labels=["a"], values=[1.0]))


def test_reports_take_medians_and_write_json_png_summary(tmp_path: Path) -> None:
    ctx = BenchContext(runs=3, out_dir=tmp_path)
    result = run_scenario("test-arith", ctx)
    assert result.metrics == {"x": 2.0} and result.runs == {"x": [3.0, 1.0, 2.0]}
    report = json.loads((tmp_path / "test-arith.json").read_text())
    assert report["metrics"]["x"] == 2.0 and report["goal_met"] is True
    assert report["environment"]["torch"]
    assert (tmp_path / "test-arith.png").stat().st_size > 1000
    summary = write_summary({"test-arith": result}, ctx).read_text()
    assert "| test-arith | x | 2.00x | x >= 2 | yes |" in summary
    assert (tmp_path / "summary.png").is_file()
    with pytest.raises(ConfigurationError, match="unknown bench scenario"):
        run_scenario("nope", ctx)


def test_console_script_help() -> None:
    out = subprocess.run([sys.executable, "-m", "gpuprompt.apps.cli", "serve", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--llm-backend" in out and "--api-key" in out
    assert "--max-collections" in out and "--max-collection-records" in out


def test_load_helpers_keep_order_and_bound_concurrency() -> None:
    import asyncio
    import threading

    from gpuprompt.apps.bench._load import task_load, thread_load

    active, peak = 0, 0
    lock = threading.Lock()

    def call(x: int) -> int:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        threading.Event().wait(0.01)
        with lock:
            active -= 1
        return x * 2

    load = thread_load(call, list(range(12)), 3)
    assert load.results == [x * 2 for x in range(12)] and peak <= 3
    assert load.per_s > 0 and 0 < load.p50_s <= load.p95_s

    async def acall(x: int) -> int:
        await asyncio.sleep(0.01)
        return x + 1

    assert task_load(acall, list(range(6)), 2).results == [1, 2, 3, 4, 5, 6]


def test_bench_runs_several_named_scenarios_and_writes_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario("test-arith-b", "the same tiny scenario under a second name")(_arith)
    assert main(["bench", "test-arith", "test-arith-b", "test-arith", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("== test-arith ") == 1 and out.count("== test-arith-b ") == 1
    summary = (tmp_path / "summary.md").read_text()
    assert "| test-arith |" in summary and "| test-arith-b |" in summary
    assert main(["bench", "test-arith", "no-such-scenario"]) == 2
