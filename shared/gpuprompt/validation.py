"""One validation layer for every public boundary: types, ranges, strings, nesting.

Every check raises a ``gpuprompt.errors`` exception whose message follows one template,
``'name' must be X (got V that is a T).`` plus, where it helps, how to fix it. Walks over nested
values are iterative and bounded, so hostile input (cycles, depth 10,000) never recurses.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, TypeVar

from gpuprompt.errors import ConfigurationError, GPUPromptError, InputTypeError, InvalidInputError, describe

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_DEPTH",
    "check_bool",
    "check_choice",
    "check_clock",
    "check_depth",
    "check_int",
    "check_json",
    "check_metadata",
    "check_number",
    "check_path",
    "check_path_name",
    "check_real_matrix",
    "check_real_vector",
    "check_str",
    "check_str_list",
    "check_text",
    "check_ttl",
    "configuration_error",
    "fail",
    "read_aliases",
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
    int64: bool = True,
) -> Any:
    """Return a detached JSON copy of ``value``, or refuse it with the path of the first bad part.

    Accepts None, bool, ints within int64, finite floats, well-formed strs, lists/tuples and dicts
    with str keys. Tuples become lists. The walk is iterative and refuses cycles, nesting deeper
    than ``max_depth`` and more than ``max_nodes`` values, so nothing accepted here can later break
    a save (JSON), a filter (int64 comparisons) or a worker (recursion). ``int64=False`` accepts
    ints of any size (a filter's operands: compared exactly, never stored).
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
            if int64 and not INT64_MIN <= number <= INT64_MAX:
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


def check_clock(clock: Any, name: str = "clock", *, error: type[Exception] = ConfigurationError) -> Callable[[], float]:
    """Return ``clock`` if it is a callable that returns a finite number of seconds.

    Called once, as a probe: a clock that raises or returns something else would otherwise fail
    at the first write that reads the time, long after it was accepted.
    """
    if not callable(clock):
        raise fail(name, "a callable () -> float returning seconds", clock, error=error)
    try:
        now = clock()
    except Exception as exc:
        raise error(f"'{name}' raised {exc!r} when called; pass a callable () -> float.") from exc
    check_number(now, f"{name}()", error=error)
    return clock


def check_ttl(
    value: Any, name: str = "ttl_seconds", *, unit: str = "seconds", error: type[Exception] = ConfigurationError
) -> float | None:
    """Return a lifetime as a float > 0, or None (no expiry); a zero lifetime is refused like a
    negative one (it would drop everything at once)."""
    if value is None:
        return None
    phrase = f"a finite number of {unit} > 0 or None"
    try:
        ttl = check_number(value, name, min=0, error=error)
    except GPUPromptError:
        raise fail(name, phrase, value, error=error) from None
    if ttl == 0:
        raise fail(name, phrase, value, error=error)
    return ttl


def check_path_name(value: Any, name: str, *, fix: str = "Pick a plain name such as 'index'.") -> str:
    """Return ``value`` if it is one plain file or folder name: joined to a folder, it stays inside.

    Refused: a non-str, an empty name, ``.`` and ``..``, a separator (``/``, ``\\``, the OS's own),
    NUL and lone surrogates.
    """
    check_str(value, name)
    separators = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if not value or value in (".", "..") or "\x00" in value or any(sep in value for sep in separators):
        raise fail(name, "a plain name: non-empty, without '/', '\\', NUL, and not '.' or '..'", value, fix=fix)
    return value


def check_path(value: Any, name: str, *, named: bool = True) -> str:
    """Return a local path (a str or ``os.PathLike``) as a str, or refuse one that could land elsewhere.

    Refused: a non-str, an empty path, NUL, lone surrogates, ``..`` after a folder the path named
    (``a/../b``: how a name such as ``"../../x"`` joined to a folder escapes it) and, when
    ``named`` (the path names the snapshot itself, not its parent folder), a last part of ``.``,
    ``..`` or a root.
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise fail(name, "a str or os.PathLike path", value, error=InputTypeError)
    if not value or "\x00" in value:
        raise fail(name, "a non-empty path without NUL characters", value)
    check_text(value, name)
    path = PurePath(value)
    if named and path.name in ("", ".", ".."):
        raise fail(name, "a path whose last part names a folder (not '.', '..' or a root)", value)
    named_folder = False
    for part in path.parts:
        if part == ".." and named_folder:
            raise fail(
                name,
                "a path that does not step back out of a folder it named ('a/../b')",
                value,
                fix="Pass os.path.normpath(path), and keep names free of '/' and '..'.",
            )
        named_folder = named_folder or (part not in ("..", ".") and part != path.anchor)
    return value


def check_real_vector(value: Any, name: str) -> np.ndarray:
    """Return one vector (a list, tuple or array of real numbers) as a 1-D float32 array.

    Strict: bools, strs, None, complex numbers, objects and nested lists are refused, not coerced
    (``np.asarray(["1.5", True], dtype=float32)`` would take them), and so are NaN, inf and values
    beyond float32's range, which no index can rank.

    Raises:
        InputTypeError: not a flat sequence of real numbers (the message names the first bad item).
        InvalidInputError: a value is not finite in float32.
    """
    return _real_array(value, name, 1)


def check_real_matrix(value: Any, name: str) -> np.ndarray:
    """Return rows of real numbers, all of one length, as a 2-D float32 array (as
    :func:`check_real_vector`, row by row; ragged rows are refused)."""
    return _real_array(value, name, 2)


def _real_array(value: Any, name: str, ndim: int) -> np.ndarray:
    import numpy as np

    expected = "a flat list of real numbers (an embedding)" if ndim == 1 else "a list of rows of real numbers"
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not (
        isinstance(value, (list, tuple)) or hasattr(value, "__array__")
    ):
        raise fail(name, expected, value, error=InputTypeError)
    if isinstance(value, (list, tuple)):
        rows = [(name, value)] if ndim == 1 else list(_rows(value, name, expected))
        for row_name, row in rows:
            if isinstance(row, (list, tuple)):
                _check_real_items(row, row_name, name, expected)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, OverflowError):  # ragged rows, or items numpy cannot hold
        raise fail(name, expected, value, fix="Every row must have the same length.", error=InputTypeError) from None
    if array.dtype.kind not in "iuf" or array.ndim != ndim:
        shape = f"It is an array of shape {array.shape}." if array.dtype.kind in "iuf" else ""
        raise fail(name, expected, value, fix=shape, error=InputTypeError)
    with np.errstate(over="ignore", invalid="ignore"):
        converted = array.astype(np.float32)
    if not np.isfinite(converted).all():
        raise fail(
            name,
            expected.replace("real numbers", "finite real numbers"),
            value,
            fix="NaN, inf and values beyond float32's range (about 3.4e38) cannot be ranked.",
        )
    return converted


def _rows(value: list[Any] | tuple[Any, ...], name: str, expected: str) -> Iterable[tuple[str, Any]]:
    import numpy as np

    for i, row in enumerate(value):
        if isinstance(row, (list, tuple)):
            yield f"{name}[{i}]", row
        elif isinstance(row, (str, bytes, bytearray, Mapping)) or not hasattr(row, "__array__"):
            raise fail(name, expected, value, fix=f"Row {i} is {describe(row)}.", error=InputTypeError)
        elif np.asarray(row).dtype.kind not in "iuf":  # a bool row would be upcast beside a float one
            fix = f"Row {i} holds {np.asarray(row).dtype} values."
            raise fail(name, expected, value, fix=fix, error=InputTypeError)


def _check_real_items(row: list[Any] | tuple[Any, ...], row_name: str, name: str, expected: str) -> None:
    import numpy as np

    # One pass over the item types in C (map/set), then a look at the few distinct types.
    for kind in set(map(type, row)):
        if kind is bool or not issubclass(kind, (int, float, np.integer, np.floating)):
            position = next(i for i, item in enumerate(row) if type(item) is kind)
            raise fail(
                name,
                expected,
                row,
                fix=f"'{row_name}[{position}]' is {describe(row[position])}.",
                error=InputTypeError,
            )


def read_aliases(options: Mapping[str, Any], aliases: Mapping[str, str], owner: str) -> dict[str, Any]:
    """``options`` with each key of ``aliases`` (another library's name for a setting, such as
    ``HuggingFaceLLM``'s ``max_new_tokens``) renamed to ours, so a swapped-in class keeps its
    arguments.

    Raises:
        ConfigurationError: a setting given under both names.
    """
    out = dict(options)
    for alias, name in aliases.items():
        if alias in out:
            if out.get(name) is not None:
                raise ConfigurationError(f"{owner} got both '{alias}' and '{name}' (the same setting); pass one.")
            out[name] = out.pop(alias)
    return out


def configuration_error(exc: Exception, owner: str) -> Exception:
    """The typed error for a pydantic ``ValidationError`` raised over ``owner``'s own fields.

    A gpuprompt error raised inside a field validator is returned as it was raised; any other
    failure becomes a :class:`~gpuprompt.errors.ConfigurationError` naming the first bad field and
    value. Raise the result ``from exc``. (Reads ``exc.errors()``: no pydantic import here.)
    """
    try:
        errors = list(exc.errors())  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - not a ValidationError after all: keep its text
        return ConfigurationError(f"invalid options for {owner}: {exc}")
    if not errors:
        return ConfigurationError(f"invalid options for {owner}: {exc}")
    first = errors[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, GPUPromptError):
        return cause
    field = ".".join(str(part) for part in first.get("loc", ())) or "options"
    value = first.get("input")
    message = str(first.get("msg", "is invalid"))
    more = f" ({len(errors) - 1} more option(s) of {owner} are invalid too.)" if len(errors) > 1 else ""
    if first.get("type") == "extra_forbidden":
        return ConfigurationError(
            f"'{field}' is not an option of {owner} (got {field}={describe(value)}); see its docstring for the "
            f"valid ones.{more}"
        )
    prefix = "Input should be "
    if message.startswith(prefix):
        return fail(field, message[len(prefix) :], value, fix=more.strip(), error=ConfigurationError)
    return ConfigurationError(f"'{field}' is invalid for {owner}: {message} (got {describe(value)}).{more}")


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


def check_options(owner: str, options: Mapping[str, Any], valid: Iterable[str], *, remote: str | None = None) -> None:
    """Refuse options that ``owner`` does not take, naming them and the valid ones.

    Args:
        owner: the class named in the message (``"Reranker"``).
        options: the keyword options given.
        valid: the option names it takes.
        remote: where its remote twin is (``"gpuprompt.connect(url).reranker()"``), named when the
            options ask for a server (``base_url``, ``api_key``): the core classes run the model here.

    Raises:
        ConfigurationError: an unknown option.
    """
    valid = sorted(valid)
    unknown = sorted(set(options) - set(valid))
    if not unknown:
        return
    hint = ""
    if remote is not None and {"base_url", "api_key"} & set(unknown):
        hint = f" {owner} runs its model in this process; for a running gpuprompt serve, use {remote}."
    raise ConfigurationError(f"unknown {owner} option(s) {unknown}; valid options: {valid}.{hint}")
