"""MetadataFilters -> core filter translation: every operator, every condition, nesting, errors.

Semantics are checked against LlamaIndex's own evaluator (``build_metadata_filter_fn``, the one
``SimpleVectorStore`` uses) on a table of metadata records, for every operator it supports.
"""

from __future__ import annotations

import pytest
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)
from llama_index.core.vector_stores.utils import build_metadata_filter_fn

from gpuprompt.errors import FilterError
from gpuprompt.index.filters import matches, validate_filter
from llamaindex_gpuprompt import to_core_filter

RECORDS = [
    {"category": "dress", "price": 49, "rating": 4.5, "tags": ["cotton", "summer"], "title": "Aurora Dress", "note": ""},
    {"category": "boots", "price": 129, "rating": 4.8, "tags": ["leather", "hiking"], "title": "Trailmaster Boots"},
    {"category": "bottle", "price": 19, "rating": 3.9, "tags": [], "title": "Steel bottle", "note": "dishwasher safe"},
    {"category": "dress", "price": 89, "rating": 4.1, "tags": ["silk"], "title": "Evening DRESS", "note": None},
    {"category": "jacket", "price": 129, "tags": ["leather", "winter"], "title": "Biker jacket"},
]

F = MetadataFilter
OP = FilterOperator

CASES = [
    F(key="category", value="dress", operator=OP.EQ),
    F(key="price", value=129, operator=OP.EQ),
    F(key="category", value="dress", operator=OP.NE),
    F(key="rating", value=4.5, operator=OP.NE),  # missing field: NE matches
    F(key="price", value=49, operator=OP.GT),
    F(key="price", value=49, operator=OP.GTE),
    F(key="price", value=89, operator=OP.LT),
    F(key="price", value=89, operator=OP.LTE),
    F(key="rating", value=4.4, operator=OP.GT),  # missing field: no comparison matches
    F(key="title", value="M", operator=OP.GT),  # strings compare too
    F(key="category", value=["dress", "bottle"], operator=OP.IN),
    F(key="price", value=[19, 129], operator=OP.IN),
    F(key="category", value=["dress", "bottle"], operator=OP.NIN),
    F(key="rating", value=[4.5, 4.8], operator=OP.NIN),  # missing field: NIN matches
    F(key="tags", value=["silk", "hiking"], operator=OP.ANY),
    F(key="tags", value=["leather", "winter"], operator=OP.ALL),
    F(key="tags", value=["leather"], operator=OP.ALL),
    F(key="title", value="Dress", operator=OP.TEXT_MATCH),
    F(key="title", value="dress", operator=OP.TEXT_MATCH_INSENSITIVE),
    F(key="tags", value="leather", operator=OP.CONTAINS),
    F(key="title", value="bottle", operator=OP.CONTAINS),
    F(key="note", value=None, operator=OP.IS_EMPTY),
    F(key="tags", value=None, operator=OP.IS_EMPTY),
]


def _ours(filters: MetadataFilters) -> list[int]:
    core = to_core_filter(filters)
    validate_filter(core)
    return [i for i, record in enumerate(RECORDS) if matches(core, record)]


def _llama_index(filters: MetadataFilters) -> list[int]:
    fn = build_metadata_filter_fn(lambda i: RECORDS[int(i)], filters)
    out = []
    for i in range(len(RECORDS)):
        try:
            if fn(str(i)):
                out.append(i)
        except TypeError:
            # LlamaIndex raises for TEXT_MATCH on a non-str value; such a record does not match.
            pass
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda f: f"{f.operator.name}-{f.key}-{f.value}")
def test_every_operator_matches_llama_index_semantics(case: MetadataFilter) -> None:
    filters = MetadataFilters(filters=[case])
    expected = _llama_index(filters)
    assert _ours(filters) == expected
    assert 0 < len(expected) < len(RECORDS) or case.operator in (OP.NE, OP.NIN)


def test_every_filter_operator_is_covered() -> None:
    assert {case.operator for case in CASES} == set(FilterOperator)


@pytest.mark.parametrize("condition", [FilterCondition.AND, FilterCondition.OR, FilterCondition.NOT])
def test_conditions_match_llama_index_semantics(condition: FilterCondition) -> None:
    filters = MetadataFilters(
        filters=[F(key="category", value="dress"), F(key="price", value=100, operator=OP.GT)], condition=condition
    )
    assert _ours(filters) == _llama_index(filters)
    single = MetadataFilters(filters=[F(key="category", value="dress")], condition=condition)
    assert _ours(single) == _llama_index(single)


def test_nested_filters() -> None:
    # (category == dress AND price < 60) OR (tags contains leather AND NOT(price >= 129 ... none))
    nested = MetadataFilters(
        filters=[
            MetadataFilters(filters=[F(key="category", value="dress"), F(key="price", value=60, operator=OP.LT)]),
            MetadataFilters(
                filters=[
                    F(key="tags", value="leather", operator=OP.CONTAINS),
                    MetadataFilters(filters=[F(key="category", value="jacket")], condition=FilterCondition.NOT),
                ],
                condition=FilterCondition.AND,
            ),
        ],
        condition=FilterCondition.OR,
    )
    assert _ours(nested) == [0, 1]
    negated = MetadataFilters(filters=[nested], condition=FilterCondition.NOT)
    assert _ours(negated) == [2, 3, 4]


def test_translation_shapes() -> None:
    assert to_core_filter(None) is None
    assert to_core_filter(MetadataFilters(filters=[])) is None
    assert to_core_filter(MetadataFilters(filters=[F(key="price", value=50, operator=OP.LT)])) == {"price": {"$lt": 50}}
    assert to_core_filter(MetadataFilters(filters=[F(key="t", value=["a", "b"], operator=OP.ANY)])) == {
        "$or": [{"t": {"$contains": "a"}}, {"t": {"$contains": "b"}}]
    }
    assert to_core_filter(
        MetadataFilters(filters=[F(key="a", value=1), F(key="b", value=2)], condition=FilterCondition.NOT)
    ) == {"$not": {"$or": [{"a": {"$eq": 1}}, {"b": {"$eq": 2}}]}}
    assert to_core_filter(MetadataFilters(filters=[F(key="t", value="X", operator=OP.TEXT_MATCH_INSENSITIVE)])) == {
        "t": {"$icontains": "X"}
    }


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (F(key="category", value="dress", operator=OP.IN), "IN filter must be a list"),
        (F(key="tags", value=[], operator=OP.ANY), "ANY filter must be a non-empty list"),
        (F(key="tags", value="x", operator=OP.ALL), "ALL filter must be a non-empty list"),
        (F(key="title", value=3, operator=OP.TEXT_MATCH), "TEXT_MATCH filter must be a str"),
        (F(key="$where", value=1), "must be a metadata field name"),
    ],
)
def test_malformed_filters_raise_filter_error_naming_the_path(bad: MetadataFilter, message: str) -> None:
    with pytest.raises(FilterError, match=message) as info:
        to_core_filter(MetadataFilters(filters=[F(key="ok", value=1), bad]))
    assert info.value.path == "filters.filters[1]"


def test_empty_nested_filters_are_rejected() -> None:
    with pytest.raises(FilterError, match="at least one filter"):
        to_core_filter(MetadataFilters(filters=[MetadataFilters(filters=[])]))
    with pytest.raises(FilterError, match="must be a MetadataFilters"):
        to_core_filter({"category": "dress"})
