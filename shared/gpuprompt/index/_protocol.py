"""The one protocol type for "an index": what RAGPipeline, the vector stores and the server need.

:class:`~gpuprompt.VectorIndex` (in process) and :class:`~gpuprompt.index.MilvusIndex` (a Milvus
collection) both satisfy :class:`IndexLike`; code that takes an index takes either and never asks
which. :func:`load_index` reopens whatever :meth:`IndexLike.save` wrote.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpuprompt.errors import ConfigurationError
from gpuprompt.validation import check_path, fail

if TYPE_CHECKING:
    from gpuprompt.index._types import Hit, Record

__all__ = ["IndexLike", "check_index", "load_index"]

_MILVUS_POINTER = "milvus.json"


@runtime_checkable
class IndexLike(Protocol):
    """Vectors with ids, documents and metadata; upsert, filtered search, MMR; sync and async.

    The contract (documented on :class:`~gpuprompt.VectorIndex`): ``add`` upserts; ``search``
    returns ``min(k, matches)`` hits per query, best first, scores higher-is-better by metric;
    filters are :mod:`gpuprompt.index.filters`'s language; bad input raises the typed errors of
    :mod:`gpuprompt.errors` before anything is stored; ``save(path)`` writes what
    :func:`load_index` reopens.
    """

    @property
    def dim(self) -> int: ...

    @property
    def metric(self) -> str: ...

    @property
    def count(self) -> int: ...

    def __len__(self) -> int: ...

    def add(
        self,
        ids: Sequence[str | None] | None,
        vectors: Any,
        documents: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        embedder: str | None = None,
        allow_other_embedder: bool = False,
    ) -> list[str]: ...

    def delete(self, ids: Sequence[str]) -> int: ...

    def clear(self) -> None: ...

    def get(self, ids: Sequence[str]) -> list[Record]: ...

    def ids(self, filter: Mapping[str, Any] | None = None) -> list[str]: ...

    def search(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]: ...

    def mmr(
        self, query: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, filter: Mapping[str, Any] | None = None
    ) -> list[Hit]: ...

    def search_groups(
        self, query: Any, k: int, *, group_by: str | Sequence[str], filter: Mapping[str, Any] | None = None
    ) -> list[Hit]: ...

    async def aadd(
        self,
        ids: Sequence[str | None] | None,
        vectors: Any,
        documents: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        embedder: str | None = None,
        allow_other_embedder: bool = False,
    ) -> list[str]: ...

    async def adelete(self, ids: Sequence[str]) -> int: ...

    async def aclear(self) -> None: ...

    async def aget(self, ids: Sequence[str]) -> list[Record]: ...

    async def aids(self, filter: Mapping[str, Any] | None = None) -> list[str]: ...

    async def asearch(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]: ...

    async def ammr(
        self, query: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, filter: Mapping[str, Any] | None = None
    ) -> list[Hit]: ...

    def save(self, path: str | Path) -> None: ...

    def close(self) -> None: ...


def check_index(value: Any, name: str = "index", *, allow_none: bool = False) -> IndexLike | None:
    """``value`` if it is an index (a VectorIndex, a MilvusIndex or anything satisfying :class:`IndexLike`).

    Raises:
        ConfigurationError: anything else, named.
    """
    if value is None and allow_none:
        return None
    # Looked up statically: on Python 3.11 isinstance() on a runtime Protocol reads properties,
    # and MilvusIndex.count would connect to Milvus.
    if not all(_has(value, member) for member in _MEMBERS):
        expected = "a gpuprompt.VectorIndex, a gpuprompt.MilvusIndex or another IndexLike" + (" or None" if allow_none else "")
        raise fail(name, expected, value, error=ConfigurationError)
    return value


def _has(value: Any, member: str) -> bool:
    try:
        inspect.getattr_static(value, member)
    except AttributeError:
        return False
    return True


_MEMBERS = tuple(sorted(name for name in IndexLike.__dict__ if not name.startswith("_") or name == "__len__"))


def load_index(path: str | Path, device: str = "auto", **options: Any) -> IndexLike:
    """Reopen what an index's ``save(path)`` wrote: a VectorIndex snapshot, or a MilvusIndex pointer.

    Args:
        path: the folder given to ``save``.
        device: where a VectorIndex runs (a MilvusIndex ignores it).
        **options: load options of that index class.

    Raises:
        SnapshotError: nothing loadable at ``path``.
    """
    folder = Path(check_path(path, "path"))
    if (folder / _MILVUS_POINTER).is_file():
        from gpuprompt.index._milvus import MilvusIndex

        return MilvusIndex.load(folder, device, **options)
    from gpuprompt.index._index import VectorIndex

    return VectorIndex.load(folder, device, **options)
