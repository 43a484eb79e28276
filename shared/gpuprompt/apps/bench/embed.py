"""Embedding scenarios: concurrent callers (``embed-concurrency``) and history cost per turn
(``context-turns``), each against langchain-huggingface's ``HuggingFaceEmbeddings`` in the same run."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpuprompt.apps.bench._load import in_thread, queries, thread_load
from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario

__all__: list[str] = []


def _stock_embeddings():  # langchain-huggingface, the stock class we compare against
    from langchain_huggingface import HuggingFaceEmbeddings

    from gpuprompt.device import resolve_device
    from gpuprompt.models import resolve_embedding_model

    return HuggingFaceEmbeddings(
        model_name=resolve_embedding_model(None),
        model_kwargs={"device": resolve_device("auto")},
        encode_kwargs={"normalize_embeddings": True},
    )


def _concurrent(call: Callable[[str], object], texts: list[str], threads: int) -> dict[str, float]:
    """Run ``call`` once per text from ``threads`` threads; return throughput and latency p50/p95."""
    load = thread_load(call, texts, threads)
    return {"qps": load.per_s, "p50_ms": load.p50_s * 1000, "p95_ms": load.p95_s * 1000}


def _lone(call: Callable[[str], object], texts: list[str]) -> float:
    """Median latency (ms) of calls made one at a time by a single caller."""
    times = []
    for text in texts:
        started = time.perf_counter()
        call(text)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


@scenario(
    "embed-concurrency",
    "32 threads embed 256 short queries one call each: stock HuggingFaceEmbeddings.embed_query vs "
    "gpuprompt Embedder.embed([q]) (cross-request batching; on CPU also backend='onnx', in a process of its "
    "own), plus the ceiling (SentenceTransformer batches of 32) and the latency of a lone caller.",
)
def embed_concurrency(ctx: BenchContext) -> ScenarioResult:
    from sentence_transformers import SentenceTransformer

    from gpuprompt.embed import Embedder
    from gpuprompt.models import resolve_embedding_model

    n, threads = (128, 32) if ctx.quick else (256, 32)
    stock = _stock_embeddings()
    ours = Embedder(device="auto").load()
    device = ours.device
    raw = SentenceTransformer(resolve_embedding_model(None), device=device)
    warm = queries(32, "warm-up ")
    in_thread(lambda: stock.embed_documents(warm))  # stock torch work never on a long-lived thread
    ours.embed(warm)
    run_id = iter(range(10**6))

    def measure() -> dict[str, float]:
        texts = queries(n, f"run {next(run_id)}: ")  # new texts every run: no cache hit for anyone
        ours.clear_cache()
        stock_fig = _concurrent(stock.embed_query, texts, threads)
        ours.clear_cache()
        ours_fig = _concurrent(lambda q: ours.embed([q]), texts, threads)
        def batches_of_32() -> float:
            started = time.perf_counter()
            for i in range(0, n, 32):
                raw.encode(texts[i : i + 32], normalize_embeddings=True)
            return n / (time.perf_counter() - started)

        ceiling = in_thread(batches_of_32)
        lone_texts = texts[:24]
        ours.clear_cache()
        lone_ours = _lone(lambda q: ours.embed([q]), lone_texts)
        lone_stock = in_thread(lambda: _lone(stock.embed_query, lone_texts))
        onnx: dict[str, float] = {}
        if device == "cpu" and _has_onnxruntime():
            # Its own process: onnxruntime's threads in this one slowed the torch sides (measured).
            from gpuprompt.apps.bench.embed_quant import spawn_side

            with tempfile.TemporaryDirectory(prefix="gpuprompt-embed-onnx-") as work:
                side = spawn_side("onnx", next(run_id), ctx.quick, Path(work), bulk_encode=False)
            onnx = {"onnx_qps": side["callers_qps"], "onnx_ratio": side["callers_qps"] / stock_fig["qps"],
                    "onnx_p95_ms": side["callers_p95_ms"]}
        return onnx | {
            "stock_qps": stock_fig["qps"],
            "ours_qps": ours_fig["qps"],
            "ceiling_qps": ceiling,
            "ceiling_share": ours_fig["qps"] / ceiling,
            "throughput_ratio": ours_fig["qps"] / stock_fig["qps"],
            "stock_p50_ms": stock_fig["p50_ms"],
            "ours_p50_ms": ours_fig["p50_ms"],
            "stock_p95_ms": stock_fig["p95_ms"],
            "ours_p95_ms": ours_fig["p95_ms"],
            "lone_stock_ms": lone_stock,
            "lone_ours_ms": lone_ours,
            "lone_latency_ratio": lone_ours / lone_stock,
        }

    def sweep() -> dict[str, float]:
        figures: dict[str, float] = {}
        for level in levels:
            texts = queries(2 * level + 16, f"sweep {next(run_id)} c{level}: ")
            ours.clear_cache()
            figures[f"stock_c{level}_p50_ms"] = _concurrent(stock.embed_query, texts, level)["p50_ms"]
            figures[f"ours_c{level}_p50_ms"] = _concurrent(lambda q: ours.embed([q]), texts, level)["p50_ms"]
        return figures

    levels = [1, 4, 16, 32] if ctx.quick else [1, 2, 4, 8, 16, 32]
    try:
        metrics, runs = ctx.repeat(measure)
        sweep_metrics, sweep_runs = ctx.repeat(sweep)
    finally:
        ours.close()
    metrics.update(sweep_metrics)
    runs.update(sweep_runs)
    met = (metrics["throughput_ratio"] >= 6.0 and metrics["ceiling_share"] >= 0.85
           and metrics["lone_latency_ratio"] <= 1.2)
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal=("ours >= 6x stock throughput with 32 concurrent callers and >= 0.85 of the same model's bulk rate "
              "(ceiling_share); a lone caller's latency <= 1.2x stock's"),
        goal_met=met,
        chart=Chart(
            kind="bar",
            title=f"{threads} concurrent callers, one query per call ({device})",
            ylabel="queries / second",
            labels=["stock HuggingFaceEmbeddings", "gpuprompt Embedder", "ceiling (batches of 32)"]
            + (["gpuprompt Embedder, backend='onnx'"] if "onnx_qps" in metrics else []),
            values=[metrics["stock_qps"], metrics["ours_qps"], metrics["ceiling_qps"]]
            + ([metrics["onnx_qps"]] if "onnx_qps" in metrics else []),
        ),
        ratio=metrics["throughput_ratio"],
        ratio_label="embedding throughput, 32 concurrent callers",
        extra_charts={
            "latency": Chart(
                kind="line",
                title="Embedding latency vs concurrent callers",
                ylabel="p50 latency per call (ms)",
                xlabel="concurrent callers",
                x=[float(level) for level in levels],
                series={
                    "stock HuggingFaceEmbeddings": [metrics[f"stock_c{level}_p50_ms"] for level in levels],
                    "gpuprompt Embedder": [metrics[f"ours_c{level}_p50_ms"] for level in levels],
                },
            )
        },
        notes=(
            "Latency under load follows Little's law (callers / throughput): with 32 callers the p50 is "
            "compared with the stock p50 under the same load; the batching window's own cost is shown by "
            "the lone-caller latency ratio. The ceiling is the torch forward's bulk rate (one caller, "
            "batches of 32); ceiling_share is ours over it. On CPU, onnx_ratio is "
            "Embedder(backend='onnx') (the same fp32 model through onnxruntime) over stock: 32 callers making 512 "
            "one-query calls in a fresh process of its own (as embed-quant's onnx side)."
        ),
    )


def _has_onnxruntime() -> bool:
    import importlib.util

    return importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None


def conversation(turns: int, salt: str) -> list[tuple[str, str]]:
    """A deterministic support conversation of ``turns`` messages (alternating user / assistant)."""
    out = []
    for i in range(turns):
        product = _PRODUCTS[i % len(_PRODUCTS)]
        if i % 2 == 0:
            out.append(("user", f"{salt} Turn {i}: I bought the {product} last week; after one wash at "
                                f"40 degrees it feels tighter. Is that normal, and can I still return it?"))
        else:
            out.append(("assistant", f"{salt} Turn {i}: The {product} is 95% cotton and may shrink about "
                                     f"3% at 40 degrees. Returns are free within 30 days with the receipt."))
    return out


@scenario(
    "context-turns",
    "Preparing conversation-history embeddings at turns 1..10: stock re-encodes the whole history "
    "every turn (HuggingFaceEmbeddings.embed_documents) vs gpuprompt ContextCache (each turn embedded "
    "once, relevant history picked on the device).",
)
def context_turns(ctx: BenchContext) -> ScenarioResult:
    from gpuprompt.context import ContextCache
    from gpuprompt.embed import Embedder

    turns = 10
    conversations = 5 if ctx.quick else 9
    stock = _stock_embeddings()
    ours = Embedder(device="auto").load()
    in_thread(lambda: stock.embed_documents(["warm-up"]))
    ours.embed(["warm-up"])
    run_id = iter(range(10**6))

    def measure() -> dict[str, float]:
        run = next(run_id)
        # Per-turn cost: the median over the conversations (robust to a stray slow call).
        stock_cost: list[list[float]] = [[] for _ in range(turns)]
        ours_cost: list[list[float]] = [[] for _ in range(turns)]
        ours.clear_cache()
        memory = ContextCache(ours)
        for c in range(conversations):
            chat = conversation(turns, f"[run {run} conversation {c}]")

            def re_encode(chat: list[tuple[str, str]] = chat) -> None:
                for t in range(turns):
                    started = time.perf_counter()
                    stock.embed_documents([text for _, text in chat[: t + 1]])
                    stock_cost[t].append(time.perf_counter() - started)

            in_thread(re_encode)
            session = f"run{run}-c{c}"
            for t, (role, text) in enumerate(chat):
                started = time.perf_counter()
                memory.append(session, role, text)
                memory.window(session, query=text, max_turns=6)
                ours_cost[t].append(time.perf_counter() - started)
        stock_ms = [statistics.median(c) * 1000 for c in stock_cost]
        ours_ms = [statistics.median(c) * 1000 for c in ours_cost]
        figures: dict[str, float] = {}
        for t in range(turns):
            figures[f"stock_turn{t + 1}_ms"] = stock_ms[t]
            figures[f"ours_turn{t + 1}_ms"] = ours_ms[t]
        figures["stock_turn10_over_turn1"] = stock_ms[-1] / stock_ms[0]
        figures["ours_turn10_over_turn1"] = ours_ms[-1] / ours_ms[0]
        figures["turn10_speedup"] = stock_ms[-1] / ours_ms[-1]
        return figures

    try:
        metrics, runs = ctx.repeat(measure)
    finally:
        ours.close()
    x = list(range(1, turns + 1))
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal="ours: turn-10 cost <= 1.2x turn-1 cost",
        goal_met=metrics["ours_turn10_over_turn1"] <= 1.2,
        ratio=metrics["turn10_speedup"],
        ratio_label="history cost at turn 10",
        chart=Chart(
            kind="line",
            title="Conversation history cost per turn",
            ylabel="ms per turn",
            xlabel="turn",
            x=[float(v) for v in x],
            series={
                "stock: re-encode history": [metrics[f"stock_turn{t}_ms"] for t in x],
                "gpuprompt ContextCache": [metrics[f"ours_turn{t}_ms"] for t in x],
            },
        ),
    )

