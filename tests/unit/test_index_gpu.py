"""VectorIndex on CUDA: the torch backend in fp16 (and faiss GPU indexes where faiss has GPUs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuprompt import VectorIndex

pytestmark = pytest.mark.gpu

DIM = 64


def _data(n: int = 20_000, seed: int = 0) -> tuple[list[str], np.ndarray, list[dict]]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((50, DIM)).astype(np.float32) * 3
    vectors = (centres[rng.integers(0, 50, n)] + rng.standard_normal((n, DIM))).astype(np.float32)
    return [f"v{i}" for i in range(n)], vectors, [{"i": i, "g": i % 8} for i in range(n)]


@pytest.fixture(scope="module")
def pair() -> tuple[VectorIndex, VectorIndex, np.ndarray]:
    ids, vectors, metas = _data()
    gpu = VectorIndex(DIM, device="cuda")  # auto on CUDA: the torch backend, fp16
    cpu = VectorIndex(DIM, backend="torch", device="cpu")
    for index in (gpu, cpu):
        index.add(ids, vectors, metadatas=metas)
    queries = _data(32, seed=1)[1]
    return gpu, cpu, queries


def test_auto_is_torch_fp16_on_cuda(pair) -> None:
    gpu, _, _ = pair
    assert gpu.backend_name.startswith("torch:cuda") and gpu.backend_name.endswith("float16")


def test_fp16_search_agrees_with_cpu_exact(pair) -> None:
    gpu, cpu, queries = pair
    got, expected = gpu.search(queries, k=10), cpu.search(queries, k=10)
    overlap = np.mean([len({h.id for h in a} & {h.id for h in b}) / 10 for a, b in zip(got, expected)])
    assert overlap >= 0.95
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a[0].score, b[0].score, atol=2e-3)


@pytest.mark.parametrize("flt", [{"g": 3}, {"g": {"$ne": 3}}, {"i": {"$lt": 5}}, {"g": 99}])
def test_filters_on_cuda_return_exactly_min_k(pair, flt: dict) -> None:
    gpu, cpu, queries = pair
    got = gpu.search(queries, k=20, filter=flt)
    expected = cpu.search(queries, k=20, filter=flt)
    assert [len(row) for row in got] == [len(row) for row in expected]
    from gpuprompt.index.filters import matches

    assert all(matches(flt, h.metadata) for row in got for h in row)


def test_device_tensor_queries_and_mmr(pair) -> None:
    import torch

    gpu, _, queries = pair
    on_device = torch.from_numpy(queries).cuda()
    assert [[h.id for h in r] for r in gpu.search(on_device, k=5)] == [
        [h.id for h in r] for r in gpu.search(queries, k=5)
    ]
    picked = gpu.mmr(on_device[0], k=5, fetch_k=40, lambda_mult=0.3)
    assert len(picked) == 5 and len({h.id for h in picked}) == 5
    assert {h.id for h in picked} <= {h.id for h in gpu.search(queries[0], k=40)[0]}


def test_chunked_topk_over_a_million_rows() -> None:
    index = VectorIndex(32, backend="torch", device="cuda")
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((1_000_000, 32)).astype(np.float32)
    index.add(None, vectors)
    hits = index.search(vectors[[10, 999_999]], k=3)
    assert [row[0].score for row in hits] == pytest.approx([1.0, 1.0], abs=2e-3)
    assert index.count == 1_000_000


def test_save_on_cuda_load_on_cpu_and_back(pair, tmp_path: Path) -> None:
    gpu, cpu, queries = pair
    gpu.save(tmp_path / "snap")
    on_cpu = VectorIndex.load(tmp_path / "snap", device="cpu")
    assert on_cpu.backend_name.startswith("torch:cpu")
    assert [[h.id for h in r] for r in on_cpu.search(queries, k=5)] == [
        [h.id for h in r] for r in cpu.search(queries, k=5)
    ]
    back = VectorIndex.load(tmp_path / "snap", device="cuda")
    assert back.backend_name.startswith("torch:cuda") and back.count == gpu.count


def test_faiss_gpu_flat_when_available() -> None:
    from gpuprompt.index._faiss import faiss_gpu_available

    if not faiss_gpu_available():
        pytest.skip("this faiss build has no GPU support")
    ids, vectors, metas = _data(5000)
    index = VectorIndex(DIM, backend="faiss", device="cuda")
    index.add(ids, vectors, metadatas=metas)
    assert index.backend_name == "faiss:Flat:gpu"
    index.delete(ids[:100])  # GPU indexes keep tombstones
    hits = index.search(vectors[:200], k=5, filter={"g": 2})
    assert all(len(row) == 5 and all(h.metadata["g"] == 2 and h.metadata["i"] >= 100 for h in row) for row in hits)


def test_auto_with_an_index_factory_is_faiss_on_a_cuda_machine() -> None:
    from gpuprompt.index._faiss import faiss_gpu_available

    ids, vectors, _ = _data(5000)
    index = VectorIndex(DIM, index_factory="IVF64,Flat")  # device auto resolves to CUDA here
    index.add(ids, vectors)
    name = index.backend_name
    assert name is not None and name.startswith("faiss:")
    assert name.endswith(":gpu" if faiss_gpu_available() else ":cpu")
    assert [h.id for h in index.search(vectors[:3], k=1)[0]] == [ids[0]]
