"""IndexConfig: one frozen, keyword-only config; VectorIndex takes it, reports it, saves and restores it."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gpuprompt import IndexConfig, VectorIndex
from gpuprompt.errors import ConfigurationError, SnapshotError
from gpuprompt.index._config import OPTIONS

DIM = 8


def _index(**options) -> VectorIndex:
    index = VectorIndex(DIM, backend="torch", device="cpu", **options)
    index.add([f"r{i}" for i in range(20)], np.random.default_rng(0).standard_normal((20, DIM)))
    return index


def _rewrite_config(path: Path, change) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["config"] = change(manifest["config"])
    (path / "manifest.json").write_text(json.dumps(manifest))


# ---------------------------------------------------------------------------------------- the dataclass
def test_defaults_frozen_and_keyword_only() -> None:
    config = IndexConfig(dim=DIM)
    assert (config.metric, config.backend, config.device, config.index_factory) == ("cosine", "auto", "auto", None)
    assert (config.ann_threshold, config.compact_fraction) == (50_000, 0.25)
    assert (config.max_batch_size, config.max_wait_ms, config.max_queue) == (64, 2.0, 10_000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dim = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        IndexConfig(DIM)  # type: ignore[misc]
    assert OPTIONS == tuple(f.name for f in dataclasses.fields(IndexConfig) if f.name != "dim")


def test_values_are_normalised_to_plain_json() -> None:
    config = IndexConfig(
        dim=np.int64(DIM),
        index_factory="  HNSW16 ",
        ef_search=np.int32(40),
        ann_threshold=np.uint16(7),
        compact_fraction=1,
        max_wait_ms=np.float32(0.5),
        max_batch_size=np.int64(3),
    )
    assert config.index_factory == "HNSW16"
    assert type(config.dim) is int and type(config.ef_search) is int and type(config.max_batch_size) is int
    assert type(config.compact_fraction) is float and type(config.max_wait_ms) is float
    saved = json.loads(json.dumps(dataclasses.asdict(config)))
    assert IndexConfig(**saved) == config


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"dim": 0}, "'dim' must be an int >= 1"),
        ({"dim": True}, "'dim' must be an int"),
        ({"metric": "dot"}, "'metric' must be one of"),
        ({"backend": "annoy"}, "'backend' must be one of"),
        ({"device": "gpu"}, "'device' must be 'auto', 'cpu'"),
        ({"device": "cpu\n"}, "'device' must be"),
        ({"index_factory": ""}, "'index_factory' must be"),
        ({"index_factory": "HNSW\ud800"}, "valid Unicode"),
        ({"backend": "torch", "index_factory": "HNSW32"}, "'index_factory' is a faiss option"),
        ({"ef_search": 0}, "'ef_search' must be an int >= 1"),
        ({"ef_construction": 2.5}, "'ef_construction' must be an int"),
        ({"nprobe": "8"}, "'nprobe' must be an int"),
        ({"dtype": "int8"}, "'dtype' must be one of"),
        ({"ann_threshold": -1}, "'ann_threshold' must be an int >= 0"),
        ({"compact_fraction": 0}, r"'compact_fraction' must be a number in \(0, 10\]"),
        ({"compact_fraction": math.inf}, "'compact_fraction'"),
        ({"max_batch_size": 0}, "'max_batch_size' must be an int >= 1"),
        ({"max_wait_ms": -1}, "'max_wait_ms'"),
        ({"max_queue": 0}, "'max_queue' must be an int >= 1"),
    ],
)
def test_bad_values_are_configuration_errors(options: dict, words: str) -> None:
    fields = {"dim": DIM, **options}
    with pytest.raises(ConfigurationError, match=words):
        IndexConfig(**fields)
    dim = fields.pop("dim")
    with pytest.raises(ConfigurationError, match=words):  # the same check, the same message, from VectorIndex
        VectorIndex(dim, **fields)


def test_replace_validates_and_names_unknown_fields() -> None:
    config = IndexConfig(dim=DIM)
    assert config.replace(ef_search=12).ef_search == 12 and config.ef_search is None
    with pytest.raises(ConfigurationError, match="'efsearch' must be a VectorIndex option.*Did you mean 'ef_search'"):
        config.replace(efsearch=12)
    with pytest.raises(ConfigurationError, match="'ef_search' must be an int >= 1"):
        config.replace(ef_search=0)


def test_constructing_a_config_loads_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from gpuprompt import IndexConfig, VectorIndex\n"
        "VectorIndex(config=IndexConfig(dim=4, backend='faiss', index_factory='HNSW32'))\n"
        "print(','.join(m for m in ('torch', 'faiss') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == ""


# ---------------------------------------------------------------------------------------- VectorIndex
def test_vector_index_takes_options_or_a_config() -> None:
    options = {"metric": "ip", "backend": "faiss", "index_factory": "HNSW16", "ef_search": 32, "max_queue": 5}
    by_options = VectorIndex(DIM, **options)
    config = IndexConfig(dim=DIM, **options)
    assert by_options.config == config
    by_config = VectorIndex(config=config)
    assert by_config.config is config
    assert (by_config.dim, by_config.metric) == (DIM, "ip")
    assert VectorIndex(DIM, config=config).config is config  # dim may be given too if it agrees
    assert VectorIndex(config=config, ef_search=64).config == config.replace(ef_search=64)


@pytest.mark.parametrize(
    ("args", "kwargs", "words"),
    [
        ((), {}, "'dim' must be an int"),
        ((4,), {"config": IndexConfig(dim=DIM)}, "'dim' must be None or config.dim"),
        ((), {"config": {"dim": DIM}}, "'config' must be an IndexConfig"),
        ((), {"config": IndexConfig(dim=DIM), "ef_search": 0}, "'ef_search' must be an int >= 1"),
        ((), {"config": IndexConfig(dim=DIM), "nprobes": 3}, "'nprobes' must be a VectorIndex option"),
    ],
)
def test_vector_index_refuses_bad_config_arguments(args: tuple, kwargs: dict, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        VectorIndex(*args, **kwargs)


def test_switch_backend_and_search_params_replace_the_config() -> None:
    index = VectorIndex(DIM, backend="faiss", index_factory="HNSW16", device="cpu", max_batch_size=7)
    index.add([f"r{i}" for i in range(30)], np.random.default_rng(1).standard_normal((30, DIM)))
    index.set_search_params(ef_search=99)
    assert index.config == IndexConfig(
        dim=DIM, backend="faiss", index_factory="HNSW16", device="cpu", max_batch_size=7, ef_search=99
    )
    assert index._backend.ef_search == 99
    index.switch_backend("torch")
    assert index.config.backend == "torch" and index.config.index_factory is None
    assert index.config.ef_search == 99 and index.config.max_batch_size == 7
    before = index.config
    with pytest.raises(ConfigurationError, match="'index_factory' is a faiss option"):
        index.switch_backend("torch", index_factory="Flat")
    with pytest.raises(ConfigurationError, match="'nprobe' must be an int >= 1"):
        index.set_search_params(nprobe=0)
    assert index.config is before and index.backend_name == "torch:cpu:float32"


def test_check_options_validates_without_a_dim() -> None:
    VectorIndex.check_options(metric="l2", max_wait_ms=0)
    VectorIndex.check_options(dim=3, backend="faiss", index_factory="Flat")
    with pytest.raises(ConfigurationError, match="'max_wait_ms'"):
        VectorIndex.check_options(max_wait_ms=-5)


# ---------------------------------------------------------------------------------------- snapshots
def test_save_writes_the_whole_config_and_load_restores_it(tmp_path: Path) -> None:
    index = _index(metric="l2", ann_threshold=123, compact_fraction=0.5, max_batch_size=9, max_wait_ms=0.0)
    index.save(tmp_path / "snap")
    manifest = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert manifest["config"] == dataclasses.asdict(index.config)
    loaded = VectorIndex.load(tmp_path / "snap", device="cpu")
    assert loaded.config == index.config
    assert loaded.search(index.get(["r3"])[0].vector, k=1)[0][0].id == "r3"
    # load's arguments are applied over the saved config (dataclasses.replace)
    again = VectorIndex.load(tmp_path / "snap", backend="faiss", ef_search=40, max_queue=3)
    assert again.config == dataclasses.replace(index.config, backend="faiss", device="auto", ef_search=40, max_queue=3)


def test_older_manifests_partial_config_still_loads(tmp_path: Path) -> None:
    index = _index(metric="ip", ann_threshold=77, max_batch_size=9)
    index.save(tmp_path / "snap")
    older = ("backend", "index_factory", "ef_search", "ef_construction", "nprobe", "dtype")
    older += ("ann_threshold", "compact_fraction")
    _rewrite_config(tmp_path / "snap", lambda config: {name: config[name] for name in older})
    loaded = VectorIndex.load(tmp_path / "snap", device="cpu")
    # dim and metric come from the manifest, device from load, the queue options from the defaults
    assert loaded.config == IndexConfig(dim=DIM, metric="ip", backend="torch", device="cpu", ann_threshold=77)
    assert sorted(loaded.ids()) == sorted(index.ids())


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda c: {**c, "dim": DIM + 1}, "config is invalid.*'config.dim' must equal the manifest's dim 8"),
        (lambda c: {**c, "metric": "l2"}, "config is invalid.*'config.metric' must equal"),
        (lambda c: {**c, "max_queue": 0}, "config is invalid.*'max_queue'"),
        (lambda c: {**c, "device": "tpu"}, "config is invalid.*'device'"),
        (lambda c: {**c, "queue": 3}, "config is invalid.*'queue' must be a VectorIndex option"),
    ],
)
def test_a_saved_config_that_is_invalid_is_refused(tmp_path: Path, change, words: str) -> None:
    _index().save(tmp_path / "snap")
    _rewrite_config(tmp_path / "snap", change)
    with pytest.raises(SnapshotError, match=words):
        VectorIndex.load(tmp_path / "snap", device="cpu")


def test_a_dimension_that_would_allocate_gigabytes_is_refused() -> None:
    # Found by the LlamaIndex property test: dim=6,170,897 tried to allocate 23.5 GiB at the first add.
    with pytest.raises(ConfigurationError, match="'dim'"):
        IndexConfig(dim=6_170_897)
    with pytest.raises(ConfigurationError, match="'dim'"):
        VectorIndex.check_options(dim=65_537)
    assert IndexConfig(dim=65_536).dim == 65_536
