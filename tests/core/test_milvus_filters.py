"""One filter language, two indexes: every filter of the filter suites selects the same ids on a
MilvusIndex (Milvus Lite) as on a VectorIndex, with and without typed scalar fields; the Milvus
expression alone never drops a match (the translation is sound)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pymilvus")
if importlib.util.find_spec("milvus_lite") is None:
    pytest.skip("milvus-lite is not installed", allow_module_level=True)

from gpuprompt import VectorIndex
from gpuprompt.index._milvus import MilvusIndex
from gpuprompt.index._milvus_filters import compile_milvus
from gpuprompt.index.filters import matches

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # test_filters: the in-process filter suite
sys.path.insert(0, str(Path(__file__).parents[1] / "property"))
import prop_helpers as H
import test_filters as suite
import test_index as index_suite

DIM = 8
SHOE = suite.SHOE
# Records around SHOE: missing fields, other kinds (bools vs numbers, str vs list), JSON nulls,
# a literal dotted key and a nested dict, so each operator's corners are exercised.
FREE_RECORDS = [
    SHOE,
    {},
    {"category": "hats", "price": 10, "stock": True, "tags": "sale", "active": 1, "discount": 0},
    {"category": "shoes", "price": 120.0, "stock": 0, "tags": [], "title": "blue trail shoe", "active": False},
    {"category": None, "price": "79.5", "tags": ["SALE", 7.0, True], "brand": {"name": "Other"}, "dims.cm": None},
    {"brand": {"name": "Acme", "country": "DE"}, "dims": {"cm": 30}, "title": "RED RUNNING", "stock": 3.0},
    {"category": ["shoes"], "tags": [["sale"]], "active": None, "brand": "Acme", "price": -1e300},
    {"category": "Shoes", "price": 2**62, "stock": -(2**63), "title": "stra\u00dfe", "discount": False},
]
# The same kind of spread, but every declared scalar field holds its kind (or is missing / None).
SCALARS = {"category": "str", "title": "str", "price": "float", "stock": "int", "active": "bool"}
TYPED_RECORDS = [
    SHOE,
    {},
    {"category": "hats", "price": 10, "stock": 0, "tags": "sale", "active": False, "discount": 0},
    {"category": "shoes", "price": 120.0, "stock": 7, "tags": [], "title": "blue trail shoe", "active": None},
    {"category": None, "tags": ["SALE", 7.0, True], "brand": {"name": "Other"}, "dims.cm": None},
    {"brand": {"name": "Acme", "country": "DE"}, "dims": {"cm": 30}, "title": "RED RUNNING", "stock": 3},
    {"category": "Shoes", "price": -1e300, "stock": -(2**63), "title": "stra\u00dfe", "discount": False},
]

SUITE_FILTERS = [flt for flt, _ in suite.test_operator_semantics.pytestmark[0].args[1]]
INDEX_FILTERS = [flt for flt, _ in index_suite.test_prefilter_returns_exactly_min_k_matches.pytestmark[0].args[1]]
EXTRA_FILTERS = [
    {"tags": {"$in": [7, "x"]}},
    {"tags": {"$nin": [[], "sale"]}},
    {"price": {"$ne": 79.5}},
    {"$not": {"price": {"$gte": 50}}},
    {"$not": {"title": {"$contains": "Running"}}},
    {"title": {"$icontains": "STRASSE"}},
    {"title": {"$icontains": "run"}},
    {"$not": {"title": {"$icontains": "run"}}},
    {"active": {"$ne": True}},
    {"active": {"$in": [True, None]}},
    {"stock": {"$ne": 0}},
    {"stock": {"$gt": 2.5}},
    {"stock": {"$lte": -1e19}},
    {"discount": {"$exists": False}},
    {"$not": {"discount": {"$exists": True}}},
    {"category": {"$ne": None}},
    {"category": {"$nin": ["shoes", None]}},
    {"brand.name": {"$ne": "Acme"}},
    {"dims.cm": {"$exists": True}},
    {"$or": [{"price": {"$lt": 0}}, {"$not": {"category": {"$in": ["shoes", "hats"]}}}]},
    {"title": {"$contains": 'quote"back\\slash'}},
    {"title": {"$gt": "line\nbreak"}},
    {"tags": {"$contains": -0.0}},  # no unary minus inside json_contains(...): found by the generator
    {"stock": {"$contains": -3}},
    {"tags": {"$contains": True}},
]
ALL_FILTERS = SUITE_FILTERS + INDEX_FILTERS + EXTRA_FILTERS


def _pair(tmp_path_factory: pytest.TempPathFactory, name: str, records: list[dict], scalar_fields: dict):
    uri = str(tmp_path_factory.getbasetemp() / "milvus_filters.db")
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((len(records), DIM)).astype(np.float32)
    ids = [f"r{i}" for i in range(len(records))]
    milvus = MilvusIndex(DIM, uri=uri, collection=name, index_type="FLAT", scalar_fields=scalar_fields)
    milvus.clear()
    milvus.add(ids, vectors, metadatas=records)
    local = VectorIndex(DIM, backend="torch", device="cpu")
    local.add(ids, vectors, metadatas=records)
    return milvus, local, rng.standard_normal((2, DIM)).astype(np.float32)


@pytest.fixture(scope="module", params=["json", "typed"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    if request.param == "json":
        milvus, local, queries = _pair(tmp_path_factory, "filters_json", FREE_RECORDS, {})
    else:
        milvus, local, queries = _pair(tmp_path_factory, "filters_typed", TYPED_RECORDS, SCALARS)
    yield milvus, local, queries
    milvus.close()
    local.close()


def test_the_suites_were_found() -> None:
    assert len(SUITE_FILTERS) > 50 and len(INDEX_FILTERS) == 8


@pytest.mark.parametrize("flt", ALL_FILTERS, ids=[str(i) for i in range(len(ALL_FILTERS))])
def test_same_ids_on_both_indexes(pair, flt: dict) -> None:
    milvus, local, queries = pair
    expected = sorted(local.ids(filter=flt))
    assert sorted(milvus.ids(filter=flt)) == expected
    n = len(local)
    for q, (got, want) in enumerate(zip(milvus.search(queries, k=n, filter=flt), local.search(queries, k=n, filter=flt))):
        assert [h.id for h in got] == [h.id for h in want], (q, flt)
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
    cut = milvus.search(queries, k=2, filter=flt)
    assert [[h.id for h in row] for row in cut] == [[h.id for h in row] for row in local.search(queries, k=2, filter=flt)]


@pytest.mark.parametrize("flt", ALL_FILTERS, ids=[str(i) for i in range(len(ALL_FILTERS))])
def test_the_milvus_expression_alone_keeps_every_match(pair, flt: dict) -> None:
    """Soundness: the expression Milvus evaluates selects a superset of the matches."""
    milvus, local, _ = pair
    expr = compile_milvus(flt, scalar_fields=milvus.options.scalar_fields, json_field="metadata")
    client = milvus._ensure()
    raw = {row["id"] for row in client.query(milvus.options.collection, filter=expr or 'id != ""', output_fields=["id"])}
    assert set(local.ids(filter=flt)) <= raw, expr


def test_typed_fields_and_missing_field_negations_are_exact(pair) -> None:
    """$ne / $nin / $not keep records lacking the field in Milvus itself, no re-check needed."""
    milvus, local, _ = pair
    client = milvus._ensure()
    scalars = milvus.options.scalar_fields
    for flt in ({"category": {"$ne": "shoes"}}, {"category": {"$nin": ["hats"]}}, {"$not": {"category": "shoes"}}):
        expr = compile_milvus(flt, scalar_fields=scalars, json_field="metadata")
        raw = sorted(row["id"] for row in client.query(milvus.options.collection, filter=expr, output_fields=["id"]))
        assert raw == sorted(local.ids(filter=flt)), (flt, expr)
    if scalars:
        for flt in ({"stock": {"$gt": 2}}, {"$not": {"price": {"$gte": 50}}}, {"title": {"$icontains": "RUNNING"}}):
            expr = compile_milvus(flt, scalar_fields=scalars, json_field="metadata")
            raw = sorted(row["id"] for row in client.query(milvus.options.collection, filter=expr, output_fields=["id"]))
            assert raw == sorted(local.ids(filter=flt)), (flt, expr)


def test_expressions_read_as_documented() -> None:
    none: dict = {}
    assert compile_milvus({"a": {"$ne": "x"}}, scalar_fields=none, json_field="m") == '(m["a"] is null) or (m["a"] != "x")'
    assert compile_milvus({"a": {"$in": [1, "x"]}}, scalar_fields=none, json_field="m") == '(m["a"] == 1) or (m["a"] == "x")'
    assert compile_milvus({"a": {"$exists": False}}, scalar_fields=none, json_field="m") == 'm["a"] is null'
    typed = {"a": "str"}
    assert compile_milvus({"a": {"$icontains": "ABC"}}, scalar_fields=typed, json_field="m") == 'a__folded like "%abc%"'
    assert compile_milvus({"$not": {"a": "x"}}, scalar_fields=typed, json_field="m") == 'a is null or a != "x"'
    assert compile_milvus({}, scalar_fields=typed, json_field="m") == ""
    assert compile_milvus({"a": 3}, scalar_fields=typed, json_field="m") == "false"  # a str column never holds 3


def test_matching_records_come_back_with_their_metadata(pair) -> None:
    milvus, _, queries = pair
    flt = {"category": "shoes"}
    for hit in milvus.search(queries[0], k=10, filter=flt)[0]:
        assert matches(flt, hit.metadata)


# ---------------------------------------------------------------------------------------- generated filters

@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory):
    uri = str(tmp_path_factory.getbasetemp() / "milvus_filters.db")
    index = MilvusIndex(DIM, uri=uri, collection="filters_generated", index_type="FLAT")
    yield index
    index.close()


@pytest.mark.timeout(300)
@H.fast(20)  # each example rewrites a Milvus Lite collection (~1 s); tests/property runs the generator at length
@given(records=st.lists(H.metadata_records, min_size=1, max_size=16), data=st.data(), seed=st.integers(0, 2**16))
def test_generated_filters_select_the_reference_matches(generated: MilvusIndex, records, data, seed: int) -> None:
    """tests/property's filter generator: ids and search agree with the reference evaluator."""
    flts = data.draw(st.lists(H.filters_for(records), min_size=1, max_size=4), label="filters")
    rng = np.random.default_rng(seed)
    ids = [f"r{i}" for i in range(len(records))]
    generated.clear()
    generated.add(ids, rng.standard_normal((len(records), DIM)).astype(np.float32), metadatas=records)
    q = rng.standard_normal(DIM).astype(np.float32)
    for flt in flts:
        expected = sorted(i for i, meta in zip(ids, records) if H.ref_matches(flt, meta))
        assert sorted(generated.ids(filter=flt)) == expected, flt
        assert sorted(h.id for h in generated.search(q, k=len(ids), filter=flt)[0]) == expected, flt
        expr = compile_milvus(flt, scalar_fields={}, json_field="metadata")
        raw = generated._ensure().query("filters_generated", filter=expr or 'id != ""', output_fields=["id"])
        assert set(expected) <= {row["id"] for row in raw}, (flt, expr)
