"""The result types of :class:`~gpuprompt.VectorIndex`: a search ``Hit``, a stored ``Record``, ``IndexStats``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuprompt.batching import BatcherStats

__all__ = ["Hit", "IndexStats", "Record"]


@dataclass(frozen=True)
class Hit:
    """One search result.

    Attributes:
        id: the record's id.
        score: higher is better for every metric: cosine similarity in [-1, 1] for ``"cosine"``,
            the inner product for ``"ip"``, ``1 / (1 + squared L2 distance)`` in (0, 1] for ``"l2"``.
        document: the record's text, or None.
        metadata: a copy of the record's metadata (changing it changes nothing stored).
    """

    id: str
    score: float
    document: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        doc = self.document if self.document is None or len(self.document) <= 40 else self.document[:37] + "..."
        return f"Hit(id={self.id!r}, score={self.score:.4f}, document={doc!r})"


@dataclass(frozen=True, eq=False)
class Record:
    """One stored record, as returned by :meth:`VectorIndex.get`.

    Attributes:
        id: the record's id.
        vector: a float32 copy of the vector as it was added (not normalised).
        document: the record's text, or None.
        metadata: a copy of the record's metadata.
    """

    id: str
    vector: np.ndarray
    document: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (
            self.id == other.id
            and self.document == other.document
            and self.metadata == other.metadata
            and np.array_equal(self.vector, other.vector)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Record(id={self.id!r}, dim={self.vector.shape[-1]}, document={self.document!r})"


@dataclass(frozen=True)
class IndexStats:
    """Counters of a :class:`VectorIndex`.

    Attributes:
        count: live records.
        tombstones: stale entries still inside an ANN index (removed at the next compaction).
        backend: the backend in use, for example ``"torch:cpu:float32"`` or ``"faiss:HNSW32:cpu"``.
        batcher: the search queue's counters (mean batch size shows how much searches coalesce).
    """

    count: int
    tombstones: int
    backend: str | None
    batcher: BatcherStats
