"""Named in-memory collections: one VectorIndex and one RAGPipeline each, over the shared models.

A collection is created by its first successful upsert. Conversation sessions live in one shared
ContextCache, keyed ``"<collection>/<session id>"`` (collection names cannot hold a ``/``).

Both the number of collections and the records of each are capped (``max_collections``,
``max_collection_records`` in :class:`~gpuprompt.server.ServerConfig`), so one client cannot grow
the server without bound. An index starts no thread until it is first searched (its search batcher
is lazy), and a dropped collection, or one whose first upsert failed, has its index closed.
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
        max_collections: most collections at once (409 ``collection_limit_reached`` beyond).
        max_records: most records per collection (409 ``collection_full`` beyond).
    """

    def __init__(
        self,
        *,
        embedder: Embedder,
        llm: LLMEngine,
        memory: ContextCache,
        device: str,
        rag_k: int,
        max_tokens: int,
        max_collections: int = 64,
        max_records: int = 1_000_000,
    ) -> None:
        self._embedder = embedder
        self._llm = llm
        self.memory = memory
        self._device = device
        self._rag_k = rag_k
        self._max_tokens = max_tokens
        self.max_collections = max_collections
        self.max_records = max_records
        # Written on the event loop and in worker threads, read by the metrics collector.
        self._lock = threading.Lock()
        self._items: dict[str, Collection] = {}
        # Records promised to upserts still embedding, per collection: the cap counts them.
        self._pending: dict[str, int] = {}

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

    def _limit_error(self) -> ApiError:
        return ApiError(
            409,
            f"the server holds its limit of {self.max_collections} collections; delete one with "
            "DELETE /v1/collections/{name}, or start the server with a larger max_collections "
            "(ServerConfig.max_collections).",
            param="name",
            code="collection_limit_reached",
            headers={"x-should-retry": "false"},
        )

    def _full_error(self, name: str, count: int, incoming: int) -> ApiError:
        return ApiError(
            409,
            f"collection {name!r} would pass its limit of {self.max_records} records ({count} stored or being "
            f"added, {incoming} new in this request); delete records, use another collection, or start the "
            "server with a larger max_collection_records (ServerConfig.max_collection_records).",
            param="documents",
            code="collection_full",
            headers={"x-should-retry": "false"},
        )

    async def _collection_for_upsert(self, name: str) -> tuple[Collection, bool]:
        """The collection to upsert into, created (within the cap) if new; and whether it was."""
        with self._lock:
            collection = self._items.get(name)
            if collection is None and len(self._items) >= self.max_collections:
                raise self._limit_error()
        if collection is not None:
            return collection, False
        fresh = await asyncio.to_thread(self._new, name)
        with self._lock:
            # Another request may have created it (or others filled the cap) while this one built its index.
            collection = self._items.get(name)
            if collection is None and len(self._items) < self.max_collections:
                collection = self._items[name] = fresh
        if collection is not fresh:
            fresh.index.close()
            if collection is None:
                raise self._limit_error()
            return collection, False
        return collection, True

    async def _reserve(self, collection: Collection, ids: list[str] | None, n: int) -> int:
        """Promise room for the request's new records under the cap; return how many were promised."""
        name = collection.name
        incoming = len(set(ids)) if ids is not None else n
        with self._lock:
            held = collection.index.count + self._pending.get(name, 0)
        if held + incoming > self.max_records and ids is not None:
            # Near the cap: replaced records take no room, so count only the ids not stored yet.
            known = await collection.index.aget(list(set(ids)))
            incoming -= len(known)
        with self._lock:
            held = collection.index.count + self._pending.get(name, 0)
            if held + incoming > self.max_records:
                raise self._full_error(name, held, incoming)
            self._pending[name] = self._pending.get(name, 0) + incoming
        return incoming

    def _release(self, name: str, promised: int) -> None:
        with self._lock:
            left = self._pending.get(name, 0) - promised
            if left > 0:
                self._pending[name] = left
            else:
                self._pending.pop(name, None)

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
            ApiError: 409 when a new collection would pass ``max_collections`` or the records
                would pass ``max_records``; nothing stored changed.
            InvalidInputError: the index refused the records; nothing stored changed (a new
                collection is not kept).
        """
        collection, created = await self._collection_for_upsert(name)
        try:
            promised = await self._reserve(collection, ids, len(documents))
            try:
                vectors = await self._embedder.aembed_tensor(documents)
                stored = await collection.index.aadd(ids, vectors, documents, metadatas)
            finally:
                self._release(name, promised)
        except BaseException:
            if created:
                self._forget_if_empty(collection)
            raise
        return stored, collection.index.count

    def _forget_if_empty(self, collection: Collection) -> None:
        """Drop a collection created by an upsert that failed, unless others have filled it since."""
        with self._lock:
            if (
                self._items.get(collection.name) is not collection
                or collection.index.count != 0
                or self._pending.get(collection.name, 0) != 0
            ):
                return
            del self._items[collection.name]
        collection.index.close()

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
