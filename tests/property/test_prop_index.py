"""VectorIndex under hostile input: every call gives a typed error or a correct answer, a refused
call changes nothing, and whatever was accepted still saves, loads and searches (rule 10)."""

from __future__ import annotations

import asyncio
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import prop_helpers as H
from gpuprompt import VectorIndex
from gpuprompt.errors import ConfigurationError, GPUPromptError

DIM = 8
BACKENDS = ["torch", "faiss"]
METRICS = ["cosine", "ip", "l2"]
VECTOR_POISON = [math.nan, math.inf, -math.inf, -0.0, 1e308, -1e308, 5e-324, 3.5e38, 1e39, 2**63]


def _base(backend: str, metric: str = "cosine") -> VectorIndex:
    rng = np.random.default_rng(1)
    index = VectorIndex(DIM, backend=backend, metric=metric, device="cpu")
    index.add(
        ["x0", "x1", "x2"],
        rng.standard_normal((3, DIM)).astype(np.float32),
        documents=["zero", None, "two \u00e9"],
        metadatas=[{"a": 1, "n": {"x": [1, "b"]}}, None, {"s": "t\U0001f600"}],
    )
    return index


def _rows(n: int) -> st.SearchStrategy:
    """Vectors for ``n`` rows: valid ones, and every kind of wrong one."""
    good = st.builds(lambda seed: np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32), st.integers(0, 99))
    return st.one_of(
        good,
        good,
        good.map(lambda a: a.tolist()),
        good.map(torch.from_numpy),
        good.map(lambda a: a.astype(np.float64) * 1e30),  # finite in float64, may overflow the metric
        good.map(lambda a: (a * 1e19).astype(np.float32)),  # |x|^2 ~ 1e38: overflows ip/l2 in float32
        st.builds(lambda a, v: np.where(np.arange(a.size).reshape(a.shape) == 0, v, a), good, st.sampled_from(VECTOR_POISON)),
        st.builds(lambda d: np.ones((n, d), dtype=np.float32), st.sampled_from([0, 1, 7, 9, 10_000])),
        st.builds(lambda: np.ones((n, DIM, 1), dtype=np.float32)),
        st.builds(lambda: np.ones(DIM, dtype=np.float32)),
        st.builds(lambda: np.ones((n, DIM), dtype=bool)),
        st.builds(lambda: np.array([["a"] * DIM] * n)),
        st.builds(lambda: np.empty((0, DIM), dtype=np.float32)),
        st.builds(lambda: torch.ones((n, DIM), dtype=torch.complex64)),
        st.builds(lambda: torch.ones((n, DIM), dtype=torch.bool)),
        st.builds(lambda: torch.full((n, DIM), float("nan"))),
        st.lists(st.lists(H.junk_scalars, min_size=DIM, max_size=DIM), min_size=n, max_size=n),
        H.junk,
    )


def _ids(n: int) -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.lists(st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True), min_size=n, max_size=n),
        st.lists(st.one_of(st.none(), st.sampled_from(["x0", "x1", "new"])), min_size=n, max_size=n),
        st.lists(st.one_of(H.odd_text, H.junk_scalars), min_size=n, max_size=n),
        st.lists(st.text(max_size=3), max_size=n + 2),
        H.junk,
    )


def _documents(n: int) -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.lists(st.one_of(st.none(), H.good_odd_text), min_size=n, max_size=n),
        st.lists(st.one_of(H.odd_text, H.junk_scalars), min_size=n, max_size=n),
        H.junk,
    )


def _metadatas(n: int) -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.lists(st.one_of(st.none(), st.dictionaries(H.good_odd_text, H.json_values, max_size=3)), min_size=n, max_size=n),
        st.lists(H.hostile_metadata, min_size=n, max_size=n),
        st.lists(st.dictionaries(st.sampled_from(["a", "b"]), H.extreme_numbers, max_size=2), min_size=n, max_size=n),
        H.junk,
    )


def _check_consistent(index: VectorIndex) -> None:
    """Whatever the index holds searches with finite, ordered scores, and saves and loads intact."""
    state = H.index_state(index)
    for q in (np.ones(index.dim, dtype=np.float32), -np.arange(index.dim, dtype=np.float32)):
        hits = index.search(q, k=max(1, index.count))[0]
        assert len(hits) == index.count
        scores = [h.score for h in hits]
        assert all(math.isfinite(s) for s in scores), f"non-finite scores {scores}"
        assert scores == sorted(scores, reverse=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snap"
        index.save(path)
        loaded = VectorIndex.load(path, device="cpu")
        try:
            assert H.index_state(loaded) == state
        finally:
            loaded.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", BACKENDS)
@H.fast(35)
@given(
    n=st.integers(1, 3),
    metric=st.sampled_from(METRICS),
    data=st.data(),
)
def test_add_hostile(backend: str, n: int, metric: str, data: st.DataObject) -> None:
    H.count("VectorIndex")
    ids = data.draw(_ids(n), label="ids")
    vectors = data.draw(_rows(n), label="vectors")
    documents = data.draw(_documents(n), label="documents")
    metadatas = data.draw(_metadatas(n), label="metadatas")
    index = _base(backend, metric)
    try:
        before = H.index_state(index)
        ok, result = H.typed_or_ok(lambda: index.add(ids, vectors, documents=documents, metadatas=metadatas))
        if not ok:
            assert H.index_state(index) == before, f"refused add changed the index ({type(result).__name__}: {result})"
        else:
            assert isinstance(result, list) and all(isinstance(i, str) and i for i in result)
            got = index.get(result)
            assert {r.id for r in got} == set(result)
            _check_consistent(index)
    finally:
        index.close()


@pytest.fixture(scope="module", params=[(b, m) for b in BACKENDS for m in METRICS], ids=lambda p: f"{p[0]}-{p[1]}")
def shared_index(request: pytest.FixtureRequest):
    index = _base(*request.param)
    yield index
    index.close()


queries = st.one_of(_rows(1), _rows(2), _rows(0).map(lambda a: a))
ks = st.one_of(st.integers(1, 5), H.junk_scalars, H.extreme_numbers, st.integers(-3, 0), st.just(2**63), st.just(10**400))


@pytest.mark.timeout(180)
@H.fast(25)
@given(data=st.data())
def test_search_hostile(shared_index: VectorIndex, data: st.DataObject) -> None:
    q = data.draw(queries, label="queries")
    k = data.draw(ks, label="k")
    flt = data.draw(st.one_of(st.none(), H.filters, H.junk), label="filter")
    H.count("VectorIndex")
    before = H.index_state(shared_index)
    ok, result = H.typed_or_ok(lambda: shared_index.search(q, k, filter=flt))
    if ok:
        assert isinstance(result, list)
        for hits in result:
            assert len(hits) <= min(k, shared_index.count)
            scores = [h.score for h in hits]
            assert all(math.isfinite(s) for s in scores), f"non-finite scores {scores} for q={H.short(q)}"
            assert scores == sorted(scores, reverse=True)
            if flt is None:
                assert len(hits) == min(k, shared_index.count)
    ok2, result2 = H.typed_or_ok(lambda: asyncio.run(shared_index.asearch(q, k, filter=flt)))
    assert ok2 == ok, f"search and asearch disagree: {H.short(result)} vs {H.short(result2)}"
    assert H.index_state(shared_index) == before


@pytest.mark.timeout(180)
@H.fast(20)
@given(data=st.data())
def test_mmr_hostile(shared_index: VectorIndex, data: st.DataObject) -> None:
    q = data.draw(queries, label="query")
    k = data.draw(ks, label="k")
    fetch_k = data.draw(ks, label="fetch_k")
    lambda_mult = data.draw(st.one_of(st.floats(0, 1), H.extreme_numbers, H.junk_scalars), label="lambda_mult")
    flt = data.draw(st.one_of(st.none(), H.filters), label="filter")
    H.count("VectorIndex")
    before = H.index_state(shared_index)
    ok, hits = H.typed_or_ok(lambda: shared_index.mmr(q, k=k, fetch_k=fetch_k, lambda_mult=lambda_mult, filter=flt))
    if ok:
        assert len(hits) <= k
        assert len({h.id for h in hits}) == len(hits)
        assert all(math.isfinite(h.score) for h in hits)
    assert H.index_state(shared_index) == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
@H.fast(30)
@given(data=st.data())
def test_get_delete_hostile(backend: str, data: st.DataObject) -> None:
    ids = data.draw(
        st.one_of(H.junk, st.lists(st.one_of(H.odd_text, st.sampled_from(["x0", "x1", "nope"]), H.junk_scalars), max_size=4)),
        label="ids",
    )
    H.count("VectorIndex")
    index = _base(backend)
    try:
        before = H.index_state(index)
        ok, records = H.typed_or_ok(lambda: index.get(ids))
        assert H.index_state(index) == before
        ok_d, deleted = H.typed_or_ok(lambda: index.delete(ids))
        assert ok_d == ok, (ok, ok_d)
        if not ok_d:
            assert H.index_state(index) == before
        else:
            wanted = {i for i in ids if i in ("x0", "x1", "x2")}
            assert deleted == len(wanted)
            assert index.count == 3 - len(wanted)
            assert set(index.ids()) == {"x0", "x1", "x2"} - wanted
            _check_consistent(index)
    finally:
        index.close()


OPTION_VALUES = {
    "dim": st.one_of(st.integers(-2, 10), H.junk_scalars, H.extreme_numbers),
    "metric": st.one_of(st.sampled_from(METRICS), H.junk_scalars),
    "backend": st.one_of(st.sampled_from(["auto", "faiss", "torch"]), H.junk_scalars),
    "device": st.one_of(st.just("cpu"), H.junk_scalars),
    "index_factory": st.one_of(st.none(), st.sampled_from(["Flat", "HNSW8", "IVF4,Flat", "PQ4", "bogus", "Flat,", "IDMap,Flat"]), H.junk_scalars),
    "ef_search": st.one_of(st.none(), st.integers(-1, 100), H.extreme_numbers),
    "ef_construction": st.one_of(st.none(), st.integers(-1, 100), H.extreme_numbers),
    "nprobe": st.one_of(st.none(), st.integers(-1, 100), H.extreme_numbers),
    "dtype": st.one_of(st.none(), st.sampled_from(["float16", "bfloat16", "float32", "int8", "float64"]), H.junk_scalars),
    "ann_threshold": st.one_of(st.integers(-1, 100), H.extreme_numbers),
    "compact_fraction": st.one_of(st.floats(-1, 11), H.extreme_numbers),
    "max_batch_size": st.one_of(st.integers(-1, 100), H.extreme_numbers),
    "max_wait_ms": st.one_of(st.floats(-1, 100), H.extreme_numbers),
    "max_queue": st.one_of(st.integers(-1, 100), H.extreme_numbers),
}


@pytest.mark.timeout(180)
@H.fast(60)
@given(data=st.data(), seed=st.integers(0, 9))
def test_constructor_hostile(data: st.DataObject, seed: int) -> None:
    """A refused option raises a typed error; an accepted set of options gives a working index."""
    options = data.draw(st.fixed_dictionaries({}, optional=OPTION_VALUES), label="options")
    H.count("VectorIndex")
    options.setdefault("dim", DIM)
    options.setdefault("device", "cpu")
    ok, index = H.typed_or_ok(lambda: VectorIndex(**options))
    if not ok:
        assert isinstance(index, GPUPromptError)
        return
    try:
        dim = index.dim
        vectors = np.random.default_rng(seed).standard_normal((20, dim)).astype(np.float32)
        # Rule 10: options accepted at construction must not break the first add or search.
        index.add([f"i{i}" for i in range(20)], vectors, metadatas=[{"i": i} for i in range(20)])
        hits = index.search(vectors[:2], k=3, filter={"i": {"$lt": 10}})
        assert [len(h) for h in hits] == [3, 3]
        assert index.mmr(vectors[0], k=2, fetch_k=5)
        index.delete(["i0"])
        _check_consistent(index)
    finally:
        index.close()


@pytest.mark.timeout(120)
@H.fast(30)
@given(data=st.data())
def test_switch_backend_and_params_hostile(data: st.DataObject) -> None:
    backend = data.draw(st.one_of(st.sampled_from(["auto", "faiss", "torch"]), H.junk_scalars), label="backend")
    factory = data.draw(st.one_of(st.none(), st.sampled_from(["Flat", "HNSW8", "bogus", ""]), H.junk_scalars), label="factory")
    device = data.draw(st.one_of(st.none(), st.just("cpu"), H.junk_scalars), label="device")
    ef = data.draw(st.one_of(st.none(), st.integers(-1, 50), H.junk_scalars, H.extreme_numbers), label="ef_search")
    nprobe = data.draw(st.one_of(st.none(), st.integers(-1, 50), H.junk_scalars, H.extreme_numbers), label="nprobe")
    H.count("VectorIndex")
    index = _base("torch")
    try:
        before = H.index_state(index)
        ok, _ = H.typed_or_ok(lambda: index.switch_backend(backend, index_factory=factory, device=device))
        if not ok:
            assert H.index_state(index) == before
        ok2, _ = H.typed_or_ok(lambda: index.set_search_params(ef_search=ef, nprobe=nprobe))
        if not ok2:
            pass
        assert H.index_state(index)[:3] == before[:3]
        _check_consistent(index)
    finally:
        index.close()
