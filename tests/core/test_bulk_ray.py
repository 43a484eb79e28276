"""Bulk indexing on Ray Data (a local 2-CPU cluster on loopback): the same index as one process, resumable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.data")

from gpuprompt import VectorIndex
from gpuprompt.apps.bulk import index_bulk
from gpuprompt.apps.bulk._ray import LOOPBACK, ensure_ray

pytestmark = pytest.mark.ray

WORDS = ["dress", "jeans", "cotton", "wash", "shrink", "red", "navy", "size", "return", "order", "delivery", "fabric", "wool", "linen", "zip", "hem"]
OPTIONS = {"chunk_size": 160, "chunk_overlap": 20, "batch_size": 8, "id_field": "id", "progress": False}


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster (2 CPUs, node address on loopback) for the session; reused if already up."""
    import ray

    started = ensure_ray(ray, None, num_cpus=2, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)
    lines = [
        json.dumps({"id": f"doc-{i}", "text": " ".join(rng.choice(WORDS, size=int(rng.integers(5, 60))))})
        for i in range(30)
    ]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def records(path: Path) -> dict[str, object]:
    index = VectorIndex.load(path)
    return {r.id: r for r in index.get(index.ids())}


def assert_same_index(got_path: Path, want_path: Path) -> None:
    got, want = records(got_path), records(want_path)
    assert sorted(got) == sorted(want)
    for key, record in want.items():
        assert got[key].document == record.document and got[key].metadata == record.metadata
        np.testing.assert_allclose(got[key].vector, record.vector, atol=1e-5)
    assert VectorIndex.load(got_path).config.embedder == VectorIndex.load(want_path).config.embedder


def test_the_cluster_is_on_loopback(ray_cluster) -> None:
    assert ray_cluster.util.get_node_ip_address() == LOOPBACK
    assert {node["NodeManagerAddress"] for node in ray_cluster.nodes()} == {LOOPBACK}


def test_ray_and_one_process_build_the_same_index(ray_cluster, corpus: Path, tmp_path: Path, embedder) -> None:
    here = index_bulk(corpus, tmp_path / "here", embedder=embedder, **OPTIONS)
    on_ray = index_bulk(corpus, tmp_path / "ray", ray=True, embedder=embedder.config, **OPTIONS)
    assert on_ray.ray and on_ray.actors == 2  # sized to the cluster's 2 CPUs
    assert (on_ray.chunks, on_ray.embedded, on_ray.skipped) == (here.chunks, here.chunks, 0)
    assert_same_index(tmp_path / "ray", tmp_path / "here")
    assert ray_cluster.is_initialized()  # a cluster the caller started is left running


def test_ray_resumes_from_a_partial_run(ray_cluster, corpus: Path, tmp_path: Path, embedder) -> None:
    """A run that stopped after its first commit (here: the callback raises) is finished on Ray,
    embedding only the shards not recorded as done."""

    class Stop(Exception):
        pass

    def stop(written: int) -> None:
        raise Stop(written)

    with pytest.raises(Stop):
        index_bulk(corpus, tmp_path / "idx", embedder=embedder, checkpoint_every=16, on_commit=stop, **OPTIONS)
    done = json.loads((tmp_path / "idx.progress.json").read_text())["chunks_written"]
    assert done == 16
    resumed = index_bulk(corpus, tmp_path / "idx", ray=True, embedder=embedder.config, **OPTIONS)
    assert resumed.skipped == done and resumed.embedded == resumed.chunks - done
    index_bulk(corpus, tmp_path / "clean", embedder=embedder, **OPTIONS)
    assert_same_index(tmp_path / "idx", tmp_path / "clean")
