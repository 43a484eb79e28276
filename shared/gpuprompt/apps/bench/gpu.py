"""``gpu-smoke``: every GPU path once (fp16 embedder, torch index, transformers engine on CUDA,
context cache on the device), each figure beside the same measurement on the CPU.

Needs only torch, transformers and sentence-transformers beside gpuprompt (no faiss, vLLM,
LangChain or LlamaIndex), so it runs on a bare GPU machine in a few minutes.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario

__all__: list[str] = []


def _embedder_figures(device: str, texts: list[str]) -> dict[str, float]:
    from gpuprompt.embed import Embedder

    emb = Embedder(device=device, cache_size=0).load()
    try:
        emb.embed(texts[:64])
        started = time.perf_counter()
        emb.embed(texts)
        bulk = len(texts) / (time.perf_counter() - started)

        async def callers() -> None:
            await asyncio.gather(*(emb.aembed([t]) for t in texts[:256]))

        started = time.perf_counter()
        asyncio.run(callers())
        concurrent = 256 / (time.perf_counter() - started)
        return {"embed_bulk_texts_per_s": bulk, "embed_256_callers_qps": concurrent}
    finally:
        emb.close()


def _index_figures(device: str, n: int, dim: int = 384) -> dict[str, float]:
    from gpuprompt.index import VectorIndex

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((n, dim), dtype=np.float32)
    queries = rng.standard_normal((256, dim), dtype=np.float32)
    index = VectorIndex(dim, metric="cosine", backend="torch", device=device)
    started = time.perf_counter()
    index.add([str(i) for i in range(n)], vectors)
    build = time.perf_counter() - started
    index.search(queries[:8], 10)
    started = time.perf_counter()
    hits = index.search(queries, 10)
    qps = len(queries) / (time.perf_counter() - started)
    assert all(len(h) == 10 for h in hits)
    return {"index_add_s": build, "index_exact_qps": qps}


def _llm_figures(device: str, requests: int, max_tokens: int) -> dict[str, float]:
    from gpuprompt.llm import GenerationRequest, LLMEngine

    engine = LLMEngine(backend="transformers", device=device, max_num_seqs=requests)
    try:
        engine.load()
        batch = [
            GenerationRequest(messages=[{"role": "user", "content": f"Describe product {i} in one sentence."}],
                              max_tokens=max_tokens, temperature=0.0)
            for i in range(requests)
        ]
        engine.generate(batch[:2])
        started = time.perf_counter()
        results = engine.generate(batch)
        elapsed = time.perf_counter() - started
        tokens = sum(r.usage.completion_tokens for r in results)
        return {"llm_tokens_per_s": tokens / elapsed}
    finally:
        engine.close()


def _context_figures(device: str, turns: int) -> dict[str, float]:
    from gpuprompt.context import ContextCache
    from gpuprompt.embed import Embedder

    emb = Embedder(device=device).load()
    try:
        memory = ContextCache(emb)
        texts = [f"turn {i}: the customer asks about the fit of item {i % 17}" for i in range(turns)]
        memory.extend("smoke", [("user", t) for t in texts])
        vectors = memory._sessions["smoke"].vectors
        assert vectors.device.type == emb.device.split(":")[0]
        started = time.perf_counter()
        for t in texts[:50]:
            memory.window("smoke", query=t, max_turns=8)
        return {"context_windows_per_s": 50 / (time.perf_counter() - started)}
    finally:
        emb.close()


@scenario(
    "gpu-smoke",
    "Every GPU path once (fp16 embedder, torch exact index, transformers engine, context cache on the "
    "device), each beside the same measurement on the CPU. Needs only torch, transformers and "
    "sentence-transformers.",
)
def gpu_smoke(ctx: BenchContext) -> ScenarioResult:
    import torch

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    texts = [f"customer question {i}: is the item {i % 97} available in size {i % 9}?" for i in range(2048)]
    n_vectors = 50_000 if ctx.quick else 200_000
    metrics: dict[str, float] = {}
    for device in devices:
        figures: dict[str, float] = {}
        figures.update(_embedder_figures(device, texts if device != "cpu" else texts[:512]))
        figures.update(_index_figures(device, n_vectors if device != "cpu" else n_vectors // 4))
        figures.update(_llm_figures(device, requests=16, max_tokens=32 if ctx.quick else 64))
        figures.update(_context_figures(device, turns=200))
        metrics.update({f"{name}[{device}]": value for name, value in figures.items()})
    has_gpu = "cuda" in devices
    stages = ["embed_bulk_texts_per_s", "embed_256_callers_qps", "index_exact_qps", "llm_tokens_per_s",
              "context_windows_per_s"]
    if has_gpu:
        for stage in stages:
            metrics[f"{stage}[gpu/cpu]"] = metrics[f"{stage}[cuda]"] / metrics[f"{stage}[cpu]"]
    chart = Chart(
        kind="bar",
        title="GPU paths vs CPU (higher is better)" if has_gpu else "CPU figures (no CUDA device here)",
        ylabel="GPU / CPU ratio" if has_gpu else "per second",
        labels=stages,
        values=[metrics[f"{s}[gpu/cpu]"] if has_gpu else metrics[f"{s}[cpu]"] for s in stages],
        baseline=1.0 if has_gpu else None,
    )
    return ScenarioResult(
        metrics=metrics,
        goal="every GPU path runs on CUDA (fp16 embedder, torch index, transformers engine, context cache)",
        goal_met=has_gpu,
        chart=chart,
        ratio=metrics["embed_bulk_texts_per_s[gpu/cpu]"] if has_gpu else None,
        ratio_label="bulk embedding, GPU over CPU" if has_gpu else "",
        notes="" if has_gpu else "No CUDA device: only the CPU figures were measured.",
    )
