"""Benchmark scenario registry, runner and report writer (JSON + PNG per scenario).

A scenario measures one stage of ours against the stock LangChain / LlamaIndex classes in the same
run, repeats each measurement (medians of ``ctx.runs`` runs) and reports ratios and its goal.
"""

from __future__ import annotations

import json
import logging
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuprompt.errors import ConfigurationError

__all__ = [
    "BenchContext",
    "Chart",
    "Scenario",
    "ScenarioResult",
    "run_scenario",
    "scenario",
    "registered",
    "write_summary",
]

logger = logging.getLogger(__name__)


@dataclass
class Chart:
    """What the scenario's PNG shows.

    Attributes:
        kind: ``"bar"`` (one bar per label) or ``"line"`` (one line per series over ``x``).
        title: chart title.
        ylabel: y-axis label.
        labels: bar labels (bar charts).
        values: bar heights (bar charts).
        x: x values (line charts).
        xlabel: x-axis label (line charts).
        series: name -> y values (line charts).
        baseline: a dashed reference line (bar charts), for example 1.0 for ratios.
        log_scale: a logarithmic y axis (for values spanning orders of magnitude).
    """

    kind: str
    title: str
    ylabel: str
    labels: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    x: list[float] = field(default_factory=list)
    xlabel: str = ""
    series: dict[str, list[float]] = field(default_factory=dict)
    log_scale: bool = False
    baseline: float | None = None


@dataclass
class ScenarioResult:
    """One scenario's outcome.

    Attributes:
        metrics: medians over runs (throughputs, latencies, ratios), flat name -> number.
        goal: the goal in words, for example ``"ours >= 5x stock throughput"``.
        goal_met: whether the medians meet the goal.
        runs: metric name -> the value of each run (the medians' raw material).
        chart: what to draw in the PNG.
        notes: anything a reader needs to interpret the figures.
        ratio: the headline ratio, ours over stock (higher is better), for the summary chart.
        ratio_label: what the ratio compares, for example ``"throughput vs stock"``.
        extra_charts: more charts, name -> chart, written as ``<scenario>-<name>.png``.
    """

    metrics: dict[str, float]
    goal: str
    goal_met: bool
    runs: dict[str, list[float]] = field(default_factory=dict)
    chart: Chart | None = None
    notes: str = ""
    ratio: float | None = None
    ratio_label: str = ""
    extra_charts: dict[str, Chart] = field(default_factory=dict)


@dataclass
class BenchContext:
    """What a scenario gets: run size, repeat count, output folder.

    Attributes:
        quick: a smaller, faster variant (for CI smoke and ``bench all --quick``).
        runs: repeats per measurement; report medians.
        out_dir: where JSON and PNG files go.
    """

    quick: bool = False
    runs: int = 3
    out_dir: Path = Path("bench-results")

    def repeat(self, measure: Callable[[], dict[str, float]]) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Call ``measure`` ``runs`` times; return (medians, per-run values) per metric."""
        samples: dict[str, list[float]] = {}
        for _ in range(self.runs):
            for name, value in measure().items():
                samples.setdefault(name, []).append(float(value))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        return medians, samples


@dataclass(frozen=True)
class Scenario:
    """A registered scenario."""

    name: str
    description: str
    fn: Callable[[BenchContext], ScenarioResult]


_SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, description: str) -> Callable[[Callable[[BenchContext], ScenarioResult]], Callable[[BenchContext], ScenarioResult]]:
    """Register a scenario function under ``name``."""

    def register(fn: Callable[[BenchContext], ScenarioResult]) -> Callable[[BenchContext], ScenarioResult]:
        _SCENARIOS[name] = Scenario(name, description, fn)
        return fn

    return register


def registered() -> dict[str, Scenario]:
    """The scenarios registered so far, by name (:func:`gpuprompt.apps.bench.scenarios` loads them all first)."""
    return dict(_SCENARIOS)


def environment() -> dict[str, Any]:
    """Device and library versions, recorded in every report."""
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import os

        info["cpu_count"] = os.cpu_count()
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    for module in ("transformers", "sentence_transformers", "faiss", "vllm", "langchain_core", "llama_index.core"):
        try:
            mod = __import__(module, fromlist=["__version__"])
            info[module] = getattr(mod, "__version__", "?")
        except Exception:
            info[module] = None
    return info


def run_scenario(name: str, ctx: BenchContext) -> ScenarioResult:
    """Run one registered scenario (:func:`gpuprompt.apps.bench.scenarios` registers them all), write
    ``<out>/<name>.json`` and ``<out>/<name>.png``, return its result."""
    table = registered()
    if name not in table:
        raise ConfigurationError(f"unknown bench scenario {name!r}; choose from {sorted(table)} or 'all'.")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result = table[name].fn(ctx)
    elapsed = time.perf_counter() - started
    report = {
        "scenario": name,
        "description": table[name].description,
        "quick": ctx.quick,
        "runs": ctx.runs,
        "seconds": round(elapsed, 1),
        "environment": environment(),
        **asdict(result),
    }
    (ctx.out_dir / f"{name}.json").write_text(json.dumps(report, indent=2, default=str))
    charts = {name: result.chart} if result.chart is not None else {}
    charts.update({f"{name}-{extra}": chart for extra, chart in result.extra_charts.items()})
    for stem, chart in charts.items():
        try:
            draw(chart, ctx.out_dir / f"{stem}.png")
        except ImportError:
            logger.warning("matplotlib is not installed: no PNG for %s (pip install 'gpuprompt[bench]')", stem)
    return result


def write_summary(results: dict[str, ScenarioResult], ctx: BenchContext) -> Path:
    """Write ``summary.md`` (one row per scenario) and ``summary.png`` (headline ratios).

    Returns:
        The path of the Markdown summary.
    """
    env = environment()
    lines = [
        "# gpuprompt bench summary",
        "",
        f"Device: {env.get('cuda') or 'CPU'} ({env.get('cpu_count')} cores); torch {env.get('torch')}, "
        f"transformers {env.get('transformers')}, vLLM {env.get('vllm')}, faiss {env.get('faiss')}. "
        f"Medians of {ctx.runs} runs{' (quick)' if ctx.quick else ''}.",
        "",
        "| scenario | headline | ratio | goal | met |",
        "|---|---|---|---|---|",
    ]
    for name, result in results.items():
        ratio = f"{result.ratio:.2f}x" if result.ratio is not None else "-"
        met = "yes" if result.goal_met else "**no**"
        lines.append(f"| {name} | {result.ratio_label or '-'} | {ratio} | {result.goal} | {met} |")
    lines.append("")
    for name in results:
        if (ctx.out_dir / f"{name}.png").exists():
            lines.append(f"![{name}]({name}.png)")
    path = ctx.out_dir / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    ratios = {name: r.ratio for name, r in results.items() if r.ratio is not None}
    if ratios:
        try:
            values = list(ratios.values())
            wide = min(values) > 0 and max(values) / min(values) > 30
            draw(Chart(kind="bar", title="gpuprompt vs stock (higher is better)",
                       ylabel="ratio (x, log scale)" if wide else "ratio (x)",
                       labels=list(ratios), values=values, baseline=1.0, log_scale=wide),
                 ctx.out_dir / "summary.png")
        except ImportError:
            logger.warning("matplotlib is not installed: no summary.png")
    return path


def draw(chart: Chart, path: Path) -> None:
    """Render ``chart`` to a PNG with matplotlib (headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if chart.kind == "bar":
        colours = ["#2f80ed"] * len(chart.values) if chart.baseline is not None else (
            ["#9aa5b1"] + ["#2f80ed"] * (len(chart.values) - 1))
        bars = ax.bar(chart.labels, chart.values, color=colours)
        if chart.baseline is not None:
            ax.axhline(chart.baseline, color="#9aa5b1", linestyle="--", linewidth=1)
        for bar, value in zip(bars, chart.values):
            ax.annotate(f"{value:,.1f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=9)
        ax.tick_params(axis="x", labelsize=8, labelrotation=15 if len(chart.labels) > 4 else 0)
    else:
        for label, ys in chart.series.items():
            ax.plot(chart.x, ys, marker="o", label=label)
        ax.set_xlabel(chart.xlabel)
        ax.legend()
    if chart.log_scale:
        ax.set_yscale("log")
    ax.set_title(chart.title)
    ax.set_ylabel(chart.ylabel)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
