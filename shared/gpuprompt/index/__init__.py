"""The vector index of gpuprompt: :class:`VectorIndex`, its :class:`Hit` and :class:`Record` types.

The filter language lives in :mod:`gpuprompt.index.filters`. Importing this package loads neither
torch nor faiss; a backend is built on first use.
"""

from __future__ import annotations

from gpuprompt.index._index import ANN_THRESHOLD, IndexStats, VectorIndex
from gpuprompt.index._types import Hit, Record

__all__ = ["ANN_THRESHOLD", "Hit", "IndexStats", "Record", "VectorIndex"]
