"""The query side of :class:`~llamaindex_gpuprompt.GPUPromptVectorStore`: a ``VectorStoreQuery``
checked and planned (vector, k, core filter, MMR or the words of HYBRID / TEXT_SEARCH), and the id
restriction re-checked on each hit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuprompt.errors import ConfigurationError, DimensionMismatchError, InputTypeError, InvalidInputError, describe
from gpuprompt.validation import check_choice, check_int, check_number, check_real_vector, check_str
from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode

from llamaindex_gpuprompt._filters import RESERVED_KEY, to_core_filter

if TYPE_CHECKING:
    from gpuprompt.index import Hit, Record

__all__ = ["Restriction", "lexical_index", "plan_query"]

NODE_KEY = RESERVED_KEY
_MODES = (VectorStoreQueryMode.DEFAULT.value, VectorStoreQueryMode.MMR.value, VectorStoreQueryMode.HYBRID.value,
          VectorStoreQueryMode.TEXT_SEARCH.value)
_WORDS = (VectorStoreQueryMode.HYBRID.value, VectorStoreQueryMode.TEXT_SEARCH.value)


def _and(*filters: dict[str, Any] | None) -> dict[str, Any] | None:
    parts = [f for f in filters if f]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else {"$and": parts}


def _id_list(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple, set)):
        raise InputTypeError(f"'{name}' must be None or a list of str (got {describe(value)}).")
    items = list(value)
    for i, item in enumerate(items):
        check_str(item, f"{name}[{i}]")
    return items


def plan_query(
    query: VectorStoreQuery, kwargs: dict[str, Any], *, dim: int | None, prefetch_factor: float
) -> tuple[Any, int, dict | None, dict | None, Restriction]:
    """A query checked: ``(vector or None, k, core filter, MMR or words plan, restriction)``."""
    if not isinstance(query, VectorStoreQuery):
        raise InputTypeError(f"'query' must be a VectorStoreQuery (got {describe(query)}).")
    mode = query.mode.value if isinstance(query.mode, VectorStoreQueryMode) else query.mode
    check_choice(mode, "query.mode", _MODES)  # strict: never compares an array or a lookalike
    k = check_int(query.similarity_top_k, "query.similarity_top_k", min=0)
    vector = None if mode == VectorStoreQueryMode.TEXT_SEARCH.value else _query_vector(query, dim)
    node_ids = _id_list(query.node_ids, "query.node_ids")
    doc_ids = _id_list(query.doc_ids, "query.doc_ids")
    # An empty id list means "no restriction", as the retrievers pass it.
    core_filter = _and(
        to_core_filter(query.filters),
        kwargs.get("filter"),
        {f"{NODE_KEY}.id": {"$in": node_ids}} if node_ids else None,
        {f"{NODE_KEY}.ref_doc_id": {"$in": doc_ids}} if doc_ids else None,
    )
    mmr = None
    if query.mode == VectorStoreQueryMode.MMR:
        threshold = query.mmr_threshold if query.mmr_threshold is not None else kwargs.get("mmr_threshold")
        threshold = check_number(0.5 if threshold is None else threshold, "mmr_threshold", min=0.0, max=1.0)
        fetch_k = check_int(kwargs.get("mmr_prefetch_k"), "mmr_prefetch_k", min=1, allow_none=True)
        if fetch_k is None:
            factor = check_number(
                kwargs.get("mmr_prefetch_factor", prefetch_factor), "mmr_prefetch_factor", min=1.0
            )
            fetch_k = max(20, int(k * factor)) if k * factor < 2**62 else 2**62
        mmr = {"fetch_k": max(fetch_k, k), "lambda_mult": threshold}
    elif mode in _WORDS:
        k, mmr = _words_plan(query, mode, k)
    restriction = Restriction(set(node_ids) if node_ids else None, set(doc_ids) if doc_ids else None)
    return vector, k, core_filter, mmr, restriction

def _query_vector(query: VectorStoreQuery, dim: int | None) -> Any:
    if query.query_embedding is None:
        raise InvalidInputError(
            "'query.query_embedding' must be a list of floats (got None); embed the query first "
            "(retrievers and query engines do), or query with mode TEXT_SEARCH."
        )
    vector = check_real_vector(query.query_embedding, "query.query_embedding")
    if dim is not None and vector.shape[0] != dim:
        raise DimensionMismatchError(
            f"'query.query_embedding' must have {dim} dimensions (got {vector.shape[0]}); embed the "
            "query with the model that embedded the nodes.",
            expected=dim,
            got=int(vector.shape[0]),
        )
    return vector

def _words_plan(query: VectorStoreQuery, mode: str, k: int) -> tuple[int, dict[str, Any]]:
    """``(k, plan)`` of a HYBRID or TEXT_SEARCH query: the text, and for hybrid the fusion."""
    text = query.query_str
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError(f"'query.query_str' must hold words for mode {mode!r} (got {describe(text)}); "
                                "retrievers pass the question as query_str.")
    sparse = check_int(query.sparse_top_k, "query.sparse_top_k", min=1, allow_none=True)
    if mode == VectorStoreQueryMode.TEXT_SEARCH.value:
        return (sparse if sparse is not None else k), {"text": text}
    final = check_int(query.hybrid_top_k, "query.hybrid_top_k", min=1, allow_none=True)
    # checked here too, so an empty store or similarity_top_k=0 refuses a bad alpha as the search would
    alpha = check_number(query.alpha, "query.alpha", min=0.0, max=1.0, allow_none=True)
    plan: dict[str, Any] = {"text": text, "alpha": alpha}
    if final is not None:  # LlamaIndex's meaning: similarity_top_k / sparse_top_k candidates, hybrid_top_k kept
        plan["fetch_k"] = max(final, k, sparse or 0)
        k = final
    elif sparse is not None:
        plan["fetch_k"] = max(k, sparse)
    return k, plan

def lexical_index(index: Any) -> Any:
    """``index`` if it has a lexical leg (HYBRID, TEXT_SEARCH)."""
    if not callable(getattr(index, "lexical_search", None)):
        raise ConfigurationError(
            f"modes HYBRID and TEXT_SEARCH need an index with a lexical leg (VectorIndex, MilvusIndex, a server "
            f"collection), not {type(index).__name__}; query it with mode DEFAULT."
        )
    return index


class Restriction:
    """The ids a query was restricted to, checked again on each hit.

    The core filter finds them through the bookkeeping's dotted paths; a record from a snapshot
    written before reserved keys were refused could spoof those paths with a literal key.
    """

    __slots__ = ("doc_ids", "node_ids")

    def __init__(self, node_ids: set[str] | None, doc_ids: set[str] | None) -> None:
        self.node_ids = node_ids
        self.doc_ids = doc_ids

    def allows(self, hit: Hit) -> bool:
        if self.node_ids is not None and hit.id not in self.node_ids:
            return False
        return self.doc_ids is None or _ref_doc_id(hit) in self.doc_ids


def _ref_doc_id(record: Hit | Record) -> Any:
    info = record.metadata.get(NODE_KEY)
    return info.get("ref_doc_id") if isinstance(info, dict) else None


