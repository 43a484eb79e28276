"""The record store behind VectorIndex: dense rows of ids, vectors, documents and metadata.

Rows stay dense (a delete moves the last rows into the holes), so a device matrix can mirror them
row for row. Each write gives records fresh int64 *labels* that never repeat, so an ANN index that
cannot remove (HNSW) can keep a stale entry as a tombstone without it ever aliasing a new record.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Allowed", "Change", "RWLock", "Store", "copy_json"]


class RWLock:
    """Many readers or one writer, phase-fair: neither readers nor writers starve.

    A waiting writer blocks new readers (so a stream of searches cannot starve a write), and when
    a writer releases, every reader waiting at that moment is let in before the next writer (so a
    stream of writes cannot starve a search or a save: two writer threads in a loop once kept
    ``save()`` waiting forever).

    Not re-entrant: a thread must not take it again while holding it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._readers_waiting = 0
        self._phase = 0  # advanced by a writer's release that admits the readers waiting then
        self._admitted = 0  # readers admitted by the last phase that have not entered yet

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            if self._writer or self._writers_waiting:
                phase = self._phase
                self._readers_waiting += 1
                try:
                    while self._phase == phase and (self._writer or self._writers_waiting):
                        self._cond.wait()
                finally:
                    self._readers_waiting -= 1
                    if self._phase != phase:
                        self._admitted -= 1
                        if not self._admitted:
                            self._cond.notify_all()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers or self._admitted:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                if self._readers_waiting:
                    self._phase += 1
                    self._admitted = self._readers_waiting
                self._cond.notify_all()


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, scalars); much faster than copy.deepcopy."""
    if isinstance(value, dict):
        return {key: copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_json(item) for item in value]
    return value


@dataclass
class Change:
    """One write, as the backends see it (computed before anything is changed).

    Attributes:
        rows: rows written (overwritten or appended), ascending within each part.
        labels: the fresh labels of those rows.
        vectors: the new vectors of those rows, float32 as given (not normalised).
        removed_labels: labels that stop existing (overwritten or deleted records).
        move_src: rows moved by a delete (from the tail) ...
        move_dst: ... into these holes.
        size: the row count after the change.
    """

    rows: np.ndarray
    labels: np.ndarray
    vectors: np.ndarray
    removed_labels: np.ndarray
    move_src: np.ndarray
    move_dst: np.ndarray
    size: int


@dataclass
class Allowed:
    """The rows a filter selects, evaluated at one store version; backends cache derived forms.

    Attributes:
        mask: bool per row.
        rows: the selected rows, ascending.
        derived: backend-specific caches (a device mask, a label bitmap), keyed by name.
    """

    mask: np.ndarray
    rows: np.ndarray
    derived: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        """How many rows the filter selects."""
        return int(self.rows.shape[0])


_EMPTY_I64 = np.empty(0, dtype=np.int64)


class Store:
    """Ids, vectors (float32 master copy), documents and metadata, in dense rows.

    Not thread-safe by itself: :class:`VectorIndex` guards it with an :class:`RWLock`.

    Args:
        dim: vector dimension.
    """

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.size = 0
        self._vectors = np.empty((0, dim), dtype=np.float32)
        self._labels = np.empty(0, dtype=np.int64)
        self.ids: list[str] = []
        self.documents: list[str | None] = []
        self.metadatas: list[dict[str, Any]] = []
        self.row_of: dict[str, int] = {}
        self.row_of_label: dict[int, int] = {}
        self.next_label = 0
        self.version = 0

    # ------------------------------------------------------------------ views
    @property
    def vectors(self) -> np.ndarray:
        """The live vectors, ``(size, dim)`` float32 (a view: do not modify)."""
        return self._vectors[: self.size]

    @property
    def labels(self) -> np.ndarray:
        """The live rows' labels, ``(size,)`` int64 (a view: do not modify)."""
        return self._labels[: self.size]

    def rows_for_labels(self, labels: np.ndarray) -> np.ndarray:
        """Map labels to rows; -1 for labels that are gone (tombstones) or padding."""
        get = self.row_of_label.get
        return np.fromiter(
            (get(int(label), -1) for label in labels.ravel()), dtype=np.int64, count=labels.size
        ).reshape(labels.shape)

    # ------------------------------------------------------------------ planning (no change yet)
    def plan_upsert(self, ids: list[str], vectors: np.ndarray) -> Change:
        """Plan writing ``vectors`` under ``ids`` (unique). Existing ids keep their row."""
        rows = np.empty(len(ids), dtype=np.int64)
        removed: list[int] = []
        appended = 0
        for i, key in enumerate(ids):
            row = self.row_of.get(key)
            if row is None:
                row = self.size + appended
                appended += 1
            else:
                removed.append(int(self._labels[row]))
            rows[i] = row
        labels = np.arange(self.next_label, self.next_label + len(ids), dtype=np.int64)
        return Change(
            rows=rows,
            labels=labels,
            vectors=vectors,
            removed_labels=np.asarray(removed, dtype=np.int64),
            move_src=_EMPTY_I64,
            move_dst=_EMPTY_I64,
            size=self.size + appended,
        )

    def plan_delete(self, ids: list[str]) -> Change:
        """Plan deleting ``ids`` (missing ids are ignored)."""
        doomed = np.asarray(sorted({self.row_of[key] for key in ids if key in self.row_of}), dtype=np.int64)
        size = self.size - doomed.shape[0]
        holes = doomed[doomed < size]
        tail = np.arange(size, self.size, dtype=np.int64)
        movers = tail[~np.isin(tail, doomed)]
        return Change(
            rows=_EMPTY_I64,
            labels=_EMPTY_I64,
            vectors=np.empty((0, self.dim), dtype=np.float32),
            removed_labels=self._labels[doomed].copy(),
            move_src=movers,
            move_dst=holes,
            size=size,
        )

    def reserve(self, size: int) -> None:
        """Grow the arrays to hold ``size`` rows (by doubling); the only step of a write that allocates."""
        capacity = self._vectors.shape[0]
        if size <= capacity:
            return
        grown = max(size, capacity * 2, 1024)
        vectors = np.empty((grown, self.dim), dtype=np.float32)
        vectors[: self.size] = self._vectors[: self.size]
        labels = np.empty(grown, dtype=np.int64)
        labels[: self.size] = self._labels[: self.size]
        self._vectors, self._labels = vectors, labels

    # ------------------------------------------------------------------ applying
    def apply_upsert(
        self,
        change: Change,
        ids: list[str],
        documents: list[str | None],
        metadatas: list[dict[str, Any]],
    ) -> None:
        """Apply a planned upsert (call :meth:`reserve` first)."""
        self.reserve(change.size)
        for key, row, label in zip(ids, change.rows.tolist(), change.labels.tolist()):
            old = self.row_of.get(key)
            if old is not None:
                del self.row_of_label[int(self._labels[old])]
            self.row_of[key] = row
            self.row_of_label[label] = row
        grow = change.size - self.size
        if grow:
            self.ids.extend([""] * grow)
            self.documents.extend([None] * grow)
            self.metadatas.extend([{}] * grow)
        for key, row, document, metadata in zip(ids, change.rows.tolist(), documents, metadatas):
            self.ids[row] = key
            self.documents[row] = document
            self.metadatas[row] = metadata
        self._vectors[change.rows] = change.vectors
        self._labels[change.rows] = change.labels
        self.size = change.size
        self.next_label += len(ids)
        self.version += 1

    def apply_delete(self, change: Change) -> None:
        """Apply a planned delete."""
        for label in change.removed_labels.tolist():
            row = self.row_of_label.pop(label)
            del self.row_of[self.ids[row]]
        for src, dst in zip(change.move_src.tolist(), change.move_dst.tolist()):
            key = self.ids[src]
            self.ids[dst] = key
            self.documents[dst] = self.documents[src]
            self.metadatas[dst] = self.metadatas[src]
            self.row_of[key] = dst
            self.row_of_label[int(self._labels[src])] = dst
        if change.move_src.size:
            self._vectors[change.move_dst] = self._vectors[change.move_src]
            self._labels[change.move_dst] = self._labels[change.move_src]
        del self.ids[change.size :]
        del self.documents[change.size :]
        del self.metadatas[change.size :]
        self.size = change.size
        self.version += 1

    def clear(self) -> None:
        """Drop every record (labels keep counting up)."""
        self.size = 0
        self._vectors = np.empty((0, self.dim), dtype=np.float32)
        self._labels = np.empty(0, dtype=np.int64)
        self.ids, self.documents, self.metadatas = [], [], []
        self.row_of, self.row_of_label = {}, {}
        self.version += 1

    def load(
        self,
        vectors: np.ndarray,
        labels: np.ndarray,
        ids: list[str],
        documents: list[str | None],
        metadatas: list[dict[str, Any]],
        next_label: int,
    ) -> None:
        """Replace the contents wholesale (used by snapshot loading)."""
        self._vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self._labels = np.ascontiguousarray(labels, dtype=np.int64)
        self.size = len(ids)
        self.ids, self.documents, self.metadatas = ids, documents, metadatas
        self.row_of = {key: row for row, key in enumerate(ids)}
        self.row_of_label = {int(label): row for row, label in enumerate(self._labels.tolist())}
        self.next_label = next_label
        self.version += 1
