"""The LangGraph store's input checks (ops, namespaces, puts, searches, listings, index paths): every
op of a batch is checked before anything is stored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, describe
from gpuprompt.validation import (
    INT64_MAX,
    MAX_DEPTH,
    MAX_NODES,
    check_int,
    check_json,
    check_number,
    check_str,
    fail,
)
from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    GetOp,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    SearchOp,
    ensure_embeddings,
    tokenize_path,
)

if TYPE_CHECKING:
    pass


from langchain_gpuprompt._store_types import NamespaceError, NamespaceTypeError

__all__ = ["_check_listing", "_check_namespace", "_check_op", "_check_put", "_check_search", "_embeddings",
           "_index_paths"]

def _embeddings(embed: Any) -> Embeddings:
    if not isinstance(embed, (Embeddings, str)) and not callable(embed):
        raise fail(
            "index.embed",
            "None, a LangChain Embeddings, a provider string or an embedding function",
            embed,
            error=ConfigurationError,
        )
    try:
        return ensure_embeddings(embed)
    except (TypeError, ValueError, ImportError) as exc:  # e.g. a provider string that cannot load
        raise ConfigurationError(f"'index.embed' could not be loaded (got {describe(embed)}): {exc}") from None


def _check_op(op: Any, position: int) -> Op:
    """Check one op of a batch; returns it with a namespace tuple and, for a put, a detached
    JSON copy of the value (what gets stored)."""
    prefix = f"ops[{position}]."
    if isinstance(op, PutOp):
        return _check_put(op, prefix)
    if isinstance(op, GetOp):
        namespace = _check_namespace(op.namespace, prefix + "namespace")
        check_str(op.key, prefix + "key")
        return op._replace(namespace=namespace)
    if isinstance(op, SearchOp):
        return _check_search(op, prefix)
    if isinstance(op, ListNamespacesOp):
        conditions = op.match_conditions
        if conditions is not None:
            if isinstance(conditions, (str, bytes)) or not isinstance(conditions, (tuple, list)):
                raise fail(
                    prefix + "match_conditions", "None or a tuple of MatchCondition", conditions, error=InputTypeError
                )
            for i, condition in enumerate(conditions):
                name = f"{prefix}match_conditions[{i}]"
                if not isinstance(condition, MatchCondition):
                    raise fail(name, "a MatchCondition", condition, error=InputTypeError)
                if condition.match_type not in ("prefix", "suffix"):
                    raise fail(name + ".match_type", "'prefix' or 'suffix'", condition.match_type)
                _check_namespace(condition.path, name + ".path")
        check_int(op.max_depth, prefix + "max_depth", min=0, max=INT64_MAX, allow_none=True)
        check_int(op.limit, prefix + "limit", min=0, max=INT64_MAX)
        check_int(op.offset, prefix + "offset", min=0, max=INT64_MAX)
        return op
    raise fail(f"ops[{position}]", "a GetOp, SearchOp, PutOp or ListNamespacesOp", op, error=InputTypeError)


def _check_namespace(value: Any, name: str, *, put: bool = False) -> tuple[str, ...]:
    """A namespace (``put=True``: one an item is stored under), a prefix or a match path ('*' is
    a plain label here; a match path reads it as any label).

    The rules are LangGraph's (non-empty str labels without '.' or NUL; a put's namespace is
    non-empty and not under "langgraph") plus well-formed Unicode; a bare str, which LangGraph
    would take label by character, is refused.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise fail(name, "a tuple of str labels such as ('users', '42')", value, error=NamespaceTypeError)
    if put and not value:
        raise fail(name, "a non-empty tuple of str labels such as ('users', '42')", value, error=NamespaceError)
    for i, label in enumerate(value):
        label_name = f"{name}[{i}]"
        if not isinstance(label, str):
            raise fail(label_name, "a str", label, error=NamespaceTypeError)
        if not label or "." in label or "\x00" in label:
            raise fail(label_name, "a non-empty str without '.' or NUL", label, error=NamespaceError)
        try:
            check_str(label, label_name)
        except InvalidInputError as exc:
            raise NamespaceError(str(exc)) from None
    if put and value[0] == "langgraph":
        raise fail(name, "a namespace whose first label is not 'langgraph' (reserved)", value, error=NamespaceError)
    return tuple(value)


def _check_put(op: PutOp, prefix: str) -> PutOp:
    namespace = _check_namespace(op.namespace, prefix + "namespace", put=True)
    check_str(op.key, prefix + "key")
    value = op.value
    if value is not None:
        if not isinstance(value, Mapping):
            raise fail(prefix + "value", "a dict or None", value, error=InputTypeError)
        # The value is stored inside the index record's metadata, one level down, beside the
        # namespace labels and the key: bounded here so the record is never refused later.
        value = check_json(value, prefix + "value", max_depth=MAX_DEPTH - 1, max_nodes=MAX_NODES - len(namespace) - 8)
    index = op.index
    if index is not None and index is not False:
        _index_paths(index, prefix + "index")
    if op.ttl is not None:
        try:
            ttl = check_number(op.ttl, prefix + "ttl")
        except InvalidInputError:
            ttl = None
        if ttl is None or ttl <= 0:
            raise fail(prefix + "ttl", "None or a finite number of minutes > 0", op.ttl)
    return op._replace(namespace=namespace, value=value)


def _check_search(op: SearchOp, prefix: str) -> SearchOp:
    namespace = _check_namespace(op.namespace_prefix, prefix + "namespace_prefix")
    check_int(op.limit, prefix + "limit", min=0, max=INT64_MAX)
    check_int(op.offset, prefix + "offset", min=0, max=INT64_MAX)
    check_str(op.query, prefix + "query", allow_none=True)
    if op.filter is not None:
        if not isinstance(op.filter, Mapping):
            raise fail(prefix + "filter", "None or a dict such as {'color': 'red'}", op.filter, error=InputTypeError)
        # Bounded, acyclic, str keys: the translation below recurses over it.
        check_json(op.filter, prefix + "filter")
    return op._replace(namespace_prefix=namespace)


def _check_listing(prefix: Any, suffix: Any, max_depth: Any, limit: Any, offset: Any) -> None:
    if prefix is not None:
        _check_namespace(prefix, "prefix")
    if suffix is not None:
        _check_namespace(suffix, "suffix")
    check_int(max_depth, "max_depth", min=0, max=INT64_MAX, allow_none=True)
    check_int(limit, "limit", min=0, max=INT64_MAX)
    check_int(offset, "offset", min=0, max=INT64_MAX)


def _index_paths(paths: Any, name: str, *, error: type[Exception] = InputTypeError) -> list[tuple[str, Any]]:
    """The JSON paths to embed, each with its tokens ("$" is the whole value)."""
    if isinstance(paths, (str, bytes)) or not isinstance(paths, (list, tuple)):
        raise fail(name, "a list of JSON paths such as ['text']", paths, error=error)
    out: list[tuple[str, Any]] = []
    for i, path in enumerate(paths):
        try:
            check_str(path, f"{name}[{i}]", allow_empty=False)
        except InvalidInputError as exc:
            raise error(str(exc)) from None
        out.append((path, path if path == "$" else tokenize_path(path)))
    return out


