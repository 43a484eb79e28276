"""The Milvus target of a bulk job: upserts into a ``gpuprompt.MilvusIndex`` collection.

Milvus keeps every acknowledged write; :meth:`MilvusWriter.commit` flushes the collection and
writes the index's pointer folder (``load_index`` reopens it), then the job records its progress.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprompt.apps.bulk._writers import stale_ids
from gpuprompt.errors import DimensionMismatchError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MilvusWriter"]

DEFAULT_COLLECTION = "gpuprompt"


class MilvusWriter:
    """Writes into a Milvus collection through :class:`gpuprompt.MilvusIndex`.

    For a Milvus Lite file ``kb.db`` the progress file is ``kb.db.<collection>.progress.json`` and
    the pointer folder ``kb.db.<collection>.index`` beside it; for a server URI both go in the
    current folder, named after the host and collection.

    Args:
        uri: ``http://host:19530`` (a server or cluster) or a Milvus Lite ``*.db`` file.
        dim: the embedder's dimension.
        embedder: the embedder's identity, recorded in the collection.
        collection: the collection (default ``"gpuprompt"``), created if missing.
    """

    def __init__(self, uri: str, *, dim: int, embedder: str, collection: str | None = None) -> None:
        from gpuprompt.index import MilvusIndex

        self.uri = uri
        self.collection = collection or DEFAULT_COLLECTION
        self.embedder = embedder
        self.index = MilvusIndex(dim, uri=uri, collection=self.collection)
        if self.index.dim != dim:
            raise DimensionMismatchError(
                f"the Milvus collection {self.collection!r} holds {self.index.dim}-d vectors but the embedder makes "
                f"{dim}-d ones; pick another collection."
            )
        self.existed = self.index.count > 0
        if uri.endswith(".db"):
            base = Path(uri)
            stem = f"{base.name}.{self.collection}"
            folder = base.parent
        else:
            stem = "gpuprompt-bulk-" + re.sub(r"[^A-Za-z0-9._-]+", "_", uri.split("://", 1)[-1]) + f"-{self.collection}"
            folder = Path.cwd()
        self.progress_path = folder / f"{stem}.progress.json"
        self.pointer_path = folder / f"{stem}.index"

    def __repr__(self) -> str:
        return f"<MilvusWriter {self.uri!r} collection={self.collection!r}>"

    def write(
        self, ids: Sequence[str], vectors: np.ndarray, documents: Sequence[str], metadatas: Sequence[Mapping[str, Any]]
    ) -> None:
        self.index.add(list(ids), vectors, documents=list(documents), metadatas=list(metadatas), embedder=self.embedder)

    def stale_ids(self, current: set[str], owned: Callable[[str], bool]) -> list[str]:
        return stale_ids(self.index.ids(), current, owned) if self.existed else []

    def delete(self, ids: Sequence[str]) -> None:
        self.index.delete(list(ids))

    def commit(self) -> None:
        self.index.save(self.pointer_path)  # flushes the collection, then writes the pointer

    def close(self) -> None:
        self.index.close()
