"""Named collections: one index and one RAGPipeline each, over the shared models.

An index is an in-memory :class:`~gpuprompt.VectorIndex` by default, or a
:class:`~gpuprompt.MilvusIndex` in the Milvus deployment named by ``vector_uri`` (``gpuprompt
serve --vector-uri``): then each collection is the Milvus collection ``gpuprompt_c_<name>`` (the
name escaped to Milvus's alphabet), its records outlive the server, and a restarted server finds
its collections again. A collection is created by its first successful upsert. Conversation sessions live in one shared
ContextCache, keyed ``"<collection>/<session id>"`` (collection names cannot hold a ``/``).

Both the number of collections and the records of each are capped (``max_collections``,
``max_collection_records`` in :class:`~gpuprompt.server.ServerConfig`), so one client cannot grow
the server without bound. An index starts no thread until it is first searched (its search batcher
is lazy), and a dropped collection, or one whose first upsert failed, has its index closed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuprompt.server._errors import ApiError

logger = logging.getLogger("gpuprompt.server")

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache
    from gpuprompt.embedder import Embedder
    from gpuprompt.index import IndexLike
    from gpuprompt.llm import LLMEngine
    from gpuprompt.pipeline import RAGPipeline

__all__ = ["COLLECTION_NAME_PATTERN", "MILVUS_PREFIX", "Collection", "Collections", "milvus_collection", "server_name"]

COLLECTION_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""Collection names: 1-64 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or digit."""

MILVUS_PREFIX = "gpuprompt_c_"
"""The prefix of the Milvus collections that hold a server's collections."""
_ESCAPES = {"_": "_u", ".": "_d", "-": "_h"}
_UNESCAPES = {v[1]: k for k, v in _ESCAPES.items()}


def milvus_collection(name: str) -> str:
    """The Milvus collection of server collection ``name`` (reversible: see :func:`server_name`)."""
    return MILVUS_PREFIX + "".join(_ESCAPES.get(c, c) for c in name)


def server_name(milvus_name: str) -> str | None:
    """The server collection held by Milvus collection ``milvus_name``; None if it holds none."""
    if not milvus_name.startswith(MILVUS_PREFIX):
        return None
    out, chars = [], iter(milvus_name[len(MILVUS_PREFIX) :])
    for c in chars:
        if c == "_":
            c = _UNESCAPES.get(next(chars, ""), "")
            if not c:
                return None
        out.append(c)
    name = "".join(out)
    return name if re.match(COLLECTION_NAME_PATTERN, name) else None


@dataclass
class Collection:
    """One collection: its index and its RAG pipeline."""

    name: str
    index: IndexLike
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
        vector_uri: None (in-memory indexes), or a Milvus URI (a Milvus Lite ``.db`` file or
            ``http://host:19530``) that holds every collection.
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
        vector_uri: str | None = None,
    ) -> None:
        self._embedder = embedder
        self.vector_uri = vector_uri
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

    def indexes(self) -> dict[str, IndexLike]:
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

    def restore(self) -> list[str]:
        """Find the collections a previous server left in ``vector_uri`` (none when in memory).

        Returns:
            The names found, in order (at most ``max_collections``; others are left untouched
            and a warning names them).
        """
        if self.vector_uri is None:
            return []
        from gpuprompt.index._milvus_schema import import_pymilvus

        client = import_pymilvus().MilvusClient(uri=self.vector_uri)
        try:
            names = sorted(n for n in map(server_name, client.list_collections()) if n is not None)
        finally:
            client.close()
        kept = names[: self.max_collections]
        if len(kept) < len(names):
            logger.warning("%s holds %d collections, over max_collections=%d; not serving %s",
                           self.vector_uri, len(names), self.max_collections, names[len(kept) :])
        with self._lock:
            for name in kept:
                self._items.setdefault(name, self._new(name))
        return kept

    def _new(self, name: str) -> Collection:
        from gpuprompt.pipeline import RAGPipeline

        index: IndexLike
        if self.vector_uri is None:
            from gpuprompt.index import VectorIndex

            index = VectorIndex(self._embedder.dim, metric="cosine", device=self._device)
        else:
            from gpuprompt.index import MilvusIndex

            # Connects lazily: building one opens nothing until its first use.
            index = MilvusIndex(self._embedder.dim, metric="cosine", uri=self.vector_uri,
                                collection=milvus_collection(name))
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
                stored = await collection.index.aadd(
                    ids, vectors, documents, metadatas, embedder=self._embedder.identity
                )
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
        _discard(collection.index)

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
        _discard(collection.index)

    def close(self) -> None:
        """Close every index."""
        with self._lock:
            items = list(self._items.values())
            self._items.clear()
        for collection in items:
            collection.index.close()


def _discard(index: IndexLike) -> None:
    """Delete a dropped collection's records where they outlive the index (Milvus), and close it."""
    drop = getattr(index, "drop", None)
    if callable(drop):
        drop()
    else:
        index.close()
