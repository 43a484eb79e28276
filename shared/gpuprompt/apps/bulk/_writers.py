"""Where a bulk job writes: the :class:`BulkWriter` protocol and its targets.

A target takes upserts and, on :meth:`BulkWriter.commit`, makes everything written so far durable;
only then does the job record those shards as done. A ``VectorIndex`` snapshot folder is the
target here; a Milvus collection (``gpuprompt.MilvusIndex``) plugs in the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpuprompt.errors import DimensionMismatchError

if TYPE_CHECKING:
    import numpy as np

    from gpuprompt.index import VectorIndex

__all__ = ["BulkWriter", "SnapshotWriter", "is_milvus_target", "stale_ids"]

_MILVUS_PREFIXES = ("http://", "https://", "tcp://", "unix:")


@runtime_checkable
class BulkWriter(Protocol):
    """A bulk job's target."""

    progress_path: Path
    """Where the job's progress file lives (beside the target)."""

    def write(
        self, ids: Sequence[str], vectors: np.ndarray, documents: Sequence[str], metadatas: Sequence[Mapping[str, Any]]
    ) -> None:
        """Upsert records (an existing id is replaced)."""

    def stale_ids(self, current: set[str], owned: Callable[[str], bool]) -> list[str]:
        """Ids in the target that ``current`` (this input's chunk ids) lacks, of a source that
        ``current`` also has (its text got shorter since an earlier run) or that ``owned`` says this
        input named (a record or file since removed from it)."""

    def delete(self, ids: Sequence[str]) -> None:
        """Delete records by id."""

    def commit(self) -> None:
        """Make every write so far durable (a crash after this loses none of them)."""

    def close(self) -> None:
        """Release the target (after a final :meth:`commit`)."""


class SnapshotWriter:
    """Writes into a :class:`~gpuprompt.VectorIndex` saved as a snapshot folder.

    An existing snapshot at ``path`` is loaded and upserted into; :meth:`commit` saves the whole
    index (write-then-rename, see :meth:`VectorIndex.save`). The progress file is
    ``<path>.progress.json`` beside the folder.

    Args:
        path: the snapshot folder (created on the first commit).
        dim: the embedder's dimension.
        embedder: the embedder's identity, recorded in the index.
    """

    def __init__(self, path: Path, *, dim: int, embedder: str) -> None:
        from gpuprompt.index import VectorIndex

        self.path = path
        self.progress_path = path.with_name(path.name + ".progress.json")
        self.embedder = embedder
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            index = VectorIndex.load(path)
            if index.dim != dim:
                raise DimensionMismatchError(
                    f"the snapshot at '{path}' holds {index.dim}-d vectors but the embedder makes {dim}-d ones; "
                    "write into a new folder or use the embedder that built it."
                )
        else:
            index = VectorIndex(dim)
        self.index: VectorIndex = index
        self.existed = index.count > 0

    def __repr__(self) -> str:
        return f"<SnapshotWriter {str(self.path)!r} count={self.index.count}>"

    def write(
        self, ids: Sequence[str], vectors: np.ndarray, documents: Sequence[str], metadatas: Sequence[Mapping[str, Any]]
    ) -> None:
        self.index.add(list(ids), vectors, documents=list(documents), metadatas=list(metadatas), embedder=self.embedder)

    def stale_ids(self, current: set[str], owned: Callable[[str], bool]) -> list[str]:
        if not self.existed:
            return []
        return stale_ids(self.index.ids(), current, owned)

    def delete(self, ids: Sequence[str]) -> None:
        self.index.delete(list(ids))

    def commit(self) -> None:
        self.index.save(self.path)

    def close(self) -> None:
        self.index.close()


def stale_ids(stored: Sequence[str], current: set[str], owned: Callable[[str], bool]) -> list[str]:
    """The ids in ``stored`` that are not in ``current`` and whose source (the part before the last
    ``#``) has a chunk in ``current`` or is ``owned`` by this input."""
    sources = {chunk_id.rpartition("#")[0] for chunk_id in current}
    stale = []
    for chunk_id in stored:
        if chunk_id in current:
            continue
        source = chunk_id.rpartition("#")[0]
        if source in sources or owned(source):
            stale.append(chunk_id)
    return stale


def is_milvus_target(into: str | os.PathLike[str]) -> bool:
    """Whether ``into`` names a Milvus collection: a server URI or a Milvus Lite ``.db`` file."""
    text = os.fspath(into)
    return text.startswith(_MILVUS_PREFIXES) or text.endswith(".db")
