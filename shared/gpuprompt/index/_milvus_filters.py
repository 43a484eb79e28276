"""Our filter language (:mod:`gpuprompt.index.filters`) translated into Milvus boolean expressions.

The translation is *sound*: the Milvus expression selects every record the filter matches, and
usually exactly those. Where Milvus cannot say what our language means, it selects a few more:
:class:`~gpuprompt.index.MilvusIndex` then re-checks each returned record with the compiled
predicate (:func:`~gpuprompt.index.filters.compile_filter`) and fetches more until ``k`` remain, so
results are always those of :class:`~gpuprompt.VectorIndex`. What Milvus (Lite 3.x and the server)
does differently, measured, and how each difference is handled:

* ``not (expr)`` is three-valued: it drops records where ``expr`` is unknown (a missing field, a
  JSON ``null``, a value of another type). So ``$not`` / ``$ne`` / ``$nin`` are never emitted as
  ``not``: negations are pushed down to the comparisons (De Morgan) and each negated comparison
  says ``P is null or ...`` explicitly, keeping records where the field is missing.
* ``meta["x"] in [...]`` is refused on a JSON path: ``$in`` becomes an ``or`` of equalities.
* Bools equal the numbers 1 / 0 in Milvus (``true == 1``) and order with numbers; ours never do.
  Equality keeps the Milvus meaning (a superset), negated equality adds the other kind back.
* ``exists`` and ``is null`` treat a JSON ``null`` value like a missing key; ours tells them apart
  (``{"x": {"$exists": True}}`` matches ``{"x": None}``): ``$exists: True`` is not narrowed in
  Milvus, ``$exists: False`` becomes ``is null`` (a superset).
* A negated ordering (``{"$not": {"price": {"$gt": 5}}}``) also matches values of another kind,
  which Milvus cannot name on a JSON path: not narrowed. On a typed scalar field it is exact.
* ``$icontains``: on a declared ``str`` scalar field, a case-folded shadow column answers it with
  ``like``; on a JSON field it is narrowed to records holding the field.
* A dotted name (``"brand.name"``) reads the literal key when present, else the nested path: the
  expression allows both.

A key or string holding control characters is not narrowed (no escape for them in Milvus).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["FOLDED_SUFFIX", "SCALAR_KINDS", "TRUE", "compile_milvus", "ids_expression", "literal"]

TRUE = "true"
FALSE = "false"
FOLDED_SUFFIX = "__folded"
"""The case-folded shadow column of a ``str`` scalar field ``name`` is ``name + FOLDED_SUFFIX``."""
SCALAR_KINDS = ("str", "int", "float", "bool")
"""The kinds a declared scalar field may have (VARCHAR, INT64, DOUBLE, BOOL in Milvus)."""

_INVERSE = {"$gt": "<=", "$gte": "<", "$lt": ">=", "$lte": ">"}
_OPERATOR = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def compile_milvus(filter: Mapping[str, Any] | None, *, scalar_fields: Mapping[str, str], json_field: str) -> str:
    """The Milvus boolean expression selecting (at least) the records ``filter`` matches.

    Args:
        filter: a filter already validated by :func:`~gpuprompt.index.filters.compile_filter`.
        scalar_fields: the declared scalar fields, ``{name: kind}`` (kinds: :data:`SCALAR_KINDS`).
        json_field: the JSON field holding every record's whole metadata.

    Returns:
        The expression, ``""`` when it selects every record.
    """
    if not filter:
        return ""
    expr = _Compiler(scalar_fields, json_field).node(filter, negated=False)
    return "" if expr == TRUE else expr


def literal(value: Any) -> str | None:
    """``value`` as a Milvus literal, or None when Milvus has no safe spelling for it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if -(2**63) <= value < 2**63 else None
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, str):
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            return None
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return None


def ids_expression(ids: Iterable[str]) -> str | None:
    """``id in [...]`` selecting ``ids``, each spelled by :func:`literal` (pymilvus's own ``ids=``
    pastes an id between quotes as it is, so an id holding a quote would break the expression or
    select other records); None when no id has a spelling (only control characters lack one, and
    MilvusIndex never stores such an id)."""
    spelled = [text for text in map(literal, ids) if text is not None]
    return f"id in [{', '.join(spelled)}]" if spelled else None


def _and(parts: list[str]) -> str:
    kept = [p for p in parts if p != TRUE]
    if FALSE in kept:
        return FALSE
    if not kept:
        return TRUE
    return kept[0] if len(kept) == 1 else " and ".join(f"({p})" for p in kept)


def _or(parts: list[str]) -> str:
    kept = [p for p in parts if p != FALSE]
    if TRUE in kept:
        return TRUE
    if not kept:
        return FALSE
    return kept[0] if len(kept) == 1 else " or ".join(f"({p})" for p in kept)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _like_body(value: str) -> str | None:
    """``value`` inside a ``like "%...%"`` pattern (``%`` / ``_`` stay wildcards: a superset)."""
    if "\\" in value or '"' in value or literal(value) is None:
        return None
    return value


class _Compiler:
    def __init__(self, scalar_fields: Mapping[str, str], json_field: str) -> None:
        self.scalar = dict(scalar_fields)
        self.json_field = json_field

    # ------------------------------------------------------------------ structure
    def node(self, node: Mapping[str, Any], negated: bool) -> str:
        parts: list[str] = []
        for key, value in node.items():
            if key == "$and":
                sub = [self.node(item, negated) for item in value]
                parts.append(_or(sub) if negated else _and(sub))
            elif key == "$or":
                sub = [self.node(item, negated) for item in value]
                parts.append(_and(sub) if negated else _or(sub))
            elif key == "$not":
                parts.append(self.node(value, not negated))
            else:
                parts.append(self.field(key, value, negated))
        return _or(parts) if negated else _and(parts)

    def field(self, name: str, condition: Any, negated: bool) -> str:
        ops = condition if isinstance(condition, Mapping) else {"$eq": condition}
        if name in self.scalar:
            parts = [self.typed(name, self.scalar[name], op, operand, negated) for op, operand in ops.items()]
        else:
            parts = [self.json_atom(name, op, operand, negated) for op, operand in ops.items()]
        # Several operators on one field: all must hold; negated, any may fail.
        return _or(parts) if negated else _and(parts)

    def json_atom(self, name: str, op: str, operand: Any, negated: bool) -> str:
        literal_path = self.path([name])
        if "." not in name:
            return TRUE if literal_path is None else _json(literal_path, op, operand, negated)
        nested_path = self.path(name.split("."))
        if literal_path is None or nested_path is None:
            return TRUE
        # A literal dotted key wins when present; otherwise the nested path is read.
        return _or(
            [
                _json(literal_path, op, operand, negated),
                _and([f"{literal_path} is null", _json(nested_path, op, operand, negated)]),
            ]
        )

    def path(self, steps: list[str]) -> str | None:
        keys = [literal(step) for step in steps]
        if any(key is None for key in keys):
            return None
        return self.json_field + "".join(f"[{key}]" for key in keys)

    # ------------------------------------------------------------------ typed scalar columns (exact)
    def typed(self, column: str, kind: str, op: str, operand: Any, negated: bool) -> str:
        if op in ("$in", "$nin"):
            sub = [self.typed(column, kind, "$eq", item, negated != (op == "$nin")) for item in operand]
            member = (op == "$in") != negated
            return _or(sub) if member else _and(sub)
        if op == "$ne":
            return self.typed(column, kind, "$eq", operand, not negated)
        if op == "$exists":
            present = operand != negated
            # A None value is present to us but null to Milvus: "present" cannot be narrowed.
            return TRUE if present else f"{column} is null"
        if op == "$eq":
            if operand is None:  # present with None, or (negated) missing / any other value
                return TRUE if negated else f"{column} is null"
            if not _fits(kind, operand):
                return TRUE if negated else FALSE
            text = literal(int(operand) if kind == "int" else operand)
            if text is None:  # a str Milvus cannot spell: not narrowed
                return TRUE if negated else f"{column} is not null"
            return f"{column} is null or {column} != {text}" if negated else f"{column} == {text}"
        if op in _OPERATOR:
            comparable = (kind == "str" and isinstance(operand, str)) or (
                kind in ("int", "float") and _is_number(operand)
            )
            if not comparable:
                return TRUE if negated else FALSE
            symbol = _INVERSE[op] if negated else _OPERATOR[op]
            text = literal(_int_bound(symbol, operand) if kind == "int" else operand)
            if text is None:
                return TRUE if negated else f"{column} is not null"
            if negated:
                return f"{column} is null or {column} {symbol} {text}"
            return f"{column} {symbol} {text}"
        # $contains / $icontains: substring of a str column (a str column holds no lists).
        if kind != "str" or not isinstance(operand, str):
            return TRUE if negated else FALSE
        target, value = column, operand
        if op == "$icontains":
            target, value = column + FOLDED_SUFFIX, operand.casefold()
        body = _like_body(value)
        if body is None:
            return TRUE if negated else f"{column} is not null"
        if negated:
            if "%" in body or "_" in body:
                return TRUE
            return f"{target} is null or not ({target} like \"%{body}%\")"
        return f'{target} like "%{body}%"'


def _int_bound(symbol: str, bound: float) -> int:
    """The int bound equivalent to ``bound`` for an int column under ``symbol`` (int64-clamped)."""
    if isinstance(bound, float):
        bound = math.floor(bound) if symbol in (">", "<=") else math.ceil(bound)
    return max(-(2**63), min(2**63 - 1, int(bound)))


def _fits(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool) or (
            isinstance(value, float) and value.is_integer() and abs(value) < 2**63
        )
    return _is_number(value)


# ---------------------------------------------------------------------- JSON paths (sound)
def _json(path: str, op: str, operand: Any, negated: bool) -> str:
    if op in ("$in", "$nin"):
        member = (op == "$in") != negated
        sub = [_json_eq(path, item, negated=not member) for item in operand]
        return _or(sub) if member else _and(sub)
    if op in ("$eq", "$ne"):
        return _json_eq(path, operand, negated=negated != (op == "$ne"))
    if op == "$exists":
        present = operand != negated
        return TRUE if present else f"{path} is null"
    if negated:
        # not (ordering / contains): also true for values of another kind, which Milvus cannot
        # name on a JSON path.
        return TRUE
    if op in _OPERATOR:
        text = literal(operand)
        return f"{path} {_OPERATOR[op]} {text}" if text is not None else f"{path} is not null"
    if op == "$contains":
        text = literal(operand)
        if operand is None or text is None:
            return f"{path} is not null"
        if isinstance(operand, str):
            body = _like_body(operand)
            like = f'{path} like "%{body}%"' if body is not None else f"{path} is not null"
            return _or([f"json_contains({path}, {text})", like])
        if isinstance(operand, bool):
            return f"json_contains({path}, {text})"
        if operand < 0:  # Milvus parses no unary minus inside a function's arguments
            return f"{path} is not null"
        return f"json_contains({path}, {literal(abs(operand))})"  # abs: -0.0 is 0.0
    # $icontains on a JSON path: the records holding the field (re-checked exactly).
    return f"{path} is not null"


def _json_eq(path: str, operand: Any, *, negated: bool) -> str:
    if operand is None:  # present with None, or (negated) missing / any other value
        return TRUE if negated else f"{path} is null"
    if isinstance(operand, (list, tuple)):
        return TRUE if negated else f"{path} is not null"
    text = literal(operand)
    if text is None:
        return TRUE if negated else f"{path} is not null"
    if not negated:
        return f"{path} == {text}"
    parts = [f"{path} is null", f"{path} != {text}"]
    # Milvus equates true with 1 and false with 0; to us a bool never equals a number.
    if isinstance(operand, bool):
        parts += [f"{path} == 1", f"{path} == 0"]
    elif _is_number(operand):
        parts += [f"{path} == true", f"{path} == false"]
    return _or(parts)

