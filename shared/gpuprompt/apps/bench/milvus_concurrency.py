"""``milvus-concurrency``: 32 concurrent searchers on one Milvus Lite file, our MilvusIndex (calls
coalesced by the MicroBatcher into multi-query searches) vs langchain-milvus's ``Milvus`` store (one
query per call), plus raw pymilvus one query per call; queries/s and recall@10 against exact search."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt.apps.bench._load import thread_load
from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario
from gpuprompt.apps.bench.search import clustered_vectors

__all__: list[str] = []

DIM = 384
K = 10
THREADS = 32
EF = 64
_INSERT = 2_000


def _stock_store(uri: str, vectors: np.ndarray, ids: list[str]) -> Any:
    """langchain-milvus's ``Milvus`` over the same Lite file: HNSW, cosine, the same ef as ours."""
    from langchain_core.embeddings import FakeEmbeddings
    from langchain_milvus import Milvus

    store = Milvus(
        embedding_function=FakeEmbeddings(size=DIM),  # never called: we search by vector
        collection_name="stock_langchain_milvus",
        connection_args={"uri": uri},
        index_params={"index_type": "HNSW", "metric_type": "COSINE", "params": {"M": 16, "efConstruction": 200}},
        search_params={"metric_type": "COSINE", "params": {"ef": EF}},
        consistency_level="Strong",
        drop_old=True,
        auto_id=False,
    )
    for start in range(0, len(ids), _INSERT):
        chunk = slice(start, start + _INSERT)
        store.add_embeddings(
            [f"document {key}" for key in ids[chunk]], vectors[chunk].tolist(), ids=ids[chunk], batch_size=_INSERT
        )
    return store


def _recall(found: list[list[str]], truth: np.ndarray, ids: list[str]) -> float:
    return float(np.mean([len(set(row) & {ids[i] for i in exact}) / K for row, exact in zip(found, truth)]))


@scenario(
    "milvus-concurrency",
    "Milvus Lite, 50k x 384 vectors (quick: 20k) (HNSW, cosine, ef=64), 32 threads each searching one query per call "
    "(k=10): langchain-milvus Milvus.similarity_search_by_vector and raw pymilvus one query per call vs "
    "gpuprompt MilvusIndex (concurrent calls coalesced into multi-query searches); queries/s and recall@10.",
)
def milvus_concurrency(ctx: BenchContext) -> ScenarioResult:
    from gpuprompt.index import MilvusIndex

    logging.getLogger("pymilvus").setLevel(logging.ERROR)
    n, n_queries = (20_000, 96) if ctx.quick else (50_000, 256)
    vectors = clustered_vectors(n, seed=0)
    ids = [f"doc-{i}" for i in range(n)]
    folder = tempfile.TemporaryDirectory(prefix="gpuprompt-milvus-bench-")
    uri = str(Path(folder.name) / "bench.db")
    ours = MilvusIndex(DIM, uri=uri, collection="ours_gpuprompt", search_params={"ef": EF})
    for start in range(0, n, _INSERT):
        ours.add(
            ids[start : start + _INSERT],
            vectors[start : start + _INSERT],
            documents=[f"document {k}" for k in ids[start : start + _INSERT]],
        )
    stock = _stock_store(uri, vectors, ids)
    client = ours._ensure()  # raw pymilvus, the same client and collection
    run_id = iter(range(1, 10**6))

    def raw_search(q: np.ndarray) -> list[str]:
        hits = client.search(
            "ours_gpuprompt",
            data=[q.tolist()],
            limit=K,
            output_fields=["document"],
            search_params={"params": {"ef": EF}},
        )[0]
        return [str(hit["id"]) for hit in hits]

    def measure() -> dict[str, float]:
        queries = clustered_vectors(n_queries, seed=next(run_id))
        truth = np.argsort(-(queries @ vectors.T), axis=1)[:, :K]
        stock_load = thread_load(
            lambda q: [d.id or d.metadata.get("pk") for d in stock.similarity_search_by_vector(q.tolist(), k=K)],
            list(queries),
            THREADS,
        )
        raw_load = thread_load(raw_search, list(queries), THREADS)
        before = ours.stats().batcher
        ours_load = thread_load(lambda q: [h.id for h in ours.search(q, K)[0]], list(queries), THREADS)
        after = ours.stats().batcher
        return {
            "stock_qps": stock_load.per_s,
            "raw_pymilvus_qps": raw_load.per_s,
            "ours_qps": ours_load.per_s,
            "ours_mean_batch": (after.items - before.items) / max(1, after.batches - before.batches),
            "stock_p50_ms": stock_load.p50_s * 1000,
            "ours_p50_ms": ours_load.p50_s * 1000,
            "stock_recall_at_10": _recall(stock_load.results, truth, ids),
            "raw_pymilvus_recall_at_10": _recall(raw_load.results, truth, ids),
            "ours_recall_at_10": _recall(ours_load.results, truth, ids),
            "ratio": ours_load.per_s / stock_load.per_s,
        }

    try:
        metrics, runs = ctx.repeat(measure)
    finally:
        ours.close()
        folder.cleanup()
    recall_ok = metrics["ours_recall_at_10"] >= metrics["stock_recall_at_10"] - 0.01
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal="ours >= 3x langchain-milvus throughput at the same recall@10 (32 threads, one query per call)",
        goal_met=metrics["ratio"] >= 3.0 and recall_ok,
        ratio=metrics["ratio"],
        ratio_label="Milvus Lite search throughput vs langchain-milvus, 32 concurrent callers",
        chart=Chart(
            kind="bar",
            title=f"Milvus Lite, {n:,} x {DIM}, HNSW ef={EF}, {THREADS} threads, one query per call (k={K})",
            ylabel="queries / second",
            labels=["langchain-milvus Milvus", "raw pymilvus, 1 query/call", "gpuprompt MilvusIndex"],
            values=[metrics["stock_qps"], metrics["raw_pymilvus_qps"], metrics["ours_qps"]],
        ),
        notes=(
            "All three search the same HNSW index type with ef=64 on one Milvus Lite file (each store its own "
            "collection; raw pymilvus searches ours). MilvusIndex coalesces concurrent callers "
            "(ours_mean_batch queries per Milvus search); the others send one query per call. Recall@10 is "
            "against exact cosine search. Milvus Lite is a single-process development engine: server "
            "figures differ (network round trips make batching matter more)."
        ),
    )
