"""The filter language: every operator, nesting, dotted fields, and validation naming the path."""

from __future__ import annotations

import pytest

from gpuprompt.errors import FilterError, InvalidInputError
from gpuprompt.index import filters
from gpuprompt.index.filters import compile_filter, filter_key, matches, validate_filter

SHOE = {
    "category": "shoes",
    "price": 79.5,
    "stock": 3,
    "tags": ["sale", "Running", 7],
    "title": "Red Running Shoe",
    "active": True,
    "discount": None,
    "brand": {"name": "Acme", "country": "FR"},
    "dims.cm": 30,
}


def test_public_surface() -> None:
    assert filters.__all__ == ["FilterError", "Predicate", "compile_filter", "field_value", "filter_key", "matches", "validate_filter"]
    assert issubclass(FilterError, InvalidInputError)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        # shorthand equality and $eq
        ({"category": "shoes"}, True),
        ({"category": "hats"}, False),
        ({"category": {"$eq": "shoes"}}, True),
        ({"stock": 3.0}, True),  # 3 == 3.0
        ({"active": 1}, False),  # bools are not numbers
        ({"stock": True}, False),
        ({"discount": None}, True),
        ({"missing": None}, False),  # a missing field is not None
        ({"tags": ["sale", "Running", 7]}, True),  # list equality
        ({"tags": ["sale"]}, False),
        # $ne
        ({"category": {"$ne": "hats"}}, True),
        ({"category": {"$ne": "shoes"}}, False),
        ({"missing": {"$ne": "x"}}, True),  # missing fields are "not equal"
        # ordering
        ({"price": {"$gt": 79}}, True),
        ({"price": {"$gt": 79.5}}, False),
        ({"price": {"$gte": 79.5}}, True),
        ({"price": {"$lt": 80}}, True),
        ({"price": {"$lte": 79.4}}, False),
        ({"title": {"$gt": "Blue"}}, True),  # strings order lexicographically
        ({"title": {"$lt": 100}}, False),  # another kind never matches
        ({"active": {"$gt": 0}}, False),  # bools do not order with numbers
        ({"missing": {"$lt": 10}}, False),
        ({"price": {"$gt": 10, "$lt": 100}}, True),  # several operators: all must hold
        ({"price": {"$gt": 10, "$lt": 50}}, False),
        # membership
        ({"category": {"$in": ["hats", "shoes"]}}, True),
        ({"category": {"$in": []}}, False),
        ({"stock": {"$in": [3.0]}}, True),
        ({"active": {"$in": [1]}}, False),
        ({"missing": {"$in": ["x"]}}, False),
        ({"category": {"$nin": ["hats"]}}, True),
        ({"category": {"$nin": ["shoes"]}}, False),
        ({"missing": {"$nin": ["x"]}}, True),
        # contains
        ({"tags": {"$contains": "sale"}}, True),
        ({"tags": {"$contains": "running"}}, False),  # case-sensitive
        ({"tags": {"$contains": 7}}, True),
        ({"tags": {"$contains": "sal"}}, False),  # list elements compare whole
        ({"title": {"$contains": "Running"}}, True),  # substring of a str
        ({"title": {"$contains": "running"}}, False),
        ({"price": {"$contains": 7}}, False),
        ({"tags": {"$icontains": "RUNNING"}}, True),
        ({"title": {"$icontains": "red running"}}, True),
        ({"title": {"$icontains": "blue"}}, False),
        # exists
        ({"discount": {"$exists": True}}, True),  # present with a None value
        ({"missing": {"$exists": True}}, False),
        ({"missing": {"$exists": False}}, True),
        # dotted names
        ({"brand.name": "Acme"}, True),
        ({"brand.country": {"$in": ["DE", "FR"]}}, True),
        ({"brand.missing": {"$exists": False}}, True),
        ({"category.x": {"$exists": True}}, False),  # traversing a non-dict
        ({"dims.cm": 30}, True),  # a literal dotted key wins
        # logical
        ({"$and": [{"category": "shoes"}, {"price": {"$lt": 100}}]}, True),
        ({"$and": [{"category": "shoes"}, {"price": {"$lt": 10}}]}, False),
        ({"$or": [{"category": "hats"}, {"stock": {"$gte": 3}}]}, True),
        ({"$or": [{"category": "hats"}, {"stock": {"$gt": 3}}]}, False),
        ({"$not": {"category": "shoes"}}, False),
        ({"$not": {"category": "hats"}}, True),
        ({"category": "shoes", "stock": 3}, True),  # implicit and
        ({"category": "shoes", "stock": 4}, False),
        # nested
        (
            {
                "$and": [
                    {"$or": [{"brand.country": "DE"}, {"tags": {"$contains": "sale"}}]},
                    {"$not": {"$or": [{"price": {"$gt": 100}}, {"active": False}]}},
                ]
            },
            True,
        ),
        (
            {"$or": [{"$and": [{"category": "shoes"}, {"brand.name": "Other"}]}, {"$not": {"active": True}}]},
            False,
        ),
        # empty filter matches all
        ({}, True),
    ],
)
def test_operator_semantics(flt: dict, expected: bool) -> None:
    assert matches(flt, SHOE) is expected


def test_none_filter_and_empty_metadata() -> None:
    assert matches(None, SHOE)
    assert matches(None, None)
    assert not matches({"a": 1}, None)
    assert matches({"a": {"$exists": False}}, {})


def test_compiled_predicate_is_reused_and_keys_are_canonical() -> None:
    a = {"$and": [{"x": 1}, {"y": {"$in": [1, 2]}}]}
    b = {"$and": [{"x": 1}, {"y": {"$in": [1, 2]}}]}
    assert compile_filter(a) is compile_filter(b)
    assert filter_key({"a": 1, "b": 2}) == filter_key({"b": 2, "a": 1})
    assert filter_key(None) is None and filter_key({}) is None
    assert filter_key({"a": 1}) != filter_key({"a": "1"})


@pytest.mark.parametrize(
    ("flt", "path", "words"),
    [
        ("category", "$", "must be a dict"),
        ([{"a": 1}], "$", "must be a dict"),
        ({"$foo": 1}, "$.$foo", "unknown operator '$foo'"),
        ({"price": {"$between": [1, 2]}}, "$.price.$between", "unknown operator '$between'"),
        ({"price": {"gt": 1}}, "$.price.gt", "must start with '$'"),
        ({"price": {}}, "$.price", "empty dict"),
        ({"price": {"$gt": [1]}}, "$.price.$gt", "finite number or a str"),
        ({"price": {"$gt": True}}, "$.price.$gt", "finite number or a str"),
        ({"price": {"$lt": float("nan")}}, "$.price.$lt", "finite number or a str"),
        ({"tags": {"$in": "sale"}}, "$.tags.$in", "must be a list"),
        ({"tags": {"$nin": [{"a": 1}]}}, "$.tags.$nin[0]", "must be a str, finite number"),
        ({"tags": {"$contains": ["a"]}}, "$.tags.$contains", "'$contains' operand"),
        ({"tags": {"$icontains": 3}}, "$.tags.$icontains", "must be a str"),
        ({"x": {"$exists": "yes"}}, "$.x.$exists", "True or False"),
        ({"x": {"$eq": {"a": 1}}}, "$.x.$eq", "must be a str, finite number"),
        ({"x": {1, 2}}, "$.x", "must be a str, finite number"),
        ({"$and": {"a": 1}}, "$.$and", "non-empty list"),
        ({"$or": []}, "$.$or", "non-empty list"),
        ({"$and": [{"a": 1}, "b"]}, "$.$and[1]", "must be a dict"),
        ({"$and": [{"a": 1}, {"$or": [{"b": {"$gt": [1]}}]}]}, "$.$and[1].$or[0].b.$gt", "finite number"),
        ({"$not": [{"a": 1}]}, "$.$not", "must be a dict"),
        ({1: "x"}, "$", "field name must be a non-empty str"),
        ({"": "x"}, "$", "field name must be a non-empty str"),
    ],
)
def test_validation_names_the_path(flt: object, path: str, words: str) -> None:
    with pytest.raises(FilterError) as info:
        validate_filter(flt)
    assert info.value.path == path
    assert words in str(info.value)
    assert f"(at filter path {path})" in str(info.value)


def test_int_keys_never_share_a_cache_entry_with_str_keys() -> None:
    assert matches({"1": "x"}, {"1": "x"})
    with pytest.raises(FilterError):
        validate_filter({1: "x"})
