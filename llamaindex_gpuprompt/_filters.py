"""Translate LlamaIndex ``MetadataFilters`` into gpuprompt's one filter language.

Every ``FilterOperator`` and ``FilterCondition`` is mapped, nested ``MetadataFilters`` included;
the core evaluates the result (see ``gpuprompt.index.filters`` for its semantics).
"""

from __future__ import annotations

from typing import Any

from gpuprompt.errors import FilterError, InvalidInputError, describe
from gpuprompt.validation import MAX_DEPTH, check_text
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

__all__ = ["DOCUMENT_KEYS", "RESERVED_KEY", "is_reserved_key", "to_core_filter"]

RESERVED_KEY = "_llamaindex_node"
"""The metadata key under which ``GPUPromptVectorStore`` keeps its own bookkeeping per node.

The core resolves a dotted field name such as ``"_llamaindex_node.ref_doc_id"`` by a literal key of
that name first, then by walking nested dicts; so both the key itself and every key starting with
``"_llamaindex_node."`` are reserved: user metadata may not hold them and user filters may not
name them (they would read the store's bookkeeping, not the user's metadata)."""

DOCUMENT_KEYS = frozenset({"doc_id", "ref_doc_id", "document_id"})
"""Filter keys that name a node's source document, as in LlamaIndex's own stores: their
``node_to_metadata_dict`` writes the node's ``ref_doc_id`` under all three keys (over any user value
of the same name), so a filter on any of them selects nodes by document. Here they read the
document id the store keeps in its bookkeeping."""

_COMPARE = {
    FilterOperator.EQ: "$eq",
    FilterOperator.NE: "$ne",
    FilterOperator.GT: "$gt",
    FilterOperator.GTE: "$gte",
    FilterOperator.LT: "$lt",
    FilterOperator.LTE: "$lte",
    FilterOperator.CONTAINS: "$contains",
}


def is_reserved_key(key: str) -> bool:
    """Whether a metadata key (or filter field) collides with the store's bookkeeping."""
    return key == RESERVED_KEY or key.startswith(RESERVED_KEY + ".")


def to_core_filter(filters: MetadataFilters | None) -> dict[str, Any] | None:
    """Translate LlamaIndex metadata filters into a gpuprompt core filter.

    ``EQ`` -> ``$eq``, ``NE`` -> ``$ne``, ``GT/GTE/LT/LTE`` -> ``$gt/$gte/$lt/$lte``, ``IN`` -> ``$in``,
    ``NIN`` -> ``$nin``, ``ANY`` -> ``$or`` of ``$contains``, ``ALL`` -> ``$and`` of ``$contains``,
    ``TEXT_MATCH`` and ``CONTAINS`` -> ``$contains``, ``TEXT_MATCH_INSENSITIVE`` -> ``$icontains``,
    ``IS_EMPTY`` -> missing, None, ``""`` or ``[]``. Conditions: ``AND`` -> ``$and``, ``OR`` -> ``$or``,
    ``NOT`` -> ``$not`` of the ``$or`` of the filters (LlamaIndex's "none of them match"). The keys
    ``doc_id``, ``ref_doc_id`` and ``document_id`` select by the node's source document, as they do
    in LlamaIndex's own stores (:data:`DOCUMENT_KEYS`).

    Example:
        >>> from llama_index.core.vector_stores import MetadataFilter, MetadataFilters
        >>> to_core_filter(MetadataFilters(filters=[MetadataFilter(key="price", value=50, operator="<")]))
        {'price': {'$lt': 50}}

    Args:
        filters: the LlamaIndex filters, or None.

    Returns:
        The core filter dict, or None when there is nothing to filter on (None or no filters).

    Raises:
        FilterError: an operand of the wrong shape for its operator, an unknown operator or
            condition, a key that is not a str or names the store's reserved bookkeeping key,
            nesting deeper than 32 levels (or a cycle), or an empty nested ``MetadataFilters``;
            the message names the filter's path.
    """
    if filters is None:
        return None
    if not isinstance(filters, MetadataFilters):
        raise FilterError(f"'filters' must be a MetadataFilters or None (got {describe(filters)})", path="filters")
    if not filters.filters:
        return None
    return _group(filters, "filters", 0)


def _condition(value: Any, path: str) -> FilterCondition:
    if value is None:
        return FilterCondition.AND
    try:
        return FilterCondition(value)
    except (ValueError, TypeError):
        valid = [c.value for c in FilterCondition]
        raise FilterError(f"'condition' must be one of {valid} (got {describe(value)})", path=path) from None


def _group(filters: MetadataFilters, path: str, depth: int) -> dict[str, Any]:
    # Depth-bounded, so a hostile nesting (or a cycle) is a FilterError, never a RecursionError.
    # The core then bounds the translated filter's own depth (each level here adds two or three).
    if depth >= MAX_DEPTH:
        raise FilterError(
            f"MetadataFilters must be nested at most {MAX_DEPTH} levels deep (got deeper, or a cycle); "
            "flatten the conditions",
            path=path,
        )
    items = filters.filters
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise FilterError(f"'filters' must be a list of filters (got {describe(items)})", path=path)
    if not items:
        raise FilterError("a nested MetadataFilters must hold at least one filter (got an empty list)", path=path)
    condition = _condition(filters.condition, f"{path}.condition")
    clauses = []
    for i, item in enumerate(items):
        child = f"{path}.filters[{i}]"
        if isinstance(item, MetadataFilters):
            clauses.append(_group(item, child, depth + 1))
        elif isinstance(item, MetadataFilter):
            clauses.append(_clause(item, child))
        else:
            raise FilterError(
                f"each filter must be a MetadataFilter or MetadataFilters (got {describe(item)})", path=child
            )
    if condition == FilterCondition.NOT:
        return {"$not": clauses[0] if len(clauses) == 1 else {"$or": clauses}}
    if len(clauses) == 1:
        return clauses[0]
    if condition == FilterCondition.OR:
        return {"$or": clauses}
    return {"$and": clauses}


def _clause(item: MetadataFilter, path: str) -> dict[str, Any]:
    key, value = item.key, item.value
    try:
        op = FilterOperator(item.operator)
    except (ValueError, TypeError):
        valid = [o.value for o in FilterOperator]
        raise FilterError(f"'operator' must be one of {valid} (got {describe(item.operator)})", path=path) from None
    if not isinstance(key, str) or not key or key.startswith("$"):
        raise FilterError(f"'key' must be a metadata field name not starting with '$' (got {describe(key)})", path=path)
    try:
        check_text(key, "key")
    except InvalidInputError as exc:
        raise FilterError(str(exc).rstrip("."), path=path) from None
    if is_reserved_key(key):
        raise FilterError(
            f"'key' must name user metadata, not the store's reserved key {RESERVED_KEY!r} (got {describe(key)}); "
            "restrict by node or document with VectorStoreQuery(node_ids=..., doc_ids=...) instead",
            path=path,
        )
    if key in DOCUMENT_KEYS:
        key = f"{RESERVED_KEY}.ref_doc_id"
    if op in _COMPARE:
        return {key: {_COMPARE[op]: value}}
    if op in (FilterOperator.IN, FilterOperator.NIN):
        if not isinstance(value, list):
            raise FilterError(
                f"the value of an {op.name} filter must be a list, for example ['a', 'b'] (got {describe(value)})",
                path=path,
            )
        return {key: {"$in" if op == FilterOperator.IN else "$nin": list(value)}}
    if op in (FilterOperator.ANY, FilterOperator.ALL):
        if not isinstance(value, list) or not value:
            raise FilterError(
                f"the value of an {op.name} filter must be a non-empty list, for example ['a', 'b'] "
                f"(got {describe(value)})",
                path=path,
            )
        parts = [{key: {"$contains": v}} for v in value]
        if len(parts) == 1:
            return parts[0]
        return {"$or" if op == FilterOperator.ANY else "$and": parts}
    if op in (FilterOperator.TEXT_MATCH, FilterOperator.TEXT_MATCH_INSENSITIVE):
        if not isinstance(value, str):
            raise FilterError(f"the value of a {op.name} filter must be a str (got {describe(value)})", path=path)
        return {key: {"$contains" if op == FilterOperator.TEXT_MATCH else "$icontains": value}}
    if op == FilterOperator.IS_EMPTY:
        return {"$or": [{key: {"$exists": False}}, {key: {"$eq": None}}, {key: {"$eq": ""}}, {key: {"$eq": []}}]}
    raise FilterError(f"unsupported filter operator {describe(item.operator)}", path=path)  # pragma: no cover
