"""The index's embedder record: which embedder made its vectors, kept in memory and in snapshots,
and vectors of another embedder refused (EmbedderMismatchError) unless the caller allows them."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from gpuprompt import VectorIndex
from gpuprompt.errors import ConfigurationError, EmbedderMismatchError, InputTypeError, InvalidInputError
from gpuprompt.index import IndexConfig

FP32 = "sentence-transformers/all-MiniLM-L6-v2"
INT8 = "sentence-transformers/all-MiniLM-L6-v2;int8"


def _vectors(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def test_first_named_add_records_the_embedder() -> None:
    index = VectorIndex(8)
    assert index.config.embedder is None
    index.add(["a"], _vectors(1))  # unnamed vectors: nothing recorded, nothing checked
    assert index.config.embedder is None
    index.add(["b"], _vectors(1, seed=1), embedder=FP32)
    assert index.config.embedder == FP32
    index.add(["c"], _vectors(1, seed=2), embedder=FP32)
    index.add(["d"], _vectors(1, seed=3))  # unnamed vectors are still accepted
    assert index.count == 4


def test_another_embedder_is_refused_and_nothing_changes() -> None:
    index = VectorIndex(8)
    index.add(["a", "b"], _vectors(2), embedder=FP32)
    with pytest.raises(EmbedderMismatchError) as caught:
        index.add(["b", "c"], _vectors(2, seed=5), embedder=INT8)
    assert caught.value.expected == FP32 and caught.value.got == INT8
    assert "allow_other_embedder=True" in str(caught.value)
    assert isinstance(caught.value, InvalidInputError)
    assert sorted(index.ids()) == ["a", "b"]
    np.testing.assert_allclose(index.get(["b"])[0].vector, _vectors(2)[1], rtol=1e-6)
    assert index.config.embedder == FP32


def test_allow_other_embedder_adds_and_keeps_the_record() -> None:
    index = VectorIndex(8, embedder=FP32)  # declared up front
    index.add(["x"], _vectors(1), embedder=INT8, allow_other_embedder=True)
    assert index.count == 1 and index.config.embedder == FP32


def test_clear_forgets_the_record() -> None:
    index = VectorIndex(8)
    index.add(["a"], _vectors(1), embedder=FP32)
    index.clear()
    assert index.config.embedder is None
    index.add(["a"], _vectors(1), embedder=INT8)
    assert index.config.embedder == INT8


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"embedder": ""}, InvalidInputError),
        ({"embedder": 3}, InputTypeError),
        ({"embedder": "m\ud800"}, InvalidInputError),
        ({"embedder": "m" * 600}, InvalidInputError),
        ({"embedder": FP32, "allow_other_embedder": "yes"}, InputTypeError),
    ],
)
def test_bad_arguments_are_typed_errors(kwargs: dict, error: type[Exception]) -> None:
    index = VectorIndex(8)
    with pytest.raises(error):
        index.add(["a"], _vectors(1), **kwargs)
    assert index.count == 0 and index.config.embedder is None


def test_bad_config_value_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="'embedder'"):
        IndexConfig(dim=8, embedder="")
    with pytest.raises(ConfigurationError, match="'embedder'"):
        VectorIndex(8, embedder=["a"])


def test_snapshot_keeps_the_record(tmp_path: Path) -> None:
    index = VectorIndex(8)
    index.add(["a"], _vectors(1), embedder=INT8)
    index.save(tmp_path / "kb")
    loaded = VectorIndex.load(tmp_path / "kb")
    assert loaded.config.embedder == INT8
    with pytest.raises(EmbedderMismatchError):
        loaded.add(["b"], _vectors(1), embedder=FP32)


def test_snapshot_from_before_the_record_loads_as_unknown(tmp_path: Path) -> None:
    index = VectorIndex(8)
    index.add(["a"], _vectors(1))
    index.save(tmp_path / "kb")
    manifest_path = tmp_path / "kb" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["config"].pop("embedder") is None
    # The manifest is checksummed over its files, not itself: an older writer simply had no key.
    manifest_path.write_text(json.dumps(manifest))
    loaded = VectorIndex.load(tmp_path / "kb")
    assert loaded.config.embedder is None and loaded.count == 1


def test_concurrent_first_adds_from_two_embedders_record_exactly_one() -> None:
    for attempt in range(20):
        index = VectorIndex(8)
        errors: list[BaseException] = []
        barrier = threading.Barrier(2)

        def add(name: str, ident: str) -> None:
            barrier.wait()
            try:
                index.add([name], _vectors(1, seed=attempt), embedder=ident)
            except EmbedderMismatchError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=add, args=("a", FP32)), threading.Thread(target=add, args=("b", INT8))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(errors) == 1 and index.count == 1
        winner = index.ids()[0]
        assert index.config.embedder == (FP32 if winner == "a" else INT8)


def test_aadd_passes_the_record() -> None:
    index = VectorIndex(8)

    async def main() -> None:
        await index.aadd(["a"], _vectors(1), embedder=FP32)
        with pytest.raises(EmbedderMismatchError):
            await index.aadd(["b"], _vectors(1), embedder=INT8)

    asyncio.run(main())
    assert index.count == 1


def test_real_embedder_identity_guards_the_index(embedder) -> None:  # noqa: ANN001 - session fixture
    """The identity of the bundled fp32 embedder is what an index records; a second embedder with
    another identity (unnormalised vectors here: no int8 model is needed) is refused."""
    from gpuprompt import Embedder

    other = Embedder(normalize=False)
    assert embedder.identity != other.identity
    index = VectorIndex(embedder.dim)
    index.add(["a"], embedder.embed(["red shoes"]), embedder=embedder.identity)
    with pytest.raises(EmbedderMismatchError):
        index.add(["b"], other.embed(["blue shoes"]), embedder=other.identity)
    other.close()
