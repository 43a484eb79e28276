"""Filters: a differential test of VectorIndex.ids / search against a reference evaluator written
from the grammar table, on both backends; and hostile filters (typed FilterError, state unchanged).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import prop_helpers as H
from gpuprompt import VectorIndex
from gpuprompt.errors import FilterError, GPUPromptError
from gpuprompt.index.filters import compile_filter, matches

DIM = 8
BACKENDS = ["torch", "faiss"]


def _index(backend: str, records: list[dict], seed: int) -> tuple[VectorIndex, list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    index = VectorIndex(DIM, backend=backend, device="cpu")
    ids = [f"r{i}" for i in range(len(records))]
    if records:
        index.add(ids, rng.standard_normal((len(records), DIM)).astype(np.float32), metadatas=records)
    return index, ids, rng.standard_normal(DIM).astype(np.float32)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
@H.fast(60)
@given(
    records=st.lists(H.metadata_records, max_size=24),
    data=st.data(),
    seed=st.integers(0, 2**16),
    k_cut=st.integers(1, 30),
)
def test_filter_differential(backend: str, records: list[dict], data: st.DataObject, seed: int, k_cut: int) -> None:
    """ids(filter=f) and search(q, k, filter=f) select exactly the reference's matches."""
    flts = data.draw(st.lists(H.filters_for(records), min_size=1, max_size=4), label="filters")
    index, ids, q = _index(backend, records, seed)
    try:
        for flt in flts:
            H.count("VectorIndex")
            expected = [i for i, meta in zip(ids, records) if H.ref_matches(flt, meta)]
            got_ids = index.ids(filter=flt)
            assert got_ids == expected, f"ids(filter={flt!r})"
            if not ids:
                continue
            hits = index.search(q, k=len(ids), filter=flt)[0]
            assert sorted(h.id for h in hits) == sorted(expected), f"search(k=N, filter={flt!r})"
            cut = index.search(q, k=k_cut, filter=flt)[0]
            assert len(cut) == min(k_cut, len(expected)), f"search(k={k_cut}, filter={flt!r})"
            assert {h.id for h in cut} <= set(expected)
            # the k best of the matches, best first
            assert [round(h.score, 4) for h in cut] == [round(h.score, 4) for h in hits][: len(cut)]
    finally:
        index.close()


@H.fast(100)
@given(record=H.metadata_records, data=st.data())
def test_matches_agrees_with_reference(record: dict, data: st.DataObject) -> None:
    """The pure predicate (gpuprompt.index.filters.matches) agrees with the reference."""
    flt = data.draw(H.filters_for([record]), label="filter")
    H.count("filters.matches")
    assert matches(flt, record) == H.ref_matches(flt, record)


# ---------------------------------------------------------------------------------------- hostile filters
_ops = st.sampled_from(
    ["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$contains", "$icontains", "$exists", "$and", "$or", "$not", "$regex", "$", ""]
)
hostile_filters = st.one_of(
    H.junk,
    H.structures,
    st.dictionaries(st.one_of(st.sampled_from(H.FIELDS), _ops, H.odd_text, st.integers()), H.junk, max_size=3),
    st.dictionaries(
        st.sampled_from(H.FIELDS),
        st.dictionaries(_ops, st.one_of(H.junk, H.extreme_numbers, st.lists(H.junk, max_size=3)), max_size=3),
        max_size=2,
    ),
    st.dictionaries(st.sampled_from(["$and", "$or", "$not"]), st.one_of(H.junk, st.lists(H.junk, max_size=3)), max_size=2),
    H.structures.map(lambda s: {"$and": [s]}),
    H.structures.map(lambda s: {"a": {"$in": [s]}}),
    H.structures.map(lambda s: {"a": s}),
    st.integers(30, 3000).map(lambda d: _nested_not(d)),
    st.integers(30, 3000).map(lambda d: _nested_and(d)),
)


def _nested_not(depth: int) -> dict:
    f: dict = {"a": 1}
    for _ in range(depth):
        f = {"$not": f}
    return f


def _nested_and(depth: int) -> dict:
    f: dict = {"a": 1}
    for _ in range(depth):
        f = {"$and": [f]}
    return f


@pytest.fixture(scope="module", params=BACKENDS)
def fixed_index(request: pytest.FixtureRequest):
    rng = np.random.default_rng(0)
    records = [{"a": i, "s": f"t{i}", "tags": ["x", i], "n": {"x": i % 3}} for i in range(12)]
    index = VectorIndex(DIM, backend=request.param, device="cpu")
    index.add([f"r{i}" for i in range(12)], rng.standard_normal((12, DIM)).astype(np.float32), metadatas=records)
    yield index
    index.close()


@pytest.mark.timeout(120)
@H.fast(100)
@given(data=st.data())
def test_hostile_filters_are_typed_and_change_nothing(fixed_index: VectorIndex, data: st.DataObject) -> None:
    flt = data.draw(hostile_filters, label="filter")
    """Malformed filters give FilterError (or, if valid, a correct answer); nothing stored changes."""
    H.count("VectorIndex")
    before = H.index_state(fixed_index)
    q = np.ones(DIM, dtype=np.float32)
    ok_ids, ids = H.typed_or_ok(lambda: fixed_index.ids(filter=flt))
    ok_search, hits = H.typed_or_ok(lambda: fixed_index.search(q, k=5, filter=flt))
    ok_compile, _ = H.typed_or_ok(lambda: compile_filter(flt))
    assert ok_ids == ok_search == ok_compile, (ok_ids, ok_search, ok_compile, H.short(flt))
    if not ok_ids:
        assert isinstance(ids, FilterError), f"{type(ids).__name__}: {ids}"
    else:
        records = [r.metadata for r in fixed_index.get(fixed_index.ids())]
        assert ids == [r for r, m in zip(fixed_index.ids(), records) if matches(flt, m)]
        assert {h.id for h in hits[0]} <= set(ids)
    assert H.index_state(fixed_index) == before
