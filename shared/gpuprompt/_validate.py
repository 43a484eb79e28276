"""One validation layer for every public boundary: types, ranges, strings, nesting.

Every check raises a ``gpuprompt.errors`` exception whose message follows one template,
``'name' must be X (got V that is a T).`` plus, where it helps, how to fix it. Walks over nested
values are iterative and bounded, so hostile input (cycles, depth 10,000) never recurses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from gpuprompt.errors import InputTypeError, InvalidInputError, describe

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_DEPTH",
    "check_bool",
    "check_choice",
    "check_depth",
    "check_int",
    "check_json",
    "check_metadata",
    "check_number",
    "check_str",
    "check_str_list",
    "check_text",
    "fail",
]

E = TypeVar("E", bound=Exception)

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MAX_DEPTH = 32
"""Deepest nesting accepted in metadata, filters and other JSON-like values."""
MAX_NODES = 100_000
"""Most values (leaves and containers) in one JSON-like value."""


def fail(name: str, expected: str, value: Any, *, fix: str = "", error: type[E] = InvalidInputError) -> E:  # type: ignore[assignment]
    """Build (not raise) the error for ``name``: ``'name' must be X (got V that is a T).``."""
    message = f"'{name}' must be {expected} (got {describe(value)})."
    if fix:
        message += f" {fix}"
    return error(message)


def check_bool(value: Any, name: str, *, error: type[Exception] = InputTypeError) -> bool:
    """Return ``value`` if it is a bool (not 0/1 or "true")."""
    if not isinstance(value, bool):
        raise fail(name, "a bool", value, error=error)
    return value


def check_int(
    value: Any,
    name: str,
    *,
    min: int | None = None,  # noqa: A002 - mirrors the range's name in the message
    max: int | None = None,  # noqa: A002
    allow_none: bool = False,
    error: type[Exception] = InvalidInputError,
) -> int | None:
    """Return ``value`` as an int in ``[min, max]``; bools, floats and numeric strings are refused.

    numpy integers are accepted (they are ints to a user) and returned as Python ints.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not _is_integer(value):
        raise fail(name, _int_phrase(min, max, allow_none), value, error=error)
    number = int(value)
    if (min is not None and number < min) or (max is not None and number > max):
        raise fail(name, _int_phrase(min, max, allow_none), value, error=error)
    return number


def check_number(
    value: Any,
    name: str,
    *,
    min: float | None = None,  # noqa: A002
    max: float | None = None,  # noqa: A002
    allow_none: bool = False,
    error: type[Exception] = InvalidInputError,
) -> float | None:
    """Return ``value`` as a finite float in ``[min, max]``; NaN, inf, bools and strings are refused."""
    if value is None and allow_none:
        return None
    phrase = "a finite number" + _range_phrase(min, max) + (" or None" if allow_none else "")
    if isinstance(value, bool) or not (isinstance(value, (int, float)) or _is_numpy_real(value)):
        raise fail(name, phrase, value, error=error)
    try:
        number = float(value)
    except OverflowError:
        raise fail(name, phrase, value, error=error) from None
    if not math.isfinite(number):
        raise fail(name, phrase, value, error=error)
    if (min is not None and number < min) or (max is not None and number > max):
        raise fail(name, phrase, value, error=error)
    return number


def check_choice(value: Any, name: str, choices: Iterable[Any], *, error: type[Exception] = InvalidInputError) -> Any:
    """Return ``value`` if it is one of ``choices`` (compared by equality, types kept strict)."""
    options = tuple(choices)
    for option in options:
        if type(value) is type(option) and value == option:
            return value
    listed = ", ".join(repr(o) for o in options)
    raise fail(name, f"one of {listed}", value, error=error)


def check_text(value: str, name: str, *, error: type[Exception] = InvalidInputError) -> str:
    """Return ``value`` if it is well-formed Unicode (no lone surrogates), else refuse it.

    Lone surrogates cannot be encoded as UTF-8: stored, they would break every later save.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"'{name}' must be valid Unicode text (got a str with a lone surrogate {value[exc.start]!r} at "
            f"index {exc.start}); decode your input with errors='replace' or drop the character."
        ) from None
    return value


def check_str(
    value: Any,
    name: str,
    *,
    allow_none: bool = False,
    allow_empty: bool = True,
    max_length: int | None = None,
    error: type[Exception] = InputTypeError,
) -> str | None:
    """Return ``value`` if it is a well-formed str (optionally non-empty, bounded)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        expected = "a str" + (" or None" if allow_none else "")
        raise fail(name, expected, value, error=error)
    if not allow_empty and not value:
        raise fail(name, "a non-empty str", value, error=InvalidInputError)
    if max_length is not None and len(value) > max_length:
        raise InvalidInputError(f"'{name}' must be at most {max_length} characters (got {len(value)}).")
    return check_text(value, name, error=InvalidInputError if error is InputTypeError else error)


def check_str_list(
    value: Any, name: str, *, allow_empty_items: bool = True, error: type[Exception] = InputTypeError
) -> list[str]:
    """Return a list of well-formed strs; a bare str (a sequence of characters) is refused."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise fail(
            name,
            "a list of str",
            value,
            fix="Wrap a single text in a list: [text]." if isinstance(value, str) else "",
            error=error,
        )
    for i, item in enumerate(value):
        check_str(item, f"{name}[{i}]", allow_empty=allow_empty_items, error=error)
    return list(value)


def check_json(
    value: Any,
    name: str,
    *,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
) -> Any:
    """Return a detached JSON copy of ``value``, or refuse it with the path of the first bad part.

    Accepts None, bool, ints within int64, finite floats, well-formed strs, lists/tuples and dicts
    with str keys. Tuples become lists. The walk is iterative and refuses cycles, nesting deeper
    than ``max_depth`` and more than ``max_nodes`` values, so nothing accepted here can later break
    a save (JSON), a filter (int64 comparisons) or a worker (recursion).
    """
    root: list[Any] = [None]
    # (value, path, depth, container to write into, key in that container, ids of the ancestors)
    stack: list[tuple[Any, str, int, Any, Any, frozenset[int]]] = [(value, name, 0, root, 0, frozenset())]
    nodes = 0
    while stack:
        item, path, depth, parent, slot, ancestors = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise InvalidInputError(
                f"'{name}' must hold at most {max_nodes} values (it holds more); store large data elsewhere "
                "and keep a reference in the metadata."
            )
        if item is None or isinstance(item, bool):
            parent[slot] = item
        elif isinstance(item, int) or _is_numpy_integer(item):
            number = int(item)
            if not INT64_MIN <= number <= INT64_MAX:
                raise InvalidInputError(
                    f"'{path}' must be an int within 64 bits (got {describe(item)}); store larger numbers as str."
                )
            parent[slot] = number
        elif isinstance(item, float) or _is_numpy_real(item):
            number = float(item)
            if not math.isfinite(number):
                raise InvalidInputError(f"'{path}' must be a finite number (got {describe(item)}); NaN and inf do not save.")
            parent[slot] = number
        elif isinstance(item, str):
            parent[slot] = check_text(item, path)
        elif isinstance(item, (Mapping, list, tuple)):
            if depth >= max_depth:
                raise InvalidInputError(
                    f"'{name}' must be nested at most {max_depth} levels deep (got deeper at '{path}'); flatten it."
                )
            if id(item) in ancestors:
                raise InvalidInputError(f"'{path}' must not contain itself (got a cyclic structure); pass a tree.")
            inner = ancestors | {id(item)}
            if isinstance(item, Mapping):
                copy: Any = {}
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise InvalidInputError(
                            f"'{path}' must have str keys (got key {describe(key)}); convert keys to str."
                        )
                    check_text(key, f"{path} key")
                    copy[key] = None
                    stack.append((child, f"{path}.{key}", depth + 1, copy, key, inner))
            else:
                copy = [None] * len(item)
                for index, child in enumerate(item):
                    stack.append((child, f"{path}[{index}]", depth + 1, copy, index, inner))
            parent[slot] = copy
        else:
            raise InputTypeError(
                f"'{path}' must be JSON-representable: str, int, finite float, bool, None, list or dict "
                f"(got {describe(item)})."
            )
    return root[0]


def check_depth(value: Any, name: str, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Refuse cycles, nesting deeper than ``max_depth`` and more than ``max_nodes`` values.

    Only the shape is checked (dicts, lists, tuples); leaf types are left to the caller. The error
    carries ``.path``, where in ``value`` the problem is. Iterative: never recurses.
    """
    stack: list[tuple[Any, str, int, frozenset[int]]] = [(value, name, 0, frozenset())]
    nodes = 0
    while stack:
        item, path, depth, ancestors = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise _with_path(InvalidInputError(f"'{name}' must hold at most {max_nodes} values (it holds more)."), name)
        if not isinstance(item, (Mapping, list, tuple)):
            continue
        if depth >= max_depth:
            raise _with_path(
                InvalidInputError(f"'{name}' must be nested at most {max_depth} levels deep (got deeper at '{path}')."),
                path,
            )
        if id(item) in ancestors:
            raise _with_path(InvalidInputError(f"'{path}' must not contain itself (got a cyclic structure)."), path)
        inner = ancestors | {id(item)}
        children = item.items() if isinstance(item, Mapping) else enumerate(item)
        for key, child in children:
            label = f"{path}.{key}" if isinstance(item, Mapping) else f"{path}[{key}]"
            stack.append((child, label, depth + 1, inner))


def _with_path(error: E, path: str) -> E:
    error.path = path  # type: ignore[attr-defined]
    return error


def check_metadata(value: Any, name: str = "metadata", *, allow_none: bool = True) -> dict[str, Any]:
    """Return a detached JSON copy of a metadata dict (None becomes ``{}`` when allowed)."""
    if value is None and allow_none:
        return {}
    if not isinstance(value, Mapping):
        raise fail(name, "a dict" + (" or None" if allow_none else ""), value, error=InputTypeError)
    return check_json(value, name)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) or _is_numpy_integer(value)


def _is_numpy_integer(value: Any) -> bool:
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    return kind in ("i", "u") and getattr(value, "ndim", 1) == 0


def _is_numpy_real(value: Any) -> bool:
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    return kind in ("i", "u", "f") and getattr(value, "ndim", 1) == 0


def _range_phrase(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f" >= {low} and <= {high}"
    if low is not None:
        return f" >= {low}"
    if high is not None:
        return f" <= {high}"
    return ""


def _int_phrase(low: int | None, high: int | None, allow_none: bool) -> str:
    return "an int" + _range_phrase(low, high) + (" or None" if allow_none else "")
