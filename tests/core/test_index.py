"""VectorIndex: upsert/delete/get, exact results per backend, scores, pre-filtering, MMR, bad input."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import numpy as np
import pytest

import gpuprompt
from gpuprompt import Hit, Record, VectorIndex
from gpuprompt.errors import (
    ConfigurationError,
    DimensionMismatchError,
    FilterError,
    InputTypeError,
    InvalidInputError,
)

DIM = 32

# name -> constructor options; "exact" backends must match brute force exactly.
BACKENDS = {
    "torch": {"backend": "torch", "device": "cpu"},
    "faiss-flat": {"backend": "faiss", "device": "cpu"},
    "faiss-hnsw": {"backend": "faiss", "device": "cpu", "index_factory": "HNSW16", "ef_search": 512},
    "faiss-ivf": {"backend": "faiss", "device": "cpu", "index_factory": "IVF16,Flat", "nprobe": 16},
}
EXACT = ("torch", "faiss-flat", "faiss-ivf")


def clustered(n: int, dim: int = DIM, *, seed: int = 0, clusters: int = 20) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32) * 3
    return (centres[rng.integers(0, clusters, n)] + rng.standard_normal((n, dim)).astype(np.float32)).astype(np.float32)


def brute(vectors: np.ndarray, queries: np.ndarray, k: int, metric: str, rows: np.ndarray | None = None):
    """Reference top-k: (scores, row indices) by the documented score of each metric."""
    rows = np.arange(len(vectors)) if rows is None else rows
    x = vectors[rows].astype(np.float64)
    q = queries.astype(np.float64)
    if metric == "cosine":
        scores = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (x / np.linalg.norm(x, axis=1, keepdims=True)).T
    elif metric == "ip":
        scores = q @ x.T
    else:
        d2 = (q**2).sum(1)[:, None] - 2 * q @ x.T + (x**2).sum(1)[None, :]
        scores = 1.0 / (1.0 + np.maximum(d2, 0))
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, 1), rows[order]


@pytest.fixture(scope="module")
def data() -> dict:
    n = 12_000
    vectors = clustered(n, seed=1)
    ids = [f"doc-{i}" for i in range(n)]
    metas = [
        {"i": i, "group": i % 10, "rare": i % 1000 == 0, "half": i % 2 == 0, "tags": [f"t{i % 7}"]} for i in range(n)
    ]
    docs = [f"text {i}" for i in range(n)]
    queries = clustered(8, seed=2)
    return {"vectors": vectors, "ids": ids, "metas": metas, "docs": docs, "queries": queries}


@pytest.fixture(scope="module", params=list(BACKENDS))
def built(request, data) -> tuple[str, VectorIndex]:
    """A 12k-record index per backend, shared by the read-only tests of this module."""
    index = VectorIndex(DIM, **BACKENDS[request.param])
    index.add(data["ids"], data["vectors"], data["docs"], data["metas"])
    yield request.param, index
    index.close()


def small(kind: str = "torch", metric: str = "cosine", **options) -> VectorIndex:
    return VectorIndex(4, metric=metric, **{**BACKENDS[kind], **options})


# ---------------------------------------------------------------------------------------- surface
def test_exports_and_lazy_imports() -> None:
    assert {"VectorIndex", "Hit", "Record"} <= set(gpuprompt.__all__)
    from gpuprompt import index as index_pkg

    assert index_pkg.__all__ == [
        "ANN_THRESHOLD", "Hit", "IndexConfig", "IndexLike", "IndexStats", "MilvusIndex", "Record", "VectorIndex",
        "check_index", "load_index",
    ]
    code = (
        "import sys, gpuprompt\n"
        "from gpuprompt import VectorIndex\n"
        "from gpuprompt.index.filters import matches\n"
        "i = VectorIndex(8, backend='faiss', index_factory='HNSW32')\n"
        "assert 'torch' not in sys.modules and 'faiss' not in sys.modules, sorted(m for m in sys.modules if m in ('torch', 'faiss'))\n"
        "print(repr(i))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "not started" in out.stdout


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"dim": 0}, "'dim' must be an int >= 1"),
        ({"dim": "8"}, "'dim' must be an int >= 1"),
        ({"metric": "dot"}, "'metric' must be"),
        ({"backend": "annoy"}, "'backend' must be"),
        ({"backend": "torch", "index_factory": "HNSW32"}, "faiss option"),
        ({"index_factory": ""}, "'index_factory' must be"),
        ({"ef_search": 0}, "'ef_search' must be"),
        ({"ef_construction": 1.5}, "'ef_construction' must be"),
        ({"dtype": "int8"}, "'dtype' must be"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"compact_fraction": 0}, "'compact_fraction'"),
        ({"efsearch": 5}, "'efsearch' must be a VectorIndex option: one of metric, backend, .*'ef_search'"),
        ({"device": "gpu"}, "'device' must be 'auto', 'cpu', 'mps', 'cuda' or 'cuda:N'"),
        ({"ann_threshold": -1}, "'ann_threshold' must be an int >= 0"),
    ],
)
def test_bad_configuration(options: dict, words: str) -> None:
    options = {"dim": 8, **options}
    with pytest.raises(ConfigurationError, match=words):
        VectorIndex(**options)


def test_bad_factory_string_is_a_configuration_error() -> None:
    # Refused where it is given (rule 10), not at the first add, and without importing faiss.
    with pytest.raises(ConfigurationError, match="index_factory"):
        VectorIndex(8, backend="faiss", index_factory="NotAnIndex99")
    # What only faiss can judge (PQ16 needs a dimension divisible by 16) fails typed at the build.
    index = VectorIndex(8, backend="faiss", index_factory="PQ16")
    with pytest.raises(ConfigurationError, match="index_factory"):
        index.add(["a"], np.ones((1, 8)))
    assert index.count == 0


# ---------------------------------------------------------------------------------------- CRUD
@pytest.mark.parametrize("kind", list(BACKENDS))
def test_upsert_delete_get_round_trip(kind: str) -> None:
    index = small(kind)
    vectors = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], dtype=np.float32)
    assert index.add(["a", "b", "c"], vectors, ["A", "B", None], [{"n": 1}, None, {"n": 3}]) == ["a", "b", "c"]
    assert index.count == len(index) == 3
    got = index.get(["c", "missing", "a"])
    assert [r.id for r in got] == ["c", "a"]
    assert got[0] == Record("c", vectors[2], None, {"n": 3})
    assert got[1].document == "A" and np.array_equal(got[1].vector, vectors[0])
    # upsert: same id, new vector/document/metadata; never duplicated
    new = np.array([[0, 0, 0, 2]], dtype=np.float32)
    index.add(["a"], new, ["A2"], [{"n": 10}])
    assert index.count == 3 and sorted(index.ids()) == ["a", "b", "c"]
    assert index.get(["a"]) == [Record("a", new[0], "A2", {"n": 10})]
    hits = index.search(vectors[:1], k=3)[0]
    assert [h.id for h in hits].count("a") == 1
    assert next(h for h in hits if h.id == "a").score == pytest.approx(0.0, abs=1e-6)  # the old vector is gone
    assert index.search(new, k=1)[0][0].id == "a"
    # delete: missing and repeated ids are not counted
    assert index.delete(["b", "b", "nope"]) == 1
    assert index.delete([]) == 0
    assert index.count == 2 and index.get(["b"]) == []
    assert {h.id for h in index.search(vectors[1:2], k=5)[0]} == {"a", "c"}
    index.clear()
    assert index.count == 0 and index.search(vectors, k=2) == [[], [], []]
    index.add(["z"], vectors[:1])
    assert [h.id for h in index.search(vectors[:1], k=2)[0]] == ["z"]


def test_generated_ids_and_duplicates_last_wins() -> None:
    index = small()
    ids = index.add(None, np.eye(4)[:2])
    assert len(ids) == 2 and all(len(i) == 32 for i in ids) and len(set(ids)) == 2
    mixed = index.add(["x", None], np.eye(4)[2:])
    assert mixed[0] == "x" and len(mixed[1]) == 32
    out = index.add(["d", "d"], np.array([[1, 0, 0, 0], [0, 1, 0, 0]]), ["first", "second"])
    assert out == ["d", "d"]
    assert index.count == 5
    assert index.get(["d"])[0].document == "second"
    assert np.array_equal(index.get(["d"])[0].vector, [0, 1, 0, 0])


def test_returned_objects_are_copies() -> None:
    index = small()
    meta = {"tags": ["a"], "nested": {"x": 1}}
    vector = np.ones((1, 4), dtype=np.float32)
    index.add(["a"], vector, ["doc"], [meta])
    meta["tags"].append("mutated")
    vector[0, 0] = 99
    record = index.get(["a"])[0]
    assert record.metadata == {"tags": ["a"], "nested": {"x": 1}}
    assert record.vector[0] == 1
    record.metadata["nested"]["x"] = 2
    hit = index.search(np.ones(4), k=1)[0][0]
    hit.metadata["tags"].clear()
    assert index.get(["a"])[0].metadata == {"tags": ["a"], "nested": {"x": 1}}


def test_tensor_inputs() -> None:
    import torch

    index = small()
    index.add(["a", "b"], torch.eye(4)[:2])
    hits = index.search(torch.tensor([0.0, 1.0, 0.0, 0.0]), k=1)
    assert hits[0][0].id == "b"
    assert index.mmr(torch.tensor([1.0, 0, 0, 0]), k=1)[0].id == "a"


# ---------------------------------------------------------------------------------------- search
def test_search_matches_brute_force(built, data) -> None:
    kind, index = built
    hits = index.search(data["queries"], k=10)
    ref_scores, ref_rows = brute(data["vectors"], data["queries"], 10, "cosine")
    assert all(len(h) == 10 for h in hits)
    recall = []
    for q, row_hits in enumerate(hits):
        got = [h.id for h in row_hits]
        expected = [data["ids"][r] for r in ref_rows[q]]
        recall.append(len(set(got) & set(expected)) / 10)
        if kind in EXACT:
            assert got == expected
            np.testing.assert_allclose([h.score for h in row_hits], ref_scores[q], rtol=1e-4, atol=1e-5)
        assert [h.score for h in row_hits] == sorted((h.score for h in row_hits), reverse=True)
        for h in row_hits:
            i = int(h.id.split("-")[1])
            assert h.document == f"text {i}" and h.metadata == data["metas"][i]
    assert np.mean(recall) >= 0.8  # HNSW is approximate (this data is hard for it: gaussian clusters in 32-d)


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
@pytest.mark.parametrize("kind", ["torch", "faiss-flat"])
def test_scores_per_metric(metric: str, kind: str) -> None:
    vectors = clustered(300, 8, seed=3)
    queries = clustered(4, 8, seed=4)
    index = VectorIndex(8, metric=metric, **BACKENDS[kind])
    index.add([str(i) for i in range(300)], vectors)
    hits = index.search(queries, k=5)
    ref_scores, ref_rows = brute(vectors, queries, 5, metric)
    for q in range(4):
        assert [h.id for h in hits[q]] == [str(r) for r in ref_rows[q]]
        np.testing.assert_allclose([h.score for h in hits[q]], ref_scores[q], rtol=1e-4, atol=1e-4)
    if metric == "cosine":
        assert all(-1.0001 <= h.score <= 1.0001 for row in hits for h in row)
    if metric == "l2":
        assert all(0 < h.score <= 1 for row in hits for h in row)
        index.add(["self"], queries[:1])
        assert index.search(queries[:1], k=1)[0][0].score == pytest.approx(1.0)


def test_k_larger_than_count_and_empty_queries(built, data) -> None:
    index = built[1]
    few = small()
    few.add(["a", "b"], np.eye(4)[:2])
    assert [len(h) for h in few.search(np.eye(4), k=50)] == [2, 2, 2, 2]
    assert index.search(np.empty((0, DIM)), k=3) == []
    assert len(index.search(data["queries"][0], k=3)) == 1  # one (dim,) vector is one query


@pytest.mark.parametrize(
    ("flt", "label"),
    [
        ({"rare": True}, "12 matches, fewer than k"),
        ({"i": {"$lt": 3}}, "3 matches"),
        ({"group": 3}, "10% selective"),
        ({"$or": [{"group": {"$in": [0, 1, 2]}}, {"tags": {"$contains": "t1"}}]}, "~40%: IDSelector"),
        ({"half": True}, "50%"),
        ({"group": {"$ne": 5}}, "90% broad: over-fetch"),
        ({"i": {"$gte": 0}}, "everything"),
        ({"group": 99}, "nothing"),
    ],
)
def test_prefilter_returns_exactly_min_k_matches(built, data, flt: dict, label: str) -> None:
    kind, index = built
    from gpuprompt.index.filters import matches

    allowed = np.array([i for i, m in enumerate(data["metas"]) if matches(flt, m)], dtype=np.int64)
    k = 20
    hits = index.search(data["queries"], k=k, filter=flt)
    assert [len(h) for h in hits] == [min(k, allowed.size)] * len(data["queries"]), label
    for row_hits in hits:
        assert len({h.id for h in row_hits}) == len(row_hits)
        assert all(matches(flt, h.metadata) for h in row_hits)
    if allowed.size and kind in EXACT:
        _, ref_rows = brute(data["vectors"], data["queries"], k, "cosine", rows=allowed)
        for q, row_hits in enumerate(hits):
            assert [h.id for h in row_hits] == [data["ids"][r] for r in ref_rows[q]], label
    elif allowed.size:
        _, ref_rows = brute(data["vectors"], data["queries"], k, "cosine", rows=allowed)
        overlap = np.mean(
            [
                len({h.id for h in hits[q]} & {data["ids"][r] for r in ref_rows[q]}) / len(hits[q])
                for q in range(len(hits))
            ]
        )
        assert overlap >= 0.8, label


def test_filter_errors_are_typed_and_change_nothing(built, data) -> None:
    index = built[1]
    with pytest.raises(FilterError, match=r"\$\.group\.\$gt"):
        index.search(data["queries"], k=3, filter={"group": {"$gt": [1]}})
    with pytest.raises(FilterError):
        index.mmr(data["queries"][0], filter={"$nope": 1})
    assert index.count == 12_000


def test_filters_see_upserts_and_deletes() -> None:
    index = small()
    index.add(["a", "b", "c"], np.eye(4)[:3], metadatas=[{"c": "x"}, {"c": "y"}, {"c": "x"}])
    assert {h.id for h in index.search(np.ones(4), 10, filter={"c": "x"})[0]} == {"a", "c"}
    index.add(["a"], np.eye(4)[:1], metadatas=[{"c": "y"}])
    assert {h.id for h in index.search(np.ones(4), 10, filter={"c": "x"})[0]} == {"c"}
    index.delete(["c"])
    assert index.search(np.ones(4), 10, filter={"c": "x"}) == [[]]
    assert {h.id for h in index.search(np.ones(4), 10, filter={"c": "y"})[0]} == {"a", "b"}


# ---------------------------------------------------------------------------------------- MMR
def reference_mmr(query: np.ndarray, candidates: np.ndarray, k: int, lambda_mult: float) -> list[int]:
    """The textbook greedy loop (as in LangChain's maximal_marginal_relevance), one candidate at a time."""

    def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a = a / np.linalg.norm(a, axis=1, keepdims=True)
        b = b / np.linalg.norm(b, axis=1, keepdims=True)
        return a @ b.T

    to_query = cos(query[None, :], candidates)[0]
    picked = [int(np.argmax(to_query))]
    while len(picked) < min(k, len(candidates)):
        best, best_score = -1, -np.inf
        for i in range(len(candidates)):
            if i in picked:
                continue
            redundancy = max(cos(candidates[i : i + 1], candidates[picked])[0])
            score = lambda_mult * to_query[i] - (1 - lambda_mult) * redundancy
            if score > best_score:
                best, best_score = i, score
        picked.append(best)
    return picked


@pytest.mark.parametrize("lambda_mult", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_mmr_matches_brute_force_reference(built, data, lambda_mult: float) -> None:
    index = built[1]
    query = data["queries"][0]
    fetched = index.search(query, k=30)[0]
    candidates = np.stack([r.vector for r in index.get([h.id for h in fetched])])
    expected = [fetched[i].id for i in reference_mmr(query, candidates, 6, lambda_mult)]
    got = index.mmr(query, k=6, fetch_k=30, lambda_mult=lambda_mult)
    assert [h.id for h in got] == expected
    by_id = {h.id: h.score for h in fetched}
    assert all(h.score == pytest.approx(by_id[h.id], abs=1e-6) for h in got)


def test_mmr_is_diverse_and_honours_filters() -> None:
    rng = np.random.default_rng(5)
    base = rng.standard_normal((3, 16)).astype(np.float32)
    vectors, ids, metas = [], [], []
    for c in range(3):  # three tight clusters of near-duplicates
        for j in range(10):
            vectors.append(base[c] + 0.01 * rng.standard_normal(16).astype(np.float32))
            ids.append(f"c{c}-{j}")
            metas.append({"cluster": c, "j": j})
    index = VectorIndex(16, backend="torch", device="cpu")
    index.add(ids, np.stack(vectors), metadatas=metas)
    query = base[0] + 0.4 * base[1] + 0.3 * base[2]
    plain = index.search(query, k=3)[0]
    assert len({h.metadata["cluster"] for h in plain}) == 1
    diverse = index.mmr(query, k=3, fetch_k=30, lambda_mult=0.5)
    assert len({h.metadata["cluster"] for h in diverse}) == 3
    filtered = index.mmr(query, k=3, fetch_k=30, filter={"cluster": {"$ne": 0}})
    assert {h.metadata["cluster"] for h in filtered} == {1, 2}
    assert index.mmr(query, k=5, fetch_k=2) and len(index.mmr(query, k=5, fetch_k=2)) == 5  # fetch_k < k: k fetched
    assert index.mmr(query, k=3, filter={"cluster": 9}) == []


def test_mmr_bad_input() -> None:
    index = small()
    index.add(["a"], np.eye(4)[:1])
    with pytest.raises(InvalidInputError, match="'lambda_mult' must be a finite number"):
        index.mmr(np.ones(4), lambda_mult=1.5)
    with pytest.raises(InvalidInputError, match="'fetch_k' must be an int >= 1"):
        index.mmr(np.ones(4), fetch_k=0)
    with pytest.raises(InvalidInputError, match="one vector"):
        index.mmr(np.ones((2, 4)))
    with pytest.raises(DimensionMismatchError):
        index.mmr(np.ones(5))


# ---------------------------------------------------------------------------------------- batching
def test_concurrent_searches_are_coalesced_and_correct(built, data) -> None:
    index = built[1]
    queries = clustered(64, seed=9)
    expected = [[h.id for h in row] for row in index.search(queries, k=5)]
    before = index.stats().batcher
    results: list = [None] * 64
    barrier = threading.Barrier(32)

    def worker(slot: int) -> None:
        barrier.wait()
        for q in (slot, slot + 32):
            flt = {"half": True} if q % 4 == 0 else None
            hits = index.search(queries[q], k=5, filter=flt)[0]
            results[q] = [h.id for h in hits] if flt is None else ("filtered", hits)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for q in range(64):
        if q % 4 == 0:
            assert all(h.metadata["half"] for h in results[q][1]) and len(results[q][1]) == 5
        else:
            assert results[q] == expected[q]
    after = index.stats().batcher
    assert after.items - before.items == 64
    assert after.max_batch_size > 1  # coalesced into batched backend searches


def test_asearch_and_ammr(built, data) -> None:
    index = built[1]
    queries = data["queries"]
    expected = [[h.id for h in row] for row in index.search(queries, k=4)]

    async def main() -> list:
        calls = [index.asearch(queries[i], k=4) for i in range(len(queries))]
        calls.append(index.ammr(queries[0], k=3, fetch_k=10))
        return await asyncio.gather(*calls)

    out = asyncio.run(main())
    assert [[h.id for h in r[0]] for r in out[:-1]] == expected
    assert [h.id for h in out[-1]] == [h.id for h in index.mmr(queries[0], k=3, fetch_k=10)]


# ---------------------------------------------------------------------------------------- backends
def test_auto_backend_switches_to_hnsw_and_keeps_records() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("auto picks the torch backend on CUDA")
    index = VectorIndex(DIM, ann_threshold=300)
    vectors = clustered(600, seed=11)
    index.add(
        [f"v{i}" for i in range(300)], vectors[:300], [f"d{i}" for i in range(300)], [{"i": i} for i in range(300)]
    )
    assert index.backend_name == "torch:cpu:float32"
    index.add(
        [f"v{i}" for i in range(300, 600)],
        vectors[300:],
        [f"d{i}" for i in range(300, 600)],
        [{"i": i} for i in range(300, 600)],
    )
    assert index.backend_name == "faiss:HNSW32:cpu"
    assert index.count == 600
    assert index.get(["v7"])[0].metadata == {"i": 7} and index.get(["v7"])[0].document == "d7"
    hits = index.search(vectors[:5], k=1)
    assert [h[0].id for h in hits] == [f"v{i}" for i in range(5)]
    assert all(h.metadata["i"] < 50 for h in index.search(vectors[0], k=10, filter={"i": {"$lt": 50}})[0])


def test_switch_backend_keeps_records(data) -> None:
    index = VectorIndex(DIM, backend="torch", device="cpu")
    index.add(data["ids"][:500], data["vectors"][:500], data["docs"][:500], data["metas"][:500])
    before = [[(h.id, h.document, h.metadata) for h in row] for row in index.search(data["queries"], k=5)]
    index.switch_backend("faiss")
    assert index.backend_name == "faiss:Flat:cpu"
    assert [[(h.id, h.document, h.metadata) for h in row] for row in index.search(data["queries"], k=5)] == before
    index.switch_backend("faiss", index_factory="IVF4,Flat")  # 500 < 4 * 39? no: trains at >= 1000 -> exact meanwhile
    assert [[h.id for h in row] for row in index.search(data["queries"], k=5)] == [
        [b[0] for b in row] for row in before
    ]
    with pytest.raises(ConfigurationError):
        index.switch_backend("torch", index_factory="HNSW32")
    assert index.backend_name == "faiss:IVF4,Flat:cpu"  # a rejected switch changes nothing


def test_untrained_ivf_searches_exactly_then_trains() -> None:
    index = VectorIndex(DIM, backend="faiss", index_factory="IVF8,Flat", nprobe=8)
    vectors = clustered(1200, seed=12)
    index.add([str(i) for i in range(500)], vectors[:500])
    assert not index._backend.is_trained  # below 1000 records: exact search over the stored vectors
    _, ref = brute(vectors[:500], vectors[:3], 3, "cosine")
    assert [[h.id for h in row] for row in index.search(vectors[:3], k=3)] == [[str(r) for r in row] for row in ref]
    index.add([str(i) for i in range(500, 1200)], vectors[500:])
    assert index._backend.is_trained and index._backend.ntotal == 1200
    _, ref = brute(vectors, vectors[:3], 3, "cosine")
    assert [[h.id for h in row] for row in index.search(vectors[:3], k=3)] == [[str(r) for r in row] for row in ref]


def test_hnsw_tombstones_are_skipped_then_compacted() -> None:
    index = VectorIndex(DIM, backend="faiss", index_factory="HNSW16", compact_fraction=0.5)
    vectors = clustered(400, seed=13)
    ids = [str(i) for i in range(400)]
    index.add(ids, vectors)
    import faiss

    assert faiss.downcast_index(index._backend._index.index).hnsw.efConstruction == 100
    index.delete(ids[:100])  # 100 tombstones <= 0.5 * 300 live: kept
    assert index.stats().tombstones == 100
    hits = index.search(vectors[:100], k=5)
    assert all(len(row) == 5 and all(int(h.id) >= 100 for h in row) for row in hits)
    index.add(ids[100:150], vectors[100:150] + 1.0)  # upserts leave tombstones too
    assert index.stats().tombstones == 150 and index.count == 300
    index.delete(ids[150:200])  # 200 > 0.5 * 250: compaction
    assert index.stats().tombstones == 0 and index._backend.ntotal == 250
    assert index.search(vectors[100] + 1.0, k=1)[0][0].id == "100"


def test_real_embeddings_with_filters(embedder) -> None:
    products = [
        ("Red running shoes with foam soles", {"category": "shoes", "price": 89}),
        ("Blue leather office shoes", {"category": "shoes", "price": 140}),
        ("Waterproof hiking boots", {"category": "shoes", "price": 120}),
        ("Cotton t-shirt, red", {"category": "clothing", "price": 15}),
        ("Wool winter scarf", {"category": "clothing", "price": 25}),
        ("Stainless steel water bottle", {"category": "gear", "price": 20}),
        ("Trail running backpack 10L", {"category": "gear", "price": 75}),
    ]
    texts = [p[0] for p in products]
    index = VectorIndex(embedder.dim, backend="faiss")
    index.add(None, embedder.embed(texts), texts, [p[1] for p in products])
    query = embedder.embed(["shoes for jogging"])
    assert index.search(query, k=1)[0][0].document == texts[0]
    cheap = index.search(query, k=3, filter={"$and": [{"category": "shoes"}, {"price": {"$lt": 130}}]})[0]
    assert cheap[0].document == texts[0] and {h.document for h in cheap} == {texts[0], texts[2]}
    assert (
        index.search(embedder.embed(["something to drink from"]), k=1, filter={"category": "gear"})[0][0].document
        == texts[5]
    )


# ---------------------------------------------------------------------------------------- bad input
@pytest.fixture()
def seeded() -> VectorIndex:
    index = small()
    index.add(["a", "b"], np.eye(4)[:2], ["A", "B"], [{"n": 1}, {"n": 2}])
    return index


def _unchanged(index: VectorIndex) -> None:
    assert index.count == 2 and sorted(index.ids()) == ["a", "b"]
    assert index.get(["a"]) == [Record("a", np.eye(4, dtype=np.float32)[0], "A", {"n": 1})]
    assert [h.id for h in index.search(np.eye(4)[1], k=2)[0]] == ["b", "a"]


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda ix: ix.add(["c"], np.ones((1, 5))), DimensionMismatchError, "dimension 4, the index's \\(got 5"),
        (lambda ix: ix.add(["c"], np.ones(4)), InvalidInputError, "wrap a single vector"),
        (
            lambda ix: ix.add(["c", "d"], np.array([[1, 2, 3, np.nan], [1, 1, 1, 1]])),
            InvalidInputError,
            "'vectors\\[0\\]' must be finite",
        ),
        (
            lambda ix: ix.add(["c", "d"], np.array([[1, 1, 1, 1], [1, 2, 3, np.inf]])),
            InvalidInputError,
            "'vectors\\[1\\]' must be finite",
        ),
        (lambda ix: ix.add(["c", "d"], np.ones((1, 4))), InvalidInputError, "same length \\(got 2 ids and 1 vectors"),
        (lambda ix: ix.add(["c"], np.ones((1, 4)), ["x", "y"]), InvalidInputError, "got 2 documents and 1 vectors"),
        (lambda ix: ix.add(["c"], np.ones((1, 4)), metadatas=[{}, {}]), InvalidInputError, "got 2 metadatas"),
        (
            lambda ix: ix.add(["a"], np.ones((1, 4)), metadatas=[{"when": object()}]),
            InputTypeError,
            "'metadatas\\[0\\].when' must be JSON-representable",
        ),
        (
            lambda ix: ix.add(["a"], np.ones((1, 4)), metadatas=[{"x": float("nan")}]),
            InvalidInputError,
            "'metadatas\\[0\\].x' must be a finite number",
        ),
        (lambda ix: ix.add(["a"], np.ones((1, 4)), metadatas=[{1: "x"}]), InvalidInputError, "str keys"),
        (lambda ix: ix.add(["a"], np.ones((1, 4)), metadatas=[{"s": {1, 2}}]), InputTypeError, "JSON-representable"),
        (
            lambda ix: ix.add(["a"], np.ones((1, 4)), metadatas=["x"]),
            InputTypeError,
            "'metadatas\\[0\\]' must be a dict",
        ),
        (lambda ix: ix.add(["a"], np.ones((1, 4)), metadatas={"x": 1}), InputTypeError, "list of dicts"),
        (lambda ix: ix.add(["a"], np.ones((1, 4)), documents=[3]), InputTypeError, "'documents\\[0\\]' must be a str"),
        (lambda ix: ix.add("a", np.ones((1, 4))), InputTypeError, "'ids' must be None or a list"),
        (lambda ix: ix.add([3], np.ones((1, 4))), InputTypeError, "'ids\\[0\\]' must be a str"),
        (lambda ix: ix.add([""], np.ones((1, 4))), InvalidInputError, "non-empty str"),
        (lambda ix: ix.add(["a"], [["x", 1, 2, 3]]), InputTypeError, "array of numbers"),
        (lambda ix: ix.add(["a"], [[1, 2], [1, 2, 3]]), InputTypeError, "array of numbers"),
        (lambda ix: ix.add(["a"], None), InputTypeError, "array of numbers"),
        (lambda ix: ix.search(np.ones((1, 3)), k=1), DimensionMismatchError, "expected|dimension 4"),
        (lambda ix: ix.search(np.ones((1, 4)), k=0), InvalidInputError, "'k' must be an int >= 1 \\(got 0"),
        (lambda ix: ix.search(np.ones((1, 4)), k=2.0), InvalidInputError, "'k' must be an int"),
        (lambda ix: ix.search(np.ones((1, 4)), k=True), InvalidInputError, "'k' must be an int"),
        (lambda ix: ix.search(np.full((1, 4), np.nan), k=1), InvalidInputError, "'queries\\[0\\]' must be finite"),
        (lambda ix: ix.search(np.ones((1, 1, 4)), k=1), InvalidInputError, "2-D"),
        (lambda ix: ix.search(np.ones((1, 4)), k=1, filter={"n": {"$in": 1}}), FilterError, "must be a list"),
        (lambda ix: ix.delete("a"), InputTypeError, "wrap it"),
        (lambda ix: ix.delete([1]), InputTypeError, "'ids\\[0\\]' must be a str"),
        (lambda ix: ix.get("a"), InputTypeError, "wrap it"),
    ],
)
def test_bad_input_is_typed_and_changes_nothing(seeded: VectorIndex, call, error, words: str) -> None:
    with pytest.raises(error, match=words):
        call(seeded)
    _unchanged(seeded)


def test_dimension_error_says_expected_and_got(seeded: VectorIndex) -> None:
    with pytest.raises(DimensionMismatchError) as info:
        seeded.add(["x"], np.ones((2, 7))[:1])
    assert (info.value.expected, info.value.got) == (4, 7)
    assert "4" in str(info.value) and "7" in str(info.value)


def test_hit_and_record_types() -> None:
    hit = Hit("a", 0.5, "doc", {"x": 1})
    assert hit == Hit("a", 0.5, "doc", {"x": 1}) and "score=0.5000" in repr(hit)
    with pytest.raises(AttributeError):
        hit.score = 1.0  # type: ignore[misc]
    record = Record("a", np.ones(3, dtype=np.float32))
    assert record == Record("a", np.ones(3, dtype=np.float32)) and record != Record("a", np.zeros(3, dtype=np.float32))


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_blockwise_topk_equals_one_shot(metric: str) -> None:
    """The chunked kernel (bounded memory at millions of rows) must equal a one-shot top-k."""
    import torch

    from gpuprompt.index._torch import exact_topk, l2_scores_from_keys

    gen = torch.Generator().manual_seed(0)
    matrix = torch.randn(5000, 16, generator=gen)
    queries = torch.randn(7, 16, generator=gen)
    mask = torch.rand(5000, generator=gen) < 0.3
    norms = matrix.pow(2).sum(1) if metric == "l2" else None
    for allowed in (None, mask):
        keys, rows = exact_topk(queries, matrix, 25, l2_norms=norms, mask=allowed, budget_bytes=1)  # 1024-row blocks
        if metric == "l2":
            full = -torch.cdist(queries, matrix).pow(2)
            keys = -(1.0 / l2_scores_from_keys(keys, queries) - 1.0)
        else:
            full = queries @ matrix.T
        if allowed is not None:
            full = full.masked_fill(~allowed, -float("inf"))
        expected_keys, expected_rows = full.topk(25, dim=1)
        assert torch.equal(rows, expected_rows)
        torch.testing.assert_close(keys, expected_keys, rtol=1e-4, atol=1e-3)
    few = torch.zeros(5000, dtype=torch.bool)
    few[[3, 4000]] = True
    _, rows = exact_topk(queries, matrix, 5, mask=few, budget_bytes=1)
    assert sorted(rows[0, :2].tolist()) == [3, 4000] and rows[0, 2:].tolist() == [-1, -1, -1]


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_half_precision_storage_path(metric: str) -> None:
    """The fp16 storage CUDA uses by default, exercised on the CPU: same neighbours, close scores."""
    vectors = clustered(3000, 16, seed=21)
    queries = vectors[:6] + 0.01
    metas = [{"g": i % 5} for i in range(3000)]
    half = VectorIndex(16, backend="torch", device="cpu", dtype="float16", metric=metric)
    full = VectorIndex(16, backend="torch", device="cpu", metric=metric)
    for index in (half, full):
        index.add([str(i) for i in range(3000)], vectors, metadatas=metas)
    assert half.backend_name == "torch:cpu:float16"
    for flt in (None, {"g": {"$ne": 1}}, {"g": 2}):
        a, b = half.search(queries, 5, filter=flt), full.search(queries, 5, filter=flt)
        assert [row[0].id for row in a] == [row[0].id for row in b]
        assert [len(row) for row in a] == [5] * 6
        np.testing.assert_allclose([row[0].score for row in a], [row[0].score for row in b], rtol=1e-2, atol=1e-2)
    assert [h.id for h in half.mmr(queries[0], k=3)] == [h.id for h in full.mmr(queries[0], k=3)]


def test_dropped_index_is_collected_and_its_worker_stops() -> None:
    import gc
    import weakref

    index = small()
    index.add(["a"], np.eye(4)[:1])
    assert index.search(np.eye(4)[0], k=1)[0][0].id == "a"
    worker = index._batcher._worker
    ref = weakref.ref(index)
    del index
    gc.collect()
    assert ref() is None
    worker.join(timeout=10)
    assert not worker.is_alive()


def test_closed_index_refuses_searches() -> None:
    from gpuprompt.errors import ClosedError

    with small() as index:
        index.add(["a"], np.eye(4)[:1])
        index.search(np.eye(4)[0], k=1)
    with pytest.raises(ClosedError):
        index.search(np.eye(4)[0], k=1)
    assert index.get(["a"])[0].id == "a"  # the data stays readable
