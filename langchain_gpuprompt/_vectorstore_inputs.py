"""The LangChain vector store's argument checks and type conversions (texts, ids, metadata,
filters, snapshot paths, hits to Documents): everything is checked before anything is embedded."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import InputTypeError, InvalidInputError, describe
from gpuprompt.validation import (
    MAX_DEPTH,
    check_metadata,
    check_number,
    check_path,
    check_path_name,
    check_real_vector,
    check_str,
    fail,
)
from langchain_core.documents import Document

if TYPE_CHECKING:
    from gpuprompt.index import Hit, Record


__all__ = ["_check_ids", "_faiss_filter", "_check_query", "_check_score_threshold", "_clamp01", "_from_documents", "_hit_document", "_identity", "_listed", "_no_kwargs", "_prepare", "_record_document", "_scored", "_search_kwargs", "_snapshot_path", "_vector"]


def _identity(score: float) -> float:
    return score


def _clamp01(score: float) -> float:
    return min(1.0, max(0.0, score))


def _check_query(query: Any) -> None:
    check_str(query, "query")


def _check_score_threshold(kwargs: dict[str, Any]) -> None:
    if kwargs.get("score_threshold") is not None:
        check_number(kwargs["score_threshold"], "score_threshold")


def _check_ids(ids: Any) -> list[str]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InputTypeError(f"'ids' must be a list of str (got {describe(ids)}).")
    for position, item in enumerate(ids):
        check_str(item, f"ids[{position}]")
    return list(ids)


def _snapshot_path(folder_path: Any, index_name: Any) -> tuple[Path, str]:
    """The snapshot's folder and its plain name inside it (a name with a separator or ``..``
    would put the snapshot, and the files a load reads, outside that folder)."""
    folder = Path(check_path(folder_path, "folder_path", named=False))
    name = check_path_name(index_name, "index_name", fix="Pick a name such as 'index'; pass the folder as folder_path.")
    return folder, name


def _no_kwargs(method: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise InvalidInputError(
            f"GPUPromptVectorStore.{method}() got unexpected keyword argument(s) {sorted(kwargs)}; "
            "see its docstring for the accepted ones."
        )


def _search_kwargs(kwargs: dict[str, Any], filter: Any = None) -> Any:
    """Refuse unknown search keywords; return ``filter`` in the core's language (:func:`_faiss_filter`)."""
    kwargs.pop("fetch_k", None)  # community FAISS compatibility: our pre-filter needs no over-fetch
    if kwargs:
        raise InvalidInputError(
            f"unexpected search keyword argument(s) {sorted(kwargs)}; valid: 'k', 'filter' "
            "(and 'score_threshold' for the relevance-score search)."
        )
    return _faiss_filter(filter)


def _listed(value: Any, name: str, what: str) -> list[Any]:
    """A list from a list, tuple or other iterable; a bare str, bytes or dict is refused."""
    if isinstance(value, (str, bytes)):
        raise fail(
            name,
            f"a list of {what}",
            value,
            fix=f"For one item, wrap it in a list: [{name[:-1]}].",
            error=InputTypeError,
        )
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise fail(name, f"a list of {what}", value, error=InputTypeError)
    try:
        return list(value)
    except TypeError:  # iterable in name only: a 0-d numpy array says it is, then refuses
        raise fail(name, f"a list of {what}", value, error=InputTypeError) from None


def _vector(embedding: Any) -> Any:
    """One query embedding as a ``(1, dim)`` float32 array (the core's strict real-vector check)."""
    return check_real_vector(embedding, "embedding")[None, :]


def _prepare(
    texts: Iterable[str], metadatas: Iterable[dict[str, Any] | None] | None, ids: Iterable[str | None] | None
) -> tuple[list[str], list[dict[str, Any]] | None, list[str | None] | None]:
    """Check every argument of an add before anything is embedded or stored.

    Texts must be well-formed strs; each metadata a JSON dict (or None) -- the detached copy made
    here is what gets stored, so a value changed by the caller later cannot change the store.
    """
    texts = _listed(texts, "texts", "str")
    for position, text in enumerate(texts):
        check_str(text, f"texts[{position}]")
    if metadatas is not None:
        metadatas = _listed(metadatas, "metadatas", "dicts (or None), one per text")
        if len(metadatas) != len(texts):
            raise InvalidInputError(
                f"'metadatas' must have one entry per text ({len(texts)}) (got {len(metadatas)} entries)."
            )
        metadatas = [check_metadata(m, f"metadatas[{position}]") for position, m in enumerate(metadatas)]
    if ids is not None:
        ids = _listed(ids, "ids", "str (or None), one per text")
        if len(ids) != len(texts):
            raise InvalidInputError(
                f"'ids' must be a list with one entry per text ({len(texts)}) (got {len(ids)} entries)."
            )
        for position, key in enumerate(ids):
            if key is not None:
                check_str(key, f"ids[{position}]", allow_empty=False)
    # Checked before embedding so a bad call costs nothing; None ids are generated by the index.
    return texts, metadatas, ids


def _from_documents(documents: list[Document], kwargs: dict[str, Any]) -> tuple[list[str], list[Any], Any]:
    if isinstance(documents, (Document, str, bytes)) or not isinstance(documents, Sequence):
        raise InputTypeError(f"'documents' must be a list of Document (got {describe(documents)}).")
    for position, doc in enumerate(documents):
        if not isinstance(doc, Document):
            raise InputTypeError(f"'documents[{position}]' must be a Document (got {describe(doc)}).")
    ids = kwargs.pop("ids", None)
    if ids is None and any(doc.id is not None for doc in documents):
        ids = [doc.id for doc in documents]
    # The checks (and their messages) are add_texts': texts[i], metadatas[i], ids[i] = documents[i].
    return [doc.page_content for doc in documents], [doc.metadata for doc in documents], ids


def _record_document(record: Record) -> Document:
    return Document(id=record.id, page_content=record.document or "", metadata=dict(record.metadata))


def _hit_document(hit: Hit) -> Document:
    return Document(id=hit.id, page_content=hit.document or "", metadata=dict(hit.metadata))


def _scored(hits: list[Hit]) -> list[tuple[Document, float]]:
    return [(_hit_document(hit), float(hit.score)) for hit in hits]


def _faiss_filter(filter: Any, depth: int = 0) -> Any:
    """LangChain's FAISS reads a field's bare list as one-of (``{"color": ["red", "blue"]}``), and so
    does this store: such a list becomes ``{"$in": [...]}``, at any depth of ``$and`` / ``$or`` /
    ``$not``; FAISS's ``$neq`` is the core's ``$ne``. (The core's own language reads a bare list as equality with the whole list; an explicit
    ``{"$eq": [...]}`` still says that.) Anything else passes as given, for the core to check."""
    if not isinstance(filter, Mapping) or depth > MAX_DEPTH:  # too deep or cyclic: the core refuses it
        return filter
    out: dict[Any, Any] = {}
    for key, value in filter.items():
        if key in ("$and", "$or") and isinstance(value, list):
            out[key] = [_faiss_filter(item, depth + 1) for item in value]
        elif key == "$not":
            out[key] = _faiss_filter(value, depth + 1)
        elif isinstance(key, str) and not key.startswith("$") and isinstance(value, list):
            out[key] = {"$in": value}
        elif isinstance(key, str) and not key.startswith("$") and isinstance(value, Mapping) and "$neq" in value:
            out[key] = {("$ne" if op == "$neq" else op): operand for op, operand in value.items()}  # FAISS's name
        else:
            out[key] = value
    return out

