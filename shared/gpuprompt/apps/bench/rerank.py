"""``rerank``: 32 concurrent callers, each reranking 20 unseen passages, against the stock rerankers.

Sides, each in a process of its own (their order rotates between runs): LangChain's
``CrossEncoderReranker`` over ``HuggingFaceCrossEncoder``, LlamaIndex's ``SentenceTransformerRerank``,
and ``GPUPromptReranker`` in fp32 (torch, and ``backend="onnx"``), int8 and bf16, all on the same
cross-encoder. A last process measures
the batching limit: the same pairs scored by one ``CrossEncoder.predict`` caller in batches of 64
(no per-call overhead, no contention), which bounds what coalescing alone can give on CPU.

The model is ``GPUPROMPT_BENCH_RERANK_MODEL`` when set (a trained cross-encoder), else the real
MiniLM-L6 cross-encoder architecture with a seeded random head (:func:`gpuprompt.models.random_cross_encoder`):
the same compute as a trained ms-marco MiniLM-L6, so the speed figures hold; its scores mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuprompt.apps.bench._quiet import OTHER_CORES_LIMIT, OtherLoad
from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario

__all__: list[str] = []

_CALLERS = 32
_PASSAGES = 20
_TOP_N = 4
_LONE_CALLS = 12
_SIDE_TIMEOUT_S = 1800
SIDES = ("langchain", "llamaindex", "ours", "ours-onnx", "ours-int8", "ours-bf16", "limit")
MODEL_ENV = "GPUPROMPT_BENCH_RERANK_MODEL"


def model_path() -> str:
    """The benchmark's cross-encoder: ``$GPUPROMPT_BENCH_RERANK_MODEL``, else the random-head MiniLM-L6."""
    given = os.environ.get(MODEL_ENV)
    if given:
        return given
    from gpuprompt.models import random_cross_encoder

    return str(random_cross_encoder())


def workload(run: int, requests: int) -> list[tuple[str, list[str]]]:
    """``requests`` (question, 20 passages) calls, new texts in every run (no cache hits)."""
    from gpuprompt._corpus import catalogue, customer_questions

    products = [item["text"] for item in catalogue(requests * _PASSAGES, seed=1000 + run)]
    questions = customer_questions(requests, seed=2000 + run)
    return [(f"{q} (ref {run}-{i})", products[i * _PASSAGES:(i + 1) * _PASSAGES]) for i, q in enumerate(questions)]


def _rerankers(side: str, path: str) -> tuple[Any, Any]:
    """(a callable ``(question, passages) -> ranked texts``, something to close)."""
    if side == "langchain":
        from langchain_classic.retrievers.document_compressors import CrossEncoderReranker
        from langchain_community.cross_encoders import HuggingFaceCrossEncoder
        from langchain_core.documents import Document

        stock = CrossEncoderReranker(model=HuggingFaceCrossEncoder(model_name=path, model_kwargs={"device": "cpu"}),
                                     top_n=_TOP_N)
        return (lambda q, ps: [d.page_content for d in stock.compress_documents([Document(page_content=p)
                                                                                 for p in ps], q)]), None
    if side == "llamaindex":
        from llama_index.core.postprocessor import SentenceTransformerRerank
        from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

        stock_li = SentenceTransformerRerank(model=path, top_n=_TOP_N, device="cpu")
        return (lambda q, ps: [n.node.get_content() for n in stock_li.postprocess_nodes(
            [NodeWithScore(node=TextNode(text=p), score=0.0) for p in ps], query_bundle=QueryBundle(q))]), None
    from langchain_core.documents import Document

    from langchain_gpuprompt import GPUPromptReranker

    ours = GPUPromptReranker(model=path, device="cpu", top_n=_TOP_N,
                             quantize="int8" if side == "ours-int8" else None,
                             dtype="bfloat16" if side == "ours-bf16" else None,
                             backend="onnx" if side == "ours-onnx" else "torch")
    ours.reranker.load()  # an ONNX build (once, cached) is not part of the measurement
    return (lambda q, ps: [d.page_content for d in ours.compress_documents([Document(page_content=p)
                                                                           for p in ps], q)]), ours.reranker


def _side(side: str, run: int, quick: bool) -> dict[str, Any]:
    """One side's measurements, in this process (the child entry point calls it)."""
    from gpuprompt.apps.bench._load import thread_load

    path = model_path()
    requests = 64 if quick else 192
    calls = workload(run, requests)
    warm = workload(run + 500, 8)
    if side == "limit":
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(path, device="cpu")
        model.predict([(q, p) for q, ps in warm for p in ps], batch_size=64)
        pairs = [(q, p) for q, ps in calls for p in ps]
        started = time.perf_counter()
        model.predict(pairs, batch_size=64)
        return {"requests_per_s": len(calls) / (time.perf_counter() - started)}
    rerank, core = _rerankers(side, path)
    for q, ps in warm:
        rerank(q, ps)
    lone = []
    for q, ps in workload(run + 700, _LONE_CALLS):
        started = time.perf_counter()
        rerank(q, ps)
        lone.append(time.perf_counter() - started)
    load = thread_load(lambda call: rerank(*call), calls, _CALLERS)
    out: dict[str, Any] = {"requests_per_s": load.per_s, "p50_s": load.p50_s, "p95_s": load.p95_s,
                           "lone_s": statistics.median(lone), "top": load.results[:4]}
    if core is not None:
        stats = core.stats()
        out["mean_batch_pairs"] = stats.batcher.mean_batch_size if stats.batcher else 0.0
        if core.quality is not None:
            out["top3_agreement"] = core.quality.top3_agreement
            out["top1_agreement"] = core.quality.top1_agreement
        if side in ("ours", "ours-bf16"):  # bf16's ranking vs fp32's, on the int8 guard's real-prose set
            from gpuprompt.rerank._int8 import guard_set

            out["guard_scores"] = [core.score([(q, d) for d in ds]) for q, ds in guard_set()]
        core.close()
    return out


def _agreement(reference: list[list[float]], other: list[list[float]], k: int) -> float:
    """Mean share of ``reference``'s top ``k`` (per query) that ``other`` also ranks in its top ``k``."""
    import numpy as np

    shares = [len(set(np.argsort(-np.asarray(a), kind="stable")[:k].tolist())
                  & set(np.argsort(-np.asarray(b), kind="stable")[:k].tolist())) / k
              for a, b in zip(reference, other)]
    return float(np.mean(shares))


def _spawn(side: str, run: int, quick: bool, work: Path) -> dict[str, Any]:
    out = work / f"{side}-{run}.json"
    command = [sys.executable, "-m", "gpuprompt.apps.bench.rerank", "--side", side, "--run", str(run),
               "--out", str(out)] + (["--quick"] if quick else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=_SIDE_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"the {side} side (run {run}) failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


@scenario(
    "rerank",
    "32 concurrent callers each reranking 20 unseen passages (top 4), each side in its own process: LangChain "
    "CrossEncoderReranker, LlamaIndex SentenceTransformerRerank, GPUPromptReranker fp32 (torch and onnx), int8 and "
    "bf16, same "
    "cross-encoder; "
    "plus the batching limit (one caller, batches of 64) and a lone caller's latency.",
)
def rerank(ctx: BenchContext) -> ScenarioResult:
    from gpuprompt._bf16 import bf16_is_native

    model_path()  # build the random-head model once, before any side starts
    run_ids = iter(range(10**6))
    with tempfile.TemporaryDirectory(prefix="gpuprompt-rerank-") as folder:
        work = Path(folder)

        # bf16 runs only where the CPU computes it natively (AMX / AVX512-BF16): emulated, it is several
        # times slower than fp32, says nothing about the fast path and would take most of the bench's time.
        native = bf16_is_native()
        sides = [side for side in SIDES if native or side != "ours-bf16"]

        def measure() -> dict[str, float]:
            run = next(run_ids)
            order = sides[run % len(sides):] + sides[:run % len(sides)]
            other = OtherLoad()
            figures = {side: _spawn(side, run, ctx.quick, work) for side in order}
            lc, li, ours, q8, limit = (figures[s] for s in ("langchain", "llamaindex", "ours", "ours-int8", "limit"))
            onnx = figures["ours-onnx"]
            bf = figures.get("ours-bf16")
            bf16 = {} if bf is None else {
                "ours_bf16_requests_per_s": bf["requests_per_s"],
                "bf16_vs_langchain": bf["requests_per_s"] / lc["requests_per_s"],
                "bf16_vs_llamaindex": bf["requests_per_s"] / li["requests_per_s"],
                "bf16_lone_ms": bf["lone_s"] * 1000,
                "bf16_top3_agreement": _agreement(ours["guard_scores"], bf["guard_scores"], 3),
                "bf16_top1_agreement": _agreement(ours["guard_scores"], bf["guard_scores"], 1),
            }
            return {
                **bf16,
                "bf16_native": float(native),  # 0: this CPU emulates bf16, so the bf16 side was not run
                "langchain_requests_per_s": lc["requests_per_s"],
                "llamaindex_requests_per_s": li["requests_per_s"],
                "ours_requests_per_s": ours["requests_per_s"],
                "ours_int8_requests_per_s": q8["requests_per_s"],
                "ours_onnx_requests_per_s": onnx["requests_per_s"],
                "onnx_vs_langchain": onnx["requests_per_s"] / lc["requests_per_s"],
                "onnx_vs_llamaindex": onnx["requests_per_s"] / li["requests_per_s"],
                "onnx_vs_torch": onnx["requests_per_s"] / ours["requests_per_s"],
                "onnx_lone_ms": onnx["lone_s"] * 1000,
                "limit_requests_per_s": limit["requests_per_s"],
                "fp32_vs_langchain": ours["requests_per_s"] / lc["requests_per_s"],
                "fp32_vs_llamaindex": ours["requests_per_s"] / li["requests_per_s"],
                "int8_vs_langchain": q8["requests_per_s"] / lc["requests_per_s"],
                "int8_vs_llamaindex": q8["requests_per_s"] / li["requests_per_s"],
                "limit_vs_langchain": limit["requests_per_s"] / lc["requests_per_s"],
                "ours_p95_s": ours["p95_s"],
                "langchain_p95_s": lc["p95_s"],
                "lone_ratio": ours["lone_s"] / lc["lone_s"],
                "ours_lone_ms": ours["lone_s"] * 1000,
                "langchain_lone_ms": lc["lone_s"] * 1000,
                "ours_mean_batch_pairs": ours.get("mean_batch_pairs", 0.0),
                "int8_top3_agreement": q8.get("top3_agreement", 0.0),
                "int8_top1_agreement": q8.get("top1_agreement", 0.0),
                "same_top_as_langchain": float(ours["top"] == lc["top"]),
                "other_cores": other.cores(),
            }

        metrics, runs = ctx.repeat(measure)
    cores = os.cpu_count() or 1
    alone = max(runs["other_cores"]) <= OTHER_CORES_LIMIT
    # fp32 is the faster of its two forward passes (torch, onnx): both are full precision, same scores.
    fp32 = max(min(metrics["fp32_vs_langchain"], metrics["fp32_vs_llamaindex"]),
               min(metrics["onnx_vs_langchain"], metrics["onnx_vs_llamaindex"]))
    int8 = min(metrics["int8_vs_langchain"], metrics["int8_vs_llamaindex"])
    met = alone and fp32 >= 1.3 and int8 >= 2.5 and metrics["lone_ratio"] <= 1.1 \
        and metrics["int8_top3_agreement"] >= 0.9
    busy = "" if alone else (f"NOT MEASURED ALONE (other processes kept {max(runs['other_cores']):.2f} of "
                             f"{cores} cores busy): rerun on an idle machine. ")
    trained = bool(os.environ.get(MODEL_ENV))
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal="fp32 >= 1.3x and int8 >= 2.5x both stock rerankers (32 callers x 20 passages), int8 guard holding "
             "(top-3 agreement >= 0.9), a lone caller's latency <= 1.1x stock",
        goal_met=met,
        ratio=fp32,
        ratio_label="GPUPromptReranker fp32 (the faster of backend torch and onnx) vs the slower-ratio stock reranker "
                    "(requests / second)",
        chart=Chart(
            kind="bar",
            title="Rerank, 32 callers x 20 passages (requests / second)",
            ylabel="requests / second",
            labels=["LangChain CrossEncoderReranker", "LlamaIndex SentenceTransformerRerank", "gpuprompt fp32",
                    "gpuprompt fp32 (onnx)", "gpuprompt int8"] + (["gpuprompt bf16"] if native else []) + [
                    "batching limit (1 caller, batches of 64)"],
            values=[metrics["langchain_requests_per_s"], metrics["llamaindex_requests_per_s"],
                    metrics["ours_requests_per_s"], metrics["ours_onnx_requests_per_s"],
                    metrics["ours_int8_requests_per_s"]]
            + ([metrics["ours_bf16_requests_per_s"]] if native else []) + [metrics["limit_requests_per_s"]],
        ),
        notes=busy + (f"Model: {'a trained cross-encoder from ' + MODEL_ENV if trained else 'the random-head MiniLM-L6 cross-encoder (real compute, meaningless scores)'}. "
                      "Each request is a new question over 20 new product descriptions; top 4 kept. limit_vs_langchain "
                      "is the batching limit on these cores: one caller scoring the same pairs in batches of 64."
                      + ("" if native else " The bf16 side was not run: this CPU has neither AMX nor AVX512-BF16, "
                         "so bf16 would be emulated (several times slower than fp32).")),
    )


def _side_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one side of the rerank bench (internal)")
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--run", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    Path(args.out).write_text(json.dumps(_side(args.side, args.run, args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(_side_main())
