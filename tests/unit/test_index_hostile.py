"""Hostile input to VectorIndex: refused at the boundary, with typed errors, and nothing stored changes.

Each case here was accepted once and broke something later: a lone surrogate stored, then every
save failed; a 400-digit int stored, then range filters failed; a self-referencing dict hung add();
10,000 levels of nesting raised RecursionError; complex and numeric-string vectors were coerced;
a vector of 1e30s scored 0 against itself under cosine (its norm overflowed float32).
"""

from __future__ import annotations

import math
import threading
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprompt import Record, VectorIndex
from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError
from gpuprompt.index._checks import SQUARED_NORM_LIMIT
from gpuprompt.index._config import OPTIONS

DIM = 4
F32_MAX = float(np.finfo(np.float32).max)


@pytest.fixture()
def seeded() -> VectorIndex:
    index = VectorIndex(DIM, backend="torch", device="cpu")
    index.add(["a", "b"], np.eye(DIM)[:2], ["A", "B"], [{"n": 1}, {"n": 2}])
    yield index
    index.close()


def _state(index: VectorIndex) -> tuple:
    ids = sorted(index.ids())
    return index.count, ids, [(r.id, r.vector.tobytes(), r.document, r.metadata) for r in index.get(ids)]


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"x": value}
    return value


def _cyclic_dict() -> dict:
    value: dict = {"a": 1}
    value["self"] = value
    return value


def _cyclic_list() -> dict:
    items: list = [1]
    items.append(items)
    return {"items": items}


def _complex_tensor():
    import torch

    return torch.ones((1, DIM), dtype=torch.complex64)


def _bool_tensor():
    import torch

    return torch.ones((1, DIM), dtype=torch.bool)


ONE = np.ones((1, DIM))

REFUSED_ADDS = [
    # well-formed text: a lone surrogate cannot be encoded, so it would break every later save
    ("surrogate id", lambda ix: ix.add(["c\ud800"], ONE), InvalidInputError, r"'ids\[0\]' must be valid Unicode"),
    ("surrogate doc", lambda ix: ix.add(["c"], ONE, ["x\udfff"]), InvalidInputError, r"'documents\[0\]' must be valid"),
    (
        "surrogate value",
        lambda ix: ix.add(["c"], ONE, metadatas=[{"k": "\ud83d"}]),
        InvalidInputError,
        r"'metadatas\[0\]\.k' must be valid Unicode",
    ),
    (
        "surrogate key",
        lambda ix: ix.add(["c"], ONE, metadatas=[{"k\udc00": 1}]),
        InvalidInputError,
        "must be valid Unicode",
    ),
    (
        "surrogate in list",
        lambda ix: ix.add(["c"], ONE, metadatas=[{"tags": ["ok", "\ud800"]}]),
        InvalidInputError,
        r"tags\[1\]' must be valid Unicode",
    ),
    # ints beyond int64 broke range filters later
    ("400 digits", lambda ix: ix.add(["c"], ONE, metadatas=[{"n": 10**400}]), InvalidInputError, "within 64 bits"),
    ("2**63", lambda ix: ix.add(["c"], ONE, metadatas=[{"n": 2**63}]), InvalidInputError, "within 64 bits"),
    ("-2**63-1", lambda ix: ix.add(["c"], ONE, metadatas=[{"n": [-(2**63) - 1]}]), InvalidInputError, "64 bits"),
    # cycles hung add(); deep nesting raised RecursionError
    ("cyclic dict", lambda ix: ix.add(["c"], ONE, metadatas=[_cyclic_dict()]), InvalidInputError, "contain itself"),
    ("cyclic list", lambda ix: ix.add(["c"], ONE, metadatas=[_cyclic_list()]), InvalidInputError, "contain itself"),
    ("depth 10,000", lambda ix: ix.add(["c"], ONE, metadatas=[_nested(10_000)]), InvalidInputError, "nested at most"),
    ("depth 100", lambda ix: ix.add(["c"], ONE, metadatas=[_nested(100)]), InvalidInputError, "nested at most"),
    ("inf", lambda ix: ix.add(["c"], ONE, metadatas=[{"x": math.inf}]), InvalidInputError, "finite number"),
    ("bytes", lambda ix: ix.add(["c"], ONE, metadatas=[{"x": b"raw"}]), InputTypeError, "JSON-representable"),
    ("Decimal", lambda ix: ix.add(["c"], ONE, metadatas=[{"x": Decimal(1)}]), InputTypeError, "JSON-representable"),
    # vectors: only real numbers, finite as float32
    ("complex", lambda ix: ix.add(["c"], np.ones((1, DIM), dtype=complex)), InputTypeError, "ints or floats"),
    ("complex list", lambda ix: ix.add(["c"], [[1j, 0, 0, 0]]), InputTypeError, "ints or floats"),
    ("numeric strings", lambda ix: ix.add(["c"], [["1", "2", "3", "4"]]), InputTypeError, "ints or floats"),
    ("str array", lambda ix: ix.add(["c"], np.array([["1.5"] * DIM])), InputTypeError, "ints or floats"),
    ("bools", lambda ix: ix.add(["c"], np.ones((1, DIM), dtype=bool)), InputTypeError, "ints or floats"),
    ("Fractions", lambda ix: ix.add(["c"], [[Fraction(1, 3)] * DIM]), InputTypeError, "ints or floats"),
    ("None inside", lambda ix: ix.add(["c"], [[1.0, None, 0, 0]]), InputTypeError, "ints or floats"),
    ("complex tensor", lambda ix: ix.add(["c"], _complex_tensor()), InputTypeError, "tensor of real numbers"),
    ("bool tensor", lambda ix: ix.add(["c"], _bool_tensor()), InputTypeError, "tensor of real numbers"),
    (
        "float64 beyond float32",
        lambda ix: ix.add(["c", "d"], np.array([[1.0] * DIM, [1e39, 0, 0, 0]])),
        InvalidInputError,
        r"'vectors\[1\]' must be finite",
    ),
    (
        "int beyond float32",
        lambda ix: ix.add(["c"], [[10**39, 0, 0, 0]]),
        InputTypeError,
        "ints or floats",  # an object array: Python ints too large for int64
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "words"), [case[1:] for case in REFUSED_ADDS], ids=[c[0] for c in REFUSED_ADDS]
)
def test_refused_adds_are_typed_and_change_nothing(seeded: VectorIndex, tmp_path: Path, call, error, words) -> None:
    before = _state(seeded)
    result: list[BaseException] = []

    def run() -> None:
        try:
            call(seeded)
        except BaseException as exc:  # noqa: BLE001 - checked below
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True)  # a hang (the cyclic dict did) fails, not blocks
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "add() hung"
    assert result, "add() accepted hostile input"
    assert isinstance(result[0], error), repr(result[0])
    assert not isinstance(result[0], RecursionError)
    import re

    assert re.search(words, str(result[0])), str(result[0])
    assert _state(seeded) == before
    seeded.save(tmp_path / "snap")  # what was accepted still saves
    assert _state(VectorIndex.load(tmp_path / "snap", device="cpu")) == before


def test_accepted_edge_values_save_filter_and_load(tmp_path: Path) -> None:
    index = VectorIndex(DIM, backend="torch", device="cpu")
    metas = [
        {"n": 2**63 - 1, "text": "emoji 😀 and ünïcode", "deep": _nested(20)},
        {"n": -(2**63), "tags": ["a", "b"], "f": 1e308},
        {"n": 0, "np": np.int64(5), "np_f": np.float32(0.5)},
    ]
    index.add(["x", "y", "z"], np.eye(DIM)[:3], ["😀", None, "plain"], metas)
    assert index.get(["z"])[0].metadata == {"n": 0, "np": 5, "np_f": 0.5}
    assert sorted(index.ids(filter={"n": {"$gt": 0}})) == ["x"]
    assert sorted(index.ids(filter={"n": {"$lt": 0}})) == ["y"]
    index.save(tmp_path / "snap")
    loaded = VectorIndex.load(tmp_path / "snap", device="cpu")
    assert _state(loaded) == _state(index)


def test_other_entry_points_refuse_bad_text(seeded: VectorIndex) -> None:
    before = _state(seeded)
    with pytest.raises(InvalidInputError, match="valid Unicode"):
        seeded.delete(["a\ud800"])
    with pytest.raises(InvalidInputError, match="valid Unicode"):
        seeded.get(["a\ud800"])
    with pytest.raises(InputTypeError, match=r"'ids\[1\]' must be a str"):
        seeded.delete(["a", 3])
    with pytest.raises(InvalidInputError, match="'k' must be an int >= 1"):
        seeded.search(np.ones(DIM), k="3")
    with pytest.raises(InvalidInputError, match="'lambda_mult' must be a finite number"):
        seeded.mmr(np.ones(DIM), lambda_mult=math.nan)
    with pytest.raises(InvalidInputError, match="'fetch_k' must be an int >= 1"):
        seeded.mmr(np.ones(DIM), fetch_k=True)
    with pytest.raises(InputTypeError, match="ints or floats"):
        seeded.search(np.array([1 + 1j, 0, 0, 0]), k=1)
    with pytest.raises(InputTypeError, match="ints or floats"):
        seeded.mmr(["1", "0", "0", "0"])
    with pytest.raises(InvalidInputError, match=r"'queries\[0\]' must be finite"):
        seeded.search(np.array([1e39, 0, 0, 0]), k=1)
    assert _state(seeded) == before


# ---------------------------------------------------------------------------------------- large values
@pytest.mark.parametrize("kind", ["torch", "faiss"])
def test_large_finite_vectors_keep_their_cosine(kind: str) -> None:
    """A vector of 1e30s used to score 0 against itself: its norm overflowed float32."""
    index = VectorIndex(DIM, backend=kind, device="cpu")
    big = np.array([[1e30, 1e30, 0, 0], [F32_MAX, 0, 0, F32_MAX], [0, 0, 1, 0]], dtype=np.float32)
    index.add(["big", "max", "unit"], big)
    hits = index.search(np.array([[1.0, 1.0, 0, 0], [1e-30, 0, 0, 1e-30]]), k=3)
    assert hits[0][0].id == "big" and hits[0][0].score == pytest.approx(1.0, abs=1e-5)
    assert hits[1][0].id == "max" and hits[1][0].score == pytest.approx(1.0, abs=1e-5)
    assert all(math.isfinite(h.score) for row in hits for h in row)
    own = index.search(big, k=1)
    assert [row[0].id for row in own] == ["big", "max", "unit"]
    assert index.mmr(big[0] * 3, k=2, fetch_k=3)[0].id == "big"


@pytest.mark.parametrize("kind", ["torch", "faiss"])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_vectors_too_long_for_the_metric_are_refused(kind: str, metric: str, seeded) -> None:
    index = VectorIndex(DIM, backend=kind, device="cpu", metric=metric)
    index.add(["a"], np.eye(DIM)[:1])
    before = _state(index)
    with pytest.raises(InvalidInputError, match=r"'vectors\[0\]' must have a squared norm of at most"):
        index.add(["big"], np.full((1, DIM), 1e19, dtype=np.float32))
    with pytest.raises(InvalidInputError, match=r"'queries\[0\]' must have a squared norm"):
        index.search(np.full(DIM, 1e19), k=1)
    assert _state(index) == before
    # just under the limit: accepted, and no score overflows or turns NaN
    edge = math.sqrt(SQUARED_NORM_LIMIT / DIM) * 0.99
    index.add(["edge"], np.full((1, DIM), edge, dtype=np.float32))
    index.add(["near"], np.array([[1.0, 0.1, 0, 0]]))
    for query in (np.array([1.0, 0, 0, 0]), np.full(DIM, edge), np.full(DIM, -edge)):
        hits = index.search(query, k=3)[0]
        assert len(hits) == 3 and all(math.isfinite(h.score) for h in hits), hits
    if metric == "l2":
        assert [h.id for h in index.search(np.array([1.0, 0, 0, 0]), k=2)[0]] == ["a", "near"]
        assert index.search(np.full(DIM, edge), k=1)[0][0].id == "edge"


def test_half_precision_storage_refuses_values_it_cannot_hold() -> None:
    index = VectorIndex(DIM, backend="torch", device="cpu", dtype="float16", metric="ip")
    index.add(["a"], np.eye(DIM)[:1])
    with pytest.raises(InvalidInputError, match=r"within \+-65504.*dtype='float32'"):
        index.add(["b", "big"], np.array([[1.0, 0, 0, 0], [1e5, 0, 0, 0]]))
    assert index.count == 1
    cosine = VectorIndex(DIM, backend="torch", device="cpu", dtype="float16")
    cosine.add(["big"], np.array([[1e30, 0, 0, 0]]))  # normalised before it is stored: fine
    assert cosine.search(np.array([1.0, 0, 0, 0]), k=1)[0][0].score == pytest.approx(1.0, abs=1e-3)


def test_nan_keys_never_rank_first() -> None:
    import torch

    from gpuprompt.index._torch import exact_topk

    matrix = torch.tensor([[1.0, 0.0], [float("nan"), 0.0], [0.5, 0.0]])
    for budget in (1, 1 << 20):
        _, rows = exact_topk(torch.tensor([[1.0, 0.0]]), matrix, 3, budget_bytes=budget)
        assert rows[0].tolist()[:2] == [0, 2]


# ---------------------------------------------------------------------------------------- options
def test_unknown_constructor_options_fail_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="'efsearch' must be a VectorIndex option") as info:
        VectorIndex(8, efsearch=5)
    message = str(info.value)
    assert "Did you mean 'ef_search'" in message
    assert all(name in message for name in OPTIONS)
    with pytest.raises(ConfigurationError, match="'device' must be 'auto', 'cpu'"):
        VectorIndex(8, device="gpu")
    with pytest.raises(ConfigurationError, match="'device' must be"):
        VectorIndex(8, device="cuda:x")
    with pytest.raises(ConfigurationError, match="'index_factory' must be"):
        VectorIndex(8, index_factory=3)
    with pytest.raises(ConfigurationError, match="valid Unicode"):
        VectorIndex(8, index_factory="HNSW\ud800")
    with pytest.raises(ConfigurationError, match="'ann_threshold' must be an int"):
        VectorIndex(8, ann_threshold=1.5)
    with pytest.raises(ConfigurationError, match="'compact_fraction'"):
        VectorIndex(8, compact_fraction=math.nan)
    with pytest.raises(ConfigurationError, match="'max_wait_ms'"):
        VectorIndex(8, max_wait_ms=-1)
    VectorIndex.check_options(metric="ip", backend="faiss", index_factory="HNSW32", ef_search=5)
    with pytest.raises(ConfigurationError, match="'nprobes' must be a VectorIndex option"):
        VectorIndex.check_options(nprobes=3)


def test_zero_dimensional_id_arrays_are_refused_typed(seeded: VectorIndex) -> None:
    """A 0-d numpy array passed as ids used to raise a bare TypeError (iteration over a 0-d array)."""
    before = _state(seeded)
    for bad in (np.array(1.5), np.array("a")):
        with pytest.raises(InputTypeError, match="'ids' must be a list of str"):
            seeded.get(bad)
        with pytest.raises(InputTypeError, match="'ids' must be a list of str"):
            seeded.delete(bad)
        with pytest.raises(InputTypeError, match="'ids' must be None or a list of str"):
            seeded.add(bad, np.ones((1, DIM)))
    assert _state(seeded) == before
    assert seeded.get(np.array(["a"]))[0].id == "a"  # a 1-D array of str is a list of ids


def test_switch_backend_and_search_params_validate_first(seeded: VectorIndex) -> None:
    seeded.search(np.ones(DIM), k=1)
    backend = seeded.backend_name
    with pytest.raises(ConfigurationError, match="'device' must be"):
        seeded.switch_backend("torch", device="gpu")
    with pytest.raises(ConfigurationError, match="'backend' must be one of"):
        seeded.switch_backend("annoy")
    with pytest.raises(ConfigurationError, match="'ef_search' must be an int >= 1"):
        seeded.set_search_params(ef_search=0)
    assert seeded.backend_name == backend
    assert _state(seeded)[0] == 2


# ---------------------------------------------------------------------------------------- property
_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0xFFFF), max_size=6),  # lone surrogates too
)
_json_value = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(metadata=st.dictionaries(st.text(max_size=5), _json_value, max_size=4), document=st.text(max_size=8))
def test_whatever_add_accepts_saves_and_loads(tmp_path: Path, metadata: dict, document: str) -> None:
    index = VectorIndex(DIM, backend="torch", device="cpu")
    try:
        index.add(["k"], np.ones((1, DIM)), [document], [metadata])
    except InvalidInputError:
        assert index.count == 0
        return
    stored = index.get(["k"])[0]
    assert stored == Record("k", np.ones(DIM, dtype=np.float32), document, stored.metadata)
    path = tmp_path / "snap"
    index.save(path)
    loaded = VectorIndex.load(path, device="cpu")
    assert loaded.get(["k"]) == [stored]
    for key in metadata:
        if key and not key.startswith("$"):  # the filter language's field names
            assert loaded.ids(filter={key: {"$exists": True}}) == ["k"]  # filters run over what was accepted
