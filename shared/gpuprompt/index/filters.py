"""The one metadata filter language of gpuprompt, shared by every backend and both adapters.

A filter is validated once (a typed :class:`~gpuprompt.errors.FilterError` names the path of the
first problem) and compiled into a predicate over one record's metadata.

Grammar::

    filter     := {}                                       # matches everything
                | {"field": value, ...}                    # implicit $and over the fields
                | {"field": {"$op": operand, ...}, ...}    # implicit $and over the operators
                | {"$and": [filter, ...]} | {"$or": [filter, ...]} | {"$not": filter}
    value      := str | int | float | bool | None | [value, ...]    # shorthand for {"$eq": value}

Operators and their semantics (``v`` is the record's value of ``field``):

==============  ==================  =======================================================
operator        operand             matches when
==============  ==================  =======================================================
``$eq``         JSON value          ``v`` equals the operand (bools never equal numbers,
                                    1 equals 1.0, lists compare element-wise)
``$ne``         JSON value          not ``$eq`` -- also true when the field is missing
``$gt``...      number or str       ``v`` is of the same kind (number/str) and compares so;
``$lte``                            a missing field or another kind never matches
``$in``         list of values      ``v`` equals one of them
``$nin``        list of values      not ``$in`` -- also true when the field is missing
``$contains``   scalar              ``v`` is a list holding an element equal to the operand,
                                    or ``v`` is a str containing the operand as a substring
``$icontains``  str                 the same, case-insensitive (``str.casefold``)
``$exists``     bool                the field is present (even with a ``None`` value) or not
==============  ==================  =======================================================

A field name with dots reaches into nested dicts (``"author.name"``); a key that literally contains
the dots is preferred when present. Example::

    >>> from gpuprompt.index.filters import matches
    >>> f = {"$and": [{"category": "shoes"}, {"price": {"$lt": 100}}, {"tags": {"$contains": "sale"}}]}
    >>> matches(f, {"category": "shoes", "price": 79.9, "tags": ["sale", "new"]})
    True
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from gpuprompt.errors import FilterError, InvalidInputError, describe
from gpuprompt.validation import MAX_DEPTH, check_depth

__all__ = ["FilterError", "Predicate", "compile_filter", "field_value", "filter_key", "matches", "validate_filter"]

Predicate = Callable[[Mapping[str, Any]], bool]
"""A compiled filter: takes one record's metadata, says whether it matches."""

_COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$contains", "$icontains", "$exists")
_LOGICAL = ("$and", "$or", "$not")
_MISSING = object()


def _always(_: Mapping[str, Any]) -> bool:
    return True


def validate_filter(filter: Any) -> None:
    """Check ``filter`` against the grammar without evaluating it.

    Raises:
        FilterError: an unknown operator, an operand of the wrong type, or a malformed node; the
            message and ``.path`` name where in the filter (for example ``$.$and[1].price.$gt``).
    """
    compile_filter(filter)


def matches(filter: Mapping[str, Any] | None, metadata: Mapping[str, Any] | None) -> bool:
    """Whether one record's ``metadata`` satisfies ``filter`` (None or ``{}`` match everything).

    Raises:
        FilterError: the filter is malformed (see :func:`validate_filter`).
    """
    return compile_filter(filter)(metadata or {})


def filter_key(filter: Mapping[str, Any] | None) -> str | None:
    """A canonical string for a filter (equal filters give equal keys), or None for no filter.

    The filter must already be valid; used to cache evaluated filters and group equal requests.
    """
    if not filter:
        return None
    _preflight(filter)
    _check_str_keys(filter)
    return json.dumps(filter, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _check_str_keys(node: Any) -> None:
    # json.dumps turns int keys into str; two different filters must never share a key.
    # (Depth is bounded by _preflight before this recursion runs.)
    if isinstance(node, Mapping):
        for key, value in node.items():
            if not isinstance(key, str):
                raise TypeError("filter keys must be str")
            _check_str_keys(value)
    elif isinstance(node, (list, tuple)):
        for item in node:
            _check_str_keys(item)


def compile_filter(filter: Mapping[str, Any] | None) -> Predicate:
    """Validate ``filter`` and compile it into a predicate over metadata dicts.

    Raises:
        FilterError: the filter is malformed; the message names the path inside it.
    """
    if filter is None:
        return _always
    if not isinstance(filter, Mapping):
        raise FilterError(f"a filter must be a dict such as {{'field': value}} (got {describe(filter)})", path="$")
    if not filter:
        return _always
    # Compile from the filter itself (json.dumps would silently turn int keys into str), then
    # cache under the canonical key so a filter repeated on every request compiles once.
    try:
        key: str | None = filter_key(filter)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, FilterError):
            raise
        key = None
    if key is not None:
        with _cache_lock:
            cached = _cache.get(key)
            if cached is not None:
                _cache.move_to_end(key)
                return cached
    predicate = _compile_node(filter, "$")
    if key is not None:
        with _cache_lock:
            _cache[key] = predicate
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    return predicate


def _preflight(filter: Mapping[str, Any]) -> None:
    """Refuse cycles and nesting deeper than ``MAX_DEPTH`` before any recursive walk.

    A filter nested 10,000 deep gets a ``FilterError`` instead of exhausting the stack in the
    compiler or in ``json.dumps``.
    """
    try:
        check_depth(filter, "$", max_depth=MAX_DEPTH)
    except InvalidInputError as exc:
        raise FilterError(str(exc).rstrip("."), path=getattr(exc, "path", "$")) from None


_CACHE_SIZE = 512
_cache: OrderedDict[str, Predicate] = OrderedDict()
_cache_lock = threading.Lock()


# ---------------------------------------------------------------------------------------- compile
def _compile_node(node: Any, path: str) -> Predicate:
    if not isinstance(node, Mapping):
        raise FilterError(f"a filter node must be a dict (got {describe(node)})", path=path)
    if not node:
        return _always
    parts: list[Predicate] = []
    for key, value in node.items():
        if not isinstance(key, str) or not key:
            raise FilterError(f"a field name must be a non-empty str (got {describe(key)})", path=path)
        child = f"{path}.{key}"
        if key in _LOGICAL:
            parts.append(_compile_logical(key, value, child))
        elif key.startswith("$"):
            raise FilterError(
                f"unknown operator {key!r} at the top of a filter node; use one of {list(_LOGICAL)}, "
                f"or put comparison operators under a field: {{'field': {{{key!r}: ...}}}}",
                path=child,
            )
        else:
            parts.append(_compile_field(key, value, child))
    return _all_of(parts)


def _compile_logical(op: str, value: Any, path: str) -> Predicate:
    if op == "$not":
        inner = _compile_node(value, path)
        return lambda metadata: not inner(metadata)
    if not isinstance(value, (list, tuple)) or not value:
        raise FilterError(f"{op!r} must be a non-empty list of filters (got {describe(value)})", path=path)
    parts = [_compile_node(item, f"{path}[{i}]") for i, item in enumerate(value)]
    return _all_of(parts) if op == "$and" else _any_of(parts)


def _all_of(parts: list[Predicate]) -> Predicate:
    if len(parts) == 1:
        return parts[0]
    return lambda metadata: all(part(metadata) for part in parts)


def _any_of(parts: list[Predicate]) -> Predicate:
    if len(parts) == 1:
        return parts[0]
    return lambda metadata: any(part(metadata) for part in parts)


def field_value(metadata: Mapping[str, Any], field: str) -> Any:
    """The value a filter on ``field`` sees in ``metadata`` (dotted names reach into nested dicts,
    a key literally holding the dots wins); a missing field gives a sentinel of its own."""
    return _getter(field)(metadata)


def _getter(field: str) -> Callable[[Mapping[str, Any]], Any]:
    if "." not in field:
        return lambda metadata: metadata.get(field, _MISSING)
    steps = field.split(".")

    def get(metadata: Mapping[str, Any]) -> Any:
        if field in metadata:
            return metadata[field]
        value: Any = metadata
        for step in steps:
            if not isinstance(value, Mapping) or step not in value:
                return _MISSING
            value = value[step]
        return value

    return get


def _compile_field(field: str, condition: Any, path: str) -> Predicate:
    get = _getter(field)
    if not isinstance(condition, Mapping):
        _check_json_value(condition, path, "a field's value")
        test = _op_eq(condition)
        return lambda metadata: test(get(metadata))
    if not condition:
        raise FilterError(
            f"the condition on field {field!r} is an empty dict; give an operator such as {{'$eq': value}}", path=path
        )
    tests: list[Callable[[Any], bool]] = []
    for op, operand in condition.items():
        child = f"{path}.{op}"
        if not isinstance(op, str) or not op.startswith("$"):
            raise FilterError(
                f"operator keys must start with '$' (got {describe(op)}); to compare a nested field use a "
                f"dotted name such as '{field}.{op}'",
                path=child,
            )
        if op not in _COMPARISONS:
            raise FilterError(f"unknown operator {op!r}; valid operators are {list(_COMPARISONS)}", path=child)
        tests.append(_compile_op(op, operand, child))
    if len(tests) == 1:
        test = tests[0]
        return lambda metadata: test(get(metadata))

    def test_all(metadata: Mapping[str, Any]) -> bool:
        value = get(metadata)
        return all(test(value) for test in tests)

    return test_all


def _compile_op(op: str, operand: Any, path: str) -> Callable[[Any], bool]:
    if op in ("$eq", "$ne"):
        _check_json_value(operand, path, f"the {op!r} operand")
        eq = _op_eq(operand)
        return eq if op == "$eq" else (lambda value: not eq(value))
    if op in ("$gt", "$gte", "$lt", "$lte"):
        if not (_is_number(operand) or isinstance(operand, str)):
            raise FilterError(
                f"the {op!r} operand must be a finite number or a str (got {describe(operand)})", path=path
            )
        return _op_order(op, operand)
    if op in ("$in", "$nin"):
        if not isinstance(operand, (list, tuple)):
            raise FilterError(f"the {op!r} operand must be a list of values (got {describe(operand)})", path=path)
        for i, item in enumerate(operand):
            _check_json_value(item, f"{path}[{i}]", f"each {op!r} item")
        member = _op_in(list(operand))
        return member if op == "$in" else (lambda value: not member(value))
    if op == "$contains":
        if not _is_scalar(operand):
            raise FilterError(
                f"the '$contains' operand must be a str, number, bool or None (got {describe(operand)})", path=path
            )
        return _op_contains(operand)
    if op == "$icontains":
        if not isinstance(operand, str):
            raise FilterError(f"the '$icontains' operand must be a str (got {describe(operand)})", path=path)
        return _op_icontains(operand)
    # $exists
    if not isinstance(operand, bool):
        raise FilterError(f"the '$exists' operand must be True or False (got {describe(operand)})", path=path)
    return (lambda value: value is not _MISSING) if operand else (lambda value: value is _MISSING)


# ---------------------------------------------------------------------------------------- checks
def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    # No float() conversion for ints: a 400-digit int would raise OverflowError.
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool)) or _is_number(value)


def _check_json_value(value: Any, path: str, what: str) -> None:
    if _is_scalar(value):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json_value(item, f"{path}[{i}]", what)
        return
    raise FilterError(
        f"{what} must be a str, finite number, bool, None or a list of those (got {describe(value)})", path=path
    )


# ---------------------------------------------------------------------------------------- semantics
def _same(a: Any, b: Any) -> bool:
    """JSON equality: bools are not numbers, 1 == 1.0, lists compare element-wise."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    return type(a) is type(b) and a == b


def _tag(value: Any) -> tuple[str, Any] | None:
    """A hashable key under which equal scalars (per :func:`_same`) collide; None if not a scalar."""
    if value is None:
        return ("none", None)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)
    if isinstance(value, str):
        return ("str", value)
    return None


def _op_eq(operand: Any) -> Callable[[Any], bool]:
    if isinstance(operand, (list, tuple)):
        return lambda value: value is not _MISSING and _same(value, operand)
    tag = _tag(operand)
    return lambda value: value is not _MISSING and _tag(value) == tag


def _op_in(operands: list[Any]) -> Callable[[Any], bool]:
    tags = {_tag(item) for item in operands if _tag(item) is not None}
    lists = [item for item in operands if isinstance(item, (list, tuple))]

    def member(value: Any) -> bool:
        if value is _MISSING:
            return False
        if isinstance(value, (list, tuple)):
            return any(_same(value, item) for item in lists)
        return _tag(value) in tags

    return member


def _op_order(op: str, operand: Any) -> Callable[[Any], bool]:
    numeric = not isinstance(operand, str)

    def comparable(value: Any) -> bool:
        if numeric:
            # ``value == value`` is False only for NaN, and never converts a big int to float.
            return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
        return isinstance(value, str)

    if op == "$gt":
        return lambda value: comparable(value) and value > operand
    if op == "$gte":
        return lambda value: comparable(value) and value >= operand
    if op == "$lt":
        return lambda value: comparable(value) and value < operand
    return lambda value: comparable(value) and value <= operand


def _op_contains(operand: Any) -> Callable[[Any], bool]:
    tag = _tag(operand)

    def contains(value: Any) -> bool:
        if isinstance(value, list):
            return any(_tag(item) == tag for item in value)
        if isinstance(value, str) and isinstance(operand, str):
            return operand in value
        return False

    return contains


def _op_icontains(operand: str) -> Callable[[Any], bool]:
    folded = operand.casefold()

    def icontains(value: Any) -> bool:
        if isinstance(value, list):
            return any(isinstance(item, str) and item.casefold() == folded for item in value)
        if isinstance(value, str):
            return folded in value.casefold()
        return False

    return icontains
