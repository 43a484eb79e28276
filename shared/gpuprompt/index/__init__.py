"""The vector index of gpuprompt: :class:`VectorIndex`, its :class:`IndexConfig`, :class:`Hit`, :class:`Record`.

The filter language lives in :mod:`gpuprompt.index.filters`. Importing this package loads neither
torch nor faiss; a backend is built on first use.
"""

from __future__ import annotations

from gpuprompt.index._config import ANN_THRESHOLD, IndexConfig
from gpuprompt.index._index import VectorIndex
from gpuprompt.index._types import Hit, IndexStats, Record

__all__ = ["ANN_THRESHOLD", "Hit", "IndexConfig", "IndexStats", "Record", "VectorIndex"]
