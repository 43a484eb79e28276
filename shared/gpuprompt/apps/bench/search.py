"""Vector search scenarios: concurrent exact search (``search-concurrency``) and ANN throughput at a
recall target (``search-ann``), each against LangChain community ``FAISS`` in the same run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuprompt.apps.bench._load import thread_load
from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario

__all__ = ["clustered_vectors"]

DIM = 384
K = 10


def clustered_vectors(
    n: int, dim: int = DIM, *, seed: int = 0, topics: int = 50, per_topic: int = 20, intrinsic: int = 16
) -> np.ndarray:
    """``n`` embedding-like vectors: clustered, low intrinsic dimension, L2-normalised.

    A fixed "world" of ``topics`` topic centres, each with ``per_topic`` sub-topic centres around
    it; a vector is its sub-topic centre plus a Gaussian offset in that sub-topic's own random
    ``intrinsic``-dimensional subspace plus isotropic noise. Different ``seed`` values draw
    different vectors from the same world (use one for the collection, another for the queries).
    The cosine similarities resemble sentence embeddings': about 0.75 to the nearest neighbour,
    0.6 to the 10th, 0.0 between random pairs.
    """
    world = np.random.default_rng(1234)
    topic_centres = world.standard_normal((topics, dim)).astype(np.float32)
    clusters = topics * per_topic
    centres = (np.repeat(topic_centres, per_topic, axis=0) + 0.6 * world.standard_normal((clusters, dim))).astype(
        np.float32
    )
    bases = (world.standard_normal((clusters, intrinsic, dim)) * (1.2 / np.sqrt(intrinsic))).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, clusters, n)
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(clusters + 1))
    out = np.empty((n, dim), dtype=np.float32)
    for cluster in range(clusters):
        rows = order[bounds[cluster] : bounds[cluster + 1]]
        if rows.size:
            offsets = rng.standard_normal((rows.size, intrinsic)).astype(np.float32) @ bases[cluster]
            noise = 0.3 * rng.standard_normal((rows.size, dim)).astype(np.float32)
            out[rows] = centres[cluster] + offsets + noise
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def _stock_faiss(vectors: np.ndarray, ids: list[str]) -> Any:
    """LangChain community FAISS over ``vectors`` (inner product on unit vectors = cosine), built the
    way ``FAISS.from_embeddings`` builds it, without converting 100k vectors to Python lists."""
    import faiss
    from langchain_community.docstore.in_memory import InMemoryDocstore
    from langchain_community.vectorstores import FAISS
    from langchain_community.vectorstores.utils import DistanceStrategy
    from langchain_core.documents import Document
    from langchain_core.embeddings import FakeEmbeddings

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    docstore = InMemoryDocstore({key: Document(page_content=f"document {key}", id=key) for key in ids})
    return FAISS(
        embedding_function=FakeEmbeddings(size=vectors.shape[1]),  # never called: we search by vector
        index=index,
        docstore=docstore,
        index_to_docstore_id=dict(enumerate(ids)),
        distance_strategy=DistanceStrategy.MAX_INNER_PRODUCT,
    )


def _threads(call: Callable[[np.ndarray], Any], queries: np.ndarray, threads: int) -> tuple[float, list[Any]]:
    """Each of ``threads`` threads searches one query per call; returns (queries/s, results in order)."""
    load = thread_load(call, list(queries), threads)
    return load.per_s, load.results


def _stock_ids(store: Any, query: np.ndarray, k: int) -> list[str]:
    return [doc.id for doc in store.similarity_search_by_vector(query.tolist(), k=k)]


@scenario(
    "search-concurrency",
    "100k x 384 vectors, 32 threads each searching one query per call (k=10): LangChain community "
    "FAISS.similarity_search_by_vector vs gpuprompt VectorIndex exact search (torch and faiss Flat "
    "backends; concurrent calls coalesced into batched searches), plus one batched faiss call.",
)
def search_concurrency(ctx: BenchContext) -> ScenarioResult:
    from gpuprompt.index import VectorIndex

    n, n_queries, threads = (100_000, 192, 32) if ctx.quick else (100_000, 1024, 32)
    vectors = clustered_vectors(n, seed=0)
    ids = [f"doc-{i}" for i in range(n)]
    stock = _stock_faiss(vectors, ids)
    ours = {
        "torch": VectorIndex(DIM, backend="torch", device="auto"),
        "faiss": VectorIndex(DIM, backend="faiss", device="cpu"),
    }
    for index in ours.values():
        index.add(ids, vectors)
    run_id = iter(range(1, 10**6))

    # Correctness guard: every contender returns the same neighbours (all are exact).
    check = clustered_vectors(8, seed=10**6)
    expected = [_stock_ids(stock, q, K) for q in check]
    for name, index in ours.items():
        got = [[hit.id for hit in row] for row in index.search(check, K)]
        agree = np.mean([len(set(a) & set(b)) / K for a, b in zip(got, expected)])
        if agree < 0.99:
            raise AssertionError(f"VectorIndex ({name}) disagrees with community FAISS: overlap {agree:.3f}")

    def measure() -> dict[str, float]:
        queries = clustered_vectors(n_queries, seed=next(run_id))
        stock_qps, _ = _threads(lambda q: stock.similarity_search_by_vector(q.tolist(), k=K), queries, threads)
        figures = {"stock_qps": stock_qps}
        for name, index in ours.items():
            before = index.stats().batcher
            qps, _ = _threads(lambda q, index=index: index.search(q, K), queries, threads)
            after = index.stats().batcher
            dispatched = max(1, after.batches - before.batches)
            figures[f"ours_{name}_qps"] = qps
            figures[f"ours_{name}_mean_batch"] = (after.items - before.items) / dispatched
        started = time.perf_counter()
        stock.index.search(queries, K)
        figures["one_batched_faiss_call_qps"] = n_queries / (time.perf_counter() - started)
        figures["ratio_torch"] = figures["ours_torch_qps"] / stock_qps
        figures["ratio_faiss"] = figures["ours_faiss_qps"] / stock_qps
        return figures

    try:
        metrics, runs = ctx.repeat(measure)
    finally:
        for index in ours.values():
            index.close()
    best = max(metrics["ratio_torch"], metrics["ratio_faiss"])
    device = ours["torch"].device
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal="ours >= 4x stock throughput (32 threads, one query per call, exact search)",
        goal_met=best >= 4.0,
        ratio=best,
        ratio_label="exact search throughput, 32 concurrent callers",
        chart=Chart(
            kind="bar",
            title=f"{n:,} x {DIM} vectors, {threads} threads, one query per call (k={K})",
            ylabel="queries / second",
            labels=[
                "stock community FAISS",
                f"VectorIndex torch ({device})",
                "VectorIndex faiss Flat",
                "one batched faiss call",
            ],
            values=[
                metrics["stock_qps"],
                metrics["ours_torch_qps"],
                metrics["ours_faiss_qps"],
                metrics["one_batched_faiss_call_qps"],
            ],
        ),
        notes=(
            "All four are exact (same neighbours, checked). Community FAISS runs each caller's query as its "
            "own faiss call; VectorIndex coalesces concurrent calls (ours_*_mean_batch) into one batched "
            "search. 'one batched faiss call' is a faiss IndexFlatIP searching every query at once."
        ),
    )


def _recall(hits: list[list[Any]], truth: list[set[str]]) -> float:
    return float(np.mean([len({hit.id for hit in row} & expected) / K for row, expected in zip(hits, truth)]))


def _batched_qps(index: Any, queries: np.ndarray, batch: int = 100) -> tuple[float, list[list[Any]]]:
    hits: list[list[Any]] = []
    started = time.perf_counter()
    for start in range(0, len(queries), batch):
        hits.extend(index.search(queries[start : start + batch], K))
    return len(queries) / (time.perf_counter() - started), hits


@scenario(
    "search-ann",
    "1M x 384 clustered synthetic vectors (quick: 100k): gpuprompt VectorIndex on faiss IVF and HNSW, "
    "queries/s at recall@10 >= 0.95 against exact search, and build time; LangChain community FAISS "
    "(exact, one query per call, 32 threads) in the same run. On CUDA also the torch backend's "
    "batched exact throughput.",
)
def search_ann(ctx: BenchContext) -> ScenarioResult:
    import importlib.util

    import torch

    from gpuprompt.index import VectorIndex

    n, n_queries = (100_000, 1000) if ctx.quick else (1_000_000, 2000)
    nlist = 512 if ctx.quick else 2048  # about 2 * sqrt(n) lists
    has_faiss = importlib.util.find_spec("faiss") is not None
    cuda = torch.cuda.is_available()
    started = time.perf_counter()
    vectors = clustered_vectors(n, seed=0)
    queries = clustered_vectors(n_queries, seed=99)
    ids = [f"doc-{i}" for i in range(n)]
    metrics: dict[str, float] = {"generate_s": time.perf_counter() - started}
    runs: dict[str, list[float]] = {}

    exact = VectorIndex(DIM, backend="torch", device="cpu")
    exact.add(ids, vectors)
    exact_qps, exact_hits = _batched_qps(exact, queries, batch=250)
    truth = [{hit.id for hit in row} for row in exact_hits]
    metrics["exact_cpu_torch_qps"] = exact_qps
    exact.close()
    del exact

    labels = ["exact (torch, CPU)"]
    values = [exact_qps]
    if cuda:
        gpu = VectorIndex(DIM, backend="torch", device="cuda")
        started = time.perf_counter()
        gpu.add(ids, vectors)
        metrics["cuda_torch_build_s"] = time.perf_counter() - started
        _batched_qps(gpu, queries[:200])
        medians, samples = ctx.repeat(lambda: {"cuda_torch_exact_qps": _batched_qps(gpu, queries, batch=1000)[0]})
        _, gpu_hits = _batched_qps(gpu, queries, batch=1000)
        metrics.update(medians)
        runs.update(samples)
        metrics["cuda_torch_recall"] = _recall(gpu_hits, truth)
        labels.append("exact (torch, CUDA fp16)")
        values.append(metrics["cuda_torch_exact_qps"])
        gpu.close()

    best_qps, best_name = 0.0, ""
    if has_faiss:
        stock_queries = queries[: (64 if ctx.quick else 96)]
        stock = _stock_faiss(vectors, ids)
        medians, samples = ctx.repeat(
            lambda: {
                "stock_faiss_qps": _threads(
                    lambda q: stock.similarity_search_by_vector(q.tolist(), k=K), stock_queries, 32
                )[0]
            }
        )
        metrics.update(medians)
        runs.update(samples)
        labels.insert(0, "stock community FAISS (exact)")
        values.insert(0, metrics["stock_faiss_qps"])
        del stock
        configs = [
            (f"IVF{nlist},Flat", "nprobe", [1, 2, 4, 8, 16, 32]),
            ("HNSW32", "ef_search", [16, 32, 64, 128, 256, 512]),
        ]
        for factory, knob, settings in configs:
            name = factory.split(",")[0].lower()
            index = VectorIndex(DIM, backend="faiss", device="cpu", index_factory=factory)
            started = time.perf_counter()
            index.add(ids, vectors)
            metrics[f"{name}_build_s"] = time.perf_counter() - started
            config_best = 0.0
            for setting in settings:
                index.set_search_params(**{knob: setting})
                _batched_qps(index, queries[:200])  # warm-up
                medians, samples = ctx.repeat(lambda index=index: {"qps": _batched_qps(index, queries)[0]})
                _, hits = _batched_qps(index, queries)
                recall = _recall(hits, truth)
                metrics[f"{name}_{knob}{setting}_qps"] = medians["qps"]
                metrics[f"{name}_{knob}{setting}_recall"] = recall
                runs[f"{name}_{knob}{setting}_qps"] = samples["qps"]
                if recall >= 0.95 and medians["qps"] > config_best:
                    config_best = medians["qps"]
                    metrics[f"{name}_best_qps"] = medians["qps"]
                    metrics[f"{name}_best_recall"] = recall
                    metrics[f"{name}_best_{knob}"] = float(setting)
                if recall >= 0.99:
                    break  # higher settings only cost speed
            index.close()
            del index
            labels.append(f"{factory} @ recall>=0.95")
            values.append(config_best)
            if config_best > best_qps:
                best_qps, best_name = config_best, name
        metrics["best_ann_qps"] = best_qps
        metrics["ratio_vs_exact"] = best_qps / exact_qps
        if metrics.get("stock_faiss_qps"):
            metrics["ratio_vs_stock"] = best_qps / metrics["stock_faiss_qps"]
    cpu_met = has_faiss and best_qps >= 2000.0
    gpu_met = cuda and metrics.get("cuda_torch_exact_qps", 0.0) >= 2000.0
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal=">= 2,000 queries/s at recall@10 >= 0.95 (CPU ANN); on CUDA the torch backend's exact throughput",
        goal_met=bool(cpu_met or gpu_met),
        ratio=metrics.get("ratio_vs_exact"),
        ratio_label="ANN queries/s at recall@10 >= 0.95 vs exact torch search (batched)",
        chart=Chart(
            kind="bar",
            title=f"{n:,} x {DIM} clustered vectors, k={K}",
            ylabel="queries / second",
            labels=labels,
            values=values,
        ),
        notes=(
            f"Best CPU ANN: {best_name or 'n/a'}. Queries are searched in batches of 100 (as coalesced concurrent "
            "calls are); ratio_vs_exact compares it with exact torch search (batches of 250), ratio_vs_stock "
            "with community FAISS (exact, one query per call, 32 threads: what a LangChain app gets); "
            "recall@10 is measured against exact search over the same vectors; build time includes "
            "IVF training (64 points per list, 10 k-means iterations). Data: clustered_vectors() -- 1,000 "
            "sub-topics under 50 topics, each on its own 16-d subspace, plus noise; unit-normalised; cosine metric."
        ),
    )
