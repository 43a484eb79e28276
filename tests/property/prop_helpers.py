"""Shared strategies, the reference filter evaluator and state checks for the property tests.

Imported by name (``import prop_helpers``) from the tests in this folder: pytest puts this folder
on ``sys.path``, as tests/server does for ``server_helpers``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpuprompt.errors import GPUPromptError

FUZZ_FACTOR = 10 if settings.get_current_profile_name() == "fuzz" else 1
"""How many times the default examples the ``fuzz`` profile runs."""

# ---------------------------------------------------------------------------------------- counting
CASES: Counter[str] = Counter()
"""Generated cases per public class under test (printed by conftest at the end of the session)."""


def count(cls_name: str, n: int = 1) -> None:
    """Record ``n`` generated cases against the public class ``cls_name``."""
    CASES[cls_name] += n


# ---------------------------------------------------------------------------------------- settings
def fast(max_examples: int, **extra: Any) -> settings:
    """Hypothesis settings for this folder: no deadline (threads, first loads), few examples.

    Derandomized in the default profile (``tests/conftest.py``): the same examples on every run and
    machine. ``make fuzz`` (profile ``fuzz``) draws anew each run, ten times as many.
    """
    return settings(
        max_examples=max_examples * FUZZ_FACTOR,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
        print_blob=True,
        **extra,
    )


# ---------------------------------------------------------------------------------------- outcomes
def typed_or_ok(call: Callable[[], Any]) -> tuple[bool, Any]:
    """Run ``call``: return (True, result), or (False, error) for a GPUPromptError.

    Any other exception propagates, so the test fails with it (and hypothesis minimises it).
    """
    try:
        return True, call()
    except GPUPromptError as exc:
        return False, exc


def typed_or_ok_lenient(call: Callable[[], Any]) -> tuple[bool, Any]:
    """Like :func:`typed_or_ok`, but a pydantic ``ValidationError`` also counts as a refusal.

    For tests whose subject is what happens *after* construction (rule 10); the strict constructor
    tests flag ``ValidationError`` on their own.
    """
    from pydantic import ValidationError

    try:
        return True, call()
    except (GPUPromptError, ValidationError) as exc:
        return False, exc


async def atyped_or_ok(coro: Any) -> tuple[bool, Any]:
    try:
        return True, await coro
    except GPUPromptError as exc:
        return False, exc


# ---------------------------------------------------------------------------------------- hostile values
ODD_CHARS = [
    "\ud800",  # lone high surrogate
    "\udfff",  # lone low surrogate
    "\x00",  # NUL
    "\u200f",  # RTL mark
    "\u202e",  # RTL override
    "\u0301",  # combining acute accent
    "e\u0301",
    "\ufeff",  # BOM
    "\U0001f600",  # emoji
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # ZWJ family
    "\n",
    "\t",
    "ß",
    "İ",
    "\uffff",
    "$",
    ".",
    '"',
    "\\",
]
WELL_FORMED_ODD = [c for c in ODD_CHARS if not ("\ud800" <= c[0] <= "\udfff")]

odd_text = st.one_of(
    st.lists(st.one_of(st.sampled_from(ODD_CHARS), st.characters()), max_size=12).map("".join),
    st.sampled_from(ODD_CHARS),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "\U0001f600", "\x00", "ab "]), st.integers(1000, 60_000)),
)
"""Strings with lone surrogates, NUL, RTL marks, combining characters, emoji, or very long."""

good_odd_text = st.one_of(
    st.lists(st.one_of(st.sampled_from(WELL_FORMED_ODD), st.characters()), max_size=12).map("".join),
    st.sampled_from(WELL_FORMED_ODD),
)
"""Well-formed (UTF-8 encodable) but odd strings."""

extreme_numbers = st.sampled_from(
    [
        math.nan,
        math.inf,
        -math.inf,
        -0.0,
        0.0,
        1e308,
        -1e308,
        5e-324,
        10**400,
        -(10**400),
        2**63,
        2**63 - 1,
        -(2**63),
        -(2**63) - 1,
        2**31,
        -1,
        0,
        1,
        True,
        False,
        np.float32("nan"),
        np.int64(3),
        np.float64("inf"),
        1 + 2j,
    ]
)
"""NaN, inf, -0.0, 1e308, 10**400, int64 edges, bools, numpy scalars, a complex."""


def deep_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        value = {"k": value}
    return value


def deep_list(depth: int) -> list[Any]:
    value: list[Any] = [1]
    for _ in range(depth):
        value = [value]
    return value


def cyclic_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    value["self"] = value
    return value


def cyclic_list() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


structures = st.one_of(
    st.integers(40, 2000).map(deep_dict),
    st.integers(40, 2000).map(deep_list),
    st.builds(cyclic_dict),
    st.builds(cyclic_list),
)
"""Deep (40-2000 levels) and cyclic containers."""


class _Weird:
    def __repr__(self) -> str:
        return "<Weird>"


class _BadStr(str):
    """A str subclass whose methods misbehave is out of scope; a plain subclass is a str."""


junk_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    extreme_numbers,
    odd_text,
    st.binary(max_size=8),
    st.builds(_Weird),
    st.just(object()),
    st.builds(bytearray, st.binary(max_size=4)),
    st.just(Ellipsis),
    st.sampled_from([np.array([1, 2]), np.array(["cosine", "faiss"]), np.array(1.5), np.array([], dtype=np.float32)]),
)

junk = st.one_of(
    junk_scalars,
    structures,
    structures,
    st.lists(junk_scalars, max_size=4),
    st.tuples(junk_scalars, junk_scalars),
    st.dictionaries(st.one_of(st.text(max_size=4), st.integers(), st.sampled_from(ODD_CHARS)), junk_scalars, max_size=3),
    st.frozensets(st.integers(), max_size=3),
)
"""Random values of wrong types, extreme numbers, odd unicode, deep and cyclic structures."""

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    good_odd_text,
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(good_odd_text, inner, max_size=3)),
    max_leaves=8,
)
"""Valid JSON values (int64 ints, finite floats, well-formed text, shallow nesting)."""

hostile_metadata = st.one_of(
    st.dictionaries(st.one_of(st.text(max_size=3), st.sampled_from(ODD_CHARS)), st.one_of(junk, json_values), max_size=3),
    structures.map(lambda s: {"deep": s}),
    st.builds(cyclic_dict),
    st.integers(33, 80).map(deep_dict),
    junk,
)
"""Metadata dicts with bad leaves / keys / nesting, and non-dicts."""


# ---------------------------------------------------------------------------------------- the filter grammar
FIELDS = ["a", "b", "c", "s", "tags", "a.b", "n.x", "n.y.z", "n", "missing"]
SCALARS = [
    None,
    True,
    False,
    0,
    1,
    1.0,
    -0.0,
    2,
    2.5,
    -3,
    1e308,
    -1e308,
    2**63 - 1,
    -(2**63),
    "",
    "a",
    "A",
    "ab",
    "Ab",
    "b",
    "ß",
    "SS",
    "ss",
    "e\u0301",
    "\u00e9",
    "\U0001f600",
    "\u200fx",
]
OPERAND_EXTRA = [10**400, -(10**400), 5e-324]

CORE = [1, 1.0, True, False, 0, -0.0, None, "a", "A", "ab"]
scalar = st.one_of(st.sampled_from(CORE), st.sampled_from(CORE), st.sampled_from(SCALARS))
operand_scalar = st.one_of(st.sampled_from(CORE), st.sampled_from(CORE), st.sampled_from(SCALARS + OPERAND_EXTRA))
small_list = st.lists(st.sampled_from(CORE + ["ß", "SS"]), max_size=2)


def _metadata_value(depth: int) -> st.SearchStrategy[Any]:
    base = st.one_of(scalar, scalar, small_list)
    if depth <= 0:
        return base
    return st.one_of(base, base, st.dictionaries(st.sampled_from(["x", "y", "z", "b"]), _metadata_value(depth - 1), max_size=3))


metadata_records = st.fixed_dictionaries(
    {},
    optional={
        "a": _metadata_value(2),
        "b": _metadata_value(0),
        "c": _metadata_value(0),
        "s": st.sampled_from(["", "a", "Ab", "xaby", "STRASSE", "straße", "e\u0301", "\U0001f600!", "ss"]),
        "tags": st.one_of(small_list, scalar),
        "a.b": _metadata_value(0),
        "n": _metadata_value(2),
    },
)
"""Metadata over the small field vocabulary, with nested dicts and a literal dotted key."""

ORDER_OPS = ["$gt", "$gte", "$lt", "$lte"]


def _op_condition(operand: st.SearchStrategy[Any], lists: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    order_operand = st.one_of(
        operand.filter(lambda v: isinstance(v, (int, float, str)) and not isinstance(v, bool)),
        st.sampled_from([0, 1, 2, 2.5, -1, 1e308, 10**400, -(10**400), -0.0, "", "a", "ab", "b", "ß"]),
    )
    return st.one_of(
        st.builds(lambda v: {"$eq": v}, st.one_of(operand, lists)),
        st.builds(lambda v: {"$ne": v}, st.one_of(operand, lists)),
        st.builds(lambda op, v: {op: v}, st.sampled_from(ORDER_OPS), order_operand),
        st.builds(lambda v: {"$in": v}, st.lists(st.one_of(operand, lists), max_size=4)),
        st.builds(lambda v: {"$nin": v}, st.lists(st.one_of(operand, lists), max_size=4)),
        st.builds(lambda v: {"$contains": v}, operand),
        st.builds(
            lambda v: {"$icontains": v},
            st.one_of(
                operand.filter(lambda v: isinstance(v, str)),
                st.sampled_from(["", "a", "A", "ab", "SS", "ss", "ß", "STRASSE", "e\u0301", "!"]),
            ),
        ),
        st.builds(lambda v: {"$exists": v}, st.booleans()),
    )


def _picker(values: list[Any]) -> st.SearchStrategy[Any]:
    def pick(i: int) -> Any:
        return values[i]

    return st.integers(0, len(values) - 1).map(pick)


def make_filters(pairs: list[tuple[str, Any]] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """Valid filters from the grammar. With ``pairs`` ((field, value) found in some records),
    most leaves compare a field with a value it really holds, so filters select a real subset."""
    generic_cond = _op_condition(operand_scalar, small_list)
    field_condition = st.one_of(
        operand_scalar,  # shorthand $eq
        small_list,  # shorthand list equality
        generic_cond,
        generic_cond,
        st.lists(generic_cond, min_size=2, max_size=3).map(lambda ds: {k: v for d in ds for k, v in d.items()}),
    )
    generic_leaf = st.one_of(
        st.dictionaries(st.sampled_from(FIELDS), field_condition, min_size=1, max_size=1),
        st.dictionaries(st.sampled_from(FIELDS), field_condition, min_size=1, max_size=2),
    )
    if pairs:
        def build(args: tuple[tuple[str, Any], int, Any]) -> dict[str, Any]:
            (field, value), how, extra = args
            scalar_value = not isinstance(value, (list, dict))
            if how == 0 or not scalar_value and how in (2, 3, 4):
                return {field: value}
            if how == 1:
                return {field: {"$ne": value}}
            if how == 2:
                return {field: {"$in": [extra, value]}}
            if how == 3:
                return {field: {"$nin": [value]}}
            if how == 4:
                if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                    return {field: {["$gt", "$gte", "$lt", "$lte"][hash(str(extra)) % 4]: value}}
                return {field: {"$contains": value}}
            if how == 5:
                inner = value[0] if isinstance(value, list) and value and not isinstance(value[0], list) else value
                if isinstance(inner, (list, dict)):
                    return {field: {"$exists": True}}
                if isinstance(inner, str) and isinstance(extra, bool) and extra:
                    return {field: {"$icontains": inner.swapcase()}}
                return {field: {"$contains": inner}}
            return {field: {"$exists": bool(extra)}}

        pair_leaf = st.tuples(_picker(pairs), st.integers(0, 6), operand_scalar).map(build)
        leaf = st.one_of(pair_leaf, pair_leaf, pair_leaf, generic_leaf)
    else:
        leaf = generic_leaf
    return st.recursive(
        st.one_of(leaf, leaf, leaf, leaf, st.just({})),
        lambda inner: st.one_of(
            st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$and": fs}),
            st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$or": fs}),
            inner.map(lambda f: {"$not": f}),
            st.tuples(leaf, st.lists(inner, min_size=1, max_size=2)).map(lambda t: {**t[0], "$or": t[1]}),
        ),
        max_leaves=6,
    )


def filters_for(records: list[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Grammar filters whose leaves often compare a field with a value some record holds."""
    pairs: list[tuple[str, Any]] = []
    for record in records:
        for field in FIELDS:
            value = ref_get(record, field)
            if value is not _MISSING and not isinstance(value, dict):
                pairs.append((field, value))
    return make_filters(pairs or None)


filters = make_filters()
"""Valid filters generated from the grammar of gpuprompt.index.filters (fixed operand pool)."""


# ---------------------------------------------------------------------------------------- reference evaluator
_MISSING = object()


def _kind(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "num"
    if isinstance(v, str):
        return "str"
    if isinstance(v, (list, tuple)):
        return "list"
    if isinstance(v, dict):
        return "dict"
    return "other"


def ref_equal(a: Any, b: Any) -> bool:
    """JSON equality: bools never equal numbers, 1 == 1.0, lists element-wise."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        return False
    if ka == "list":
        return len(a) == len(b) and all(ref_equal(x, y) for x, y in zip(a, b))
    if ka == "dict":
        return a.keys() == b.keys() and all(ref_equal(a[k], b[k]) for k in a)
    return a == b


def ref_get(metadata: Mapping[str, Any], field: str) -> Any:
    """A dotted field: the literal key first, else the walk through nested dicts."""
    if field in metadata:
        return metadata[field]
    if "." not in field:
        return _MISSING
    value: Any = metadata
    for step in field.split("."):
        if not isinstance(value, dict) or step not in value:
            return _MISSING
        value = value[step]
    return value


def _ref_op(op: str, operand: Any, v: Any) -> bool:
    present = v is not _MISSING
    if op == "$eq":
        return present and ref_equal(v, operand)
    if op == "$ne":
        return not (present and ref_equal(v, operand))
    if op in ("$gt", "$gte", "$lt", "$lte"):
        if isinstance(operand, str):
            if not isinstance(v, str):
                return False
        elif _kind(v) != "num":
            return False
        if op == "$gt":
            return v > operand
        if op == "$gte":
            return v >= operand
        if op == "$lt":
            return v < operand
        return v <= operand
    if op == "$in":
        return present and any(ref_equal(v, x) for x in operand)
    if op == "$nin":
        return not (present and any(ref_equal(v, x) for x in operand))
    if op == "$contains":
        if isinstance(v, list):
            return any(ref_equal(e, operand) for e in v)
        if isinstance(v, str) and isinstance(operand, str):
            return operand in v
        return False
    if op == "$icontains":
        folded = operand.casefold()
        if isinstance(v, list):
            return any(isinstance(e, str) and e.casefold() == folded for e in v)
        if isinstance(v, str):
            return folded in v.casefold()
        return False
    if op == "$exists":
        return present == operand
    raise AssertionError(op)


def ref_matches(flt: Mapping[str, Any], metadata: Mapping[str, Any]) -> bool:
    """The reference semantics of the grammar table, written from the docstring alone."""
    for key, cond in flt.items():
        if key == "$and":
            ok = all(ref_matches(f, metadata) for f in cond)
        elif key == "$or":
            ok = any(ref_matches(f, metadata) for f in cond)
        elif key == "$not":
            ok = not ref_matches(cond, metadata)
        else:
            v = ref_get(metadata, key)
            if isinstance(cond, dict):
                ok = all(_ref_op(op, operand, v) for op, operand in cond.items())
            else:
                ok = _ref_op("$eq", cond, v)
        if not ok:
            return False
    return True


# ---------------------------------------------------------------------------------------- index state
def index_state(index: Any, query: np.ndarray | None = None) -> tuple[Any, ...]:
    """Everything observable of a VectorIndex: count, ids, every record, and one search."""
    ids = index.ids()
    records = index.get(ids)
    rec = [
        (r.id, r.vector.tobytes(), r.document, json.dumps(r.metadata, sort_keys=True, ensure_ascii=True))
        for r in records
    ]
    hits: list[tuple[str, float]] = []
    if ids:
        q = query if query is not None else np.ones(index.dim, dtype=np.float32)
        hits = [(h.id, round(h.score, 4)) for h in index.search(q, k=len(ids))[0]]
    return index.count, list(ids), rec, hits


def short(value: Any, n: int = 200) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr of a hostile object
        text = f"<{type(value).__name__}>"
    return text if len(text) <= n else text[: n - 3] + "..."
