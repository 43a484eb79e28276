"""The vector indexes of gpuprompt: :class:`VectorIndex` (in process) and :class:`MilvusIndex` (a Milvus
collection), both :class:`IndexLike`; :class:`IndexConfig`, :class:`Hit`, :class:`Record`.

The filter language lives in :mod:`gpuprompt.index.filters`. Importing this package loads neither
torch, faiss nor pymilvus; a backend is built (and pymilvus imported) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuprompt.index._config import ANN_THRESHOLD, IndexConfig
from gpuprompt.index._index import VectorIndex
from gpuprompt.index._protocol import IndexLike, check_index, load_index
from gpuprompt.index._types import Hit, IndexStats, Record

if TYPE_CHECKING:
    from gpuprompt.index._milvus import MilvusIndex

__all__ = [
    "ANN_THRESHOLD",
    "Hit",
    "IndexConfig",
    "IndexLike",
    "IndexStats",
    "MilvusIndex",
    "Record",
    "VectorIndex",
    "check_index",
    "load_index",
]


def __getattr__(name: str) -> Any:
    if name == "MilvusIndex":  # its module is light, but keep the import of pymilvus's user lazy
        from gpuprompt.index._milvus import MilvusIndex

        globals()["MilvusIndex"] = MilvusIndex
        return MilvusIndex
    raise AttributeError(f"module 'gpuprompt.index' has no attribute {name!r}")
