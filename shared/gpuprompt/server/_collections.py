"""Named in-memory collections: one VectorIndex and one RAGPipeline each, over the shared models.

A collection is created by its first successful upsert. Conversation sessions live in one shared
ContextCache, keyed ``"<collection>/<session id>"`` (collection names cannot hold a ``/``).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuprompt.server._errors import ApiError

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache
    from gpuprompt.embedder import Embedder
    from gpuprompt.index import VectorIndex
    from gpuprompt.llm import LLMEngine
    from gpuprompt.pipeline import RAGPipeline

__all__ = ["COLLECTION_NAME_PATTERN", "Collection", "Collections"]

COLLECTION_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""Collection names: 1-64 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or digit."""


@dataclass
class Collection:
    """One collection: its index and its RAG pipeline."""

    name: str
    index: VectorIndex
    rag: RAGPipeline

    def session_key(self, session_id: str) -> str:
        """The ContextCache key of a client's session in this collection."""
        return f"{self.name}/{session_id}"


class Collections:
    """The server's collections.

    Args:
        embedder: embeds documents and questions.
        llm: answers collection chat.
        memory: the shared conversation memory.
        device: the device of new indexes.
        rag_k: documents retrieved per question.
        max_tokens: the default answer length of collection chat.
    """

    def __init__(
        self, *, embedder: Embedder, llm: LLMEngine, memory: ContextCache, device: str, rag_k: int, max_tokens: int
    ) -> None:
        self._embedder = embedder
        self._llm = llm
        self.memory = memory
        self._device = device
        self._rag_k = rag_k
        self._max_tokens = max_tokens
        # Written on the event loop, read by the metrics collector on another thread.
        self._lock = threading.Lock()
        self._items: dict[str, Collection] = {}

    def __len__(self) -> int:
        return len(self._items)

    def indexes(self) -> dict[str, VectorIndex]:
        """``{name: index}`` of every collection."""
        with self._lock:
            return {name: c.index for name, c in self._items.items()}

    def get(self, name: str) -> Collection:
        """The collection called ``name``.

        Raises:
            ApiError: 404 when there is none.
        """
        with self._lock:
            collection = self._items.get(name)
        if collection is None:
            raise ApiError(
                404,
                f"collection {name!r} does not exist; create it by adding documents with "
                f"POST /v1/collections/{name}/documents (GET /v1/collections lists them).",
                param="name",
                code="collection_not_found",
            )
        return collection

    def _new(self, name: str) -> Collection:
        from gpuprompt.index import VectorIndex
        from gpuprompt.pipeline import RAGPipeline

        index = VectorIndex(self._embedder.dim, metric="cosine", device=self._device)
        rag = RAGPipeline(
            index, self._llm, embedder=self._embedder, memory=self.memory, k=self._rag_k, max_tokens=self._max_tokens
        )
        return Collection(name, index, rag)

    async def upsert(
        self,
        name: str,
        documents: list[str],
        ids: list[str] | None,
        metadatas: list[dict[str, Any] | None] | None,
    ) -> tuple[list[str], int]:
        """Embed ``documents`` and upsert them into ``name`` (created if new).

        Returns:
            ``(ids, count)``: the records' ids in request order and the collection's new size.

        Raises:
            InvalidInputError: the index refused the records; nothing stored changed (a new
                collection is not kept).
        """
        with self._lock:
            collection = self._items.get(name)
        created = collection is None
        if collection is None:
            fresh = await asyncio.to_thread(self._new, name)
            with self._lock:
                # Another request may have created it while this one built its index.
                collection = self._items.setdefault(name, fresh)
            created = collection is fresh
        try:
            vectors = await self._embedder.aembed_tensor(documents)
            stored = await asyncio.to_thread(collection.index.add, ids, vectors, documents, metadatas)
        except BaseException:
            if created:
                with self._lock:
                    if self._items.get(name) is collection and collection.index.count == 0:
                        del self._items[name]
            raise
        return stored, collection.index.count

    def drop(self, name: str) -> None:
        """Forget collection ``name`` and its sessions.

        Raises:
            ApiError: 404 when there is none.
        """
        collection = self.get(name)
        with self._lock:
            if self._items.get(name) is collection:
                del self._items[name]
        prefix = f"{name}/"
        for key in self.memory.sessions():
            if key.startswith(prefix):
                self.memory.clear(key)
        collection.index.close()

    def close(self) -> None:
        """Close every index."""
        with self._lock:
            items = list(self._items.values())
            self._items.clear()
        for collection in items:
            collection.index.close()
