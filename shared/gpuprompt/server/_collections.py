"""Named collections: one index and one RAGPipeline each, over the shared models.

An index is an in-memory :class:`~gpuprompt.VectorIndex` by default, or a
:class:`~gpuprompt.MilvusIndex` in the Milvus deployment named by ``vector_uri`` (``gpuprompt
serve --vector-uri``): then each collection is the Milvus collection ``gpuprompt_c_<name>`` (the
name escaped to Milvus's alphabet), its records outlive the server, and a restarted server finds
its collections again. With ``data_dir`` (``gpuprompt serve --data-dir``) the in-memory indexes
outlive the process instead: every write is logged and fsynced before it is applied and
acknowledged, and snapshots are checkpointed (:mod:`gpuprompt.index.durable`). A collection is
created by its first successful upsert. Conversation sessions live in one shared ContextCache,
keyed ``"<collection>/<session id>"`` (collection names cannot hold a ``/``).

Both the number of collections and the records of each are capped (``max_collections``,
``max_collection_records`` in :class:`~gpuprompt.server.ServerConfig`), so one client cannot grow
the server without bound. An index starts no thread until it is first searched (its search batcher
is lazy), and a dropped collection, or one whose first upsert failed, has its index closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from gpuprompt.bridge import off_loop
from gpuprompt.errors import ConfigurationError
from gpuprompt.index.durable import CollectionDropped, DataDir, encode_delete, encode_upsert, purge
from gpuprompt.server.errors import ApiError
from gpuprompt.wire import COLLECTION_NAME_PATTERN

logger = logging.getLogger("gpuprompt.server")

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache
    from gpuprompt.embed import Embedder
    from gpuprompt.index import IndexLike
    from gpuprompt.llm import LLMEngine
    from gpuprompt.rag import RAGPipeline

T = TypeVar("T")
from gpuprompt.server._collection import (
    MILVUS_PREFIX,
    Collection,
    _discard,
    _serve_flags_for,
    milvus_collection,
    recorded_embedder,
    server_name,
)

__all__ = [
    "COLLECTION_NAME_PATTERN",
    "MILVUS_PREFIX",
    "Collection",
    "Collections",
    "milvus_collection",
    "recorded_embedder",
    "server_name",
]


_DROP_RETRIES = 3  # an upsert that keeps meeting a collection being dropped gives up after this many tries


class Collections:
    """The server's collections.

    Args:
        embedder: embeds documents and questions.
        llm: answers collection chat (None: the server serves no chat model, and a collection has no
            RAG pipeline).
        memory: the shared conversation memory.
        device: the device of new indexes.
        rag_k: documents retrieved per question.
        max_tokens: the default answer length of collection chat.
        max_collections: most collections at once (409 ``collection_limit_reached`` beyond).
        max_records: most records per collection (409 ``collection_full`` beyond).
        vector_uri: None (in-memory indexes), or a Milvus URI (a Milvus Lite ``.db`` file or
            ``http://host:19530``) that holds every collection.
        data_dir: None, or a folder where the in-memory indexes are logged and snapshotted so
            they outlive the process (not with ``vector_uri``).
        checkpoint_every: acknowledged writes of one collection between two snapshots (with ``data_dir``).
        reranker: reorders a collection chat's candidates (``--rerank-model``), or None.
        rag_fetch_k: candidates a chat retrieves for the reranker (None: the pipeline's default).

    Raises:
        ConfigurationError: both ``vector_uri`` and ``data_dir``.
    """

    def __init__(
        self,
        *,
        embedder: Embedder,
        llm: LLMEngine | None,
        memory: ContextCache,
        device: str,
        rag_k: int,
        max_tokens: int,
        max_collections: int = 64,
        max_records: int = 1_000_000,
        vector_uri: str | None = None,
        data_dir: str | None = None,
        checkpoint_every: int = 1000,
        reranker: Any = None,
        rag_fetch_k: int | None = None,
    ) -> None:
        if vector_uri is not None and data_dir is not None:
            raise ConfigurationError(
                "'data_dir' and 'vector_uri' must not both be set: collections live either in Milvus "
                "(--vector-uri) or in this server's memory backed by a data dir (--data-dir); drop one of the two."
            )
        self._embedder = embedder
        self.vector_uri = vector_uri
        self._llm = llm
        self.memory = memory
        self._device = device
        self._rag_k = rag_k
        self._reranker = reranker
        self._rag_fetch_k = rag_fetch_k if reranker is not None else None
        self._max_tokens = max_tokens
        self.max_collections = max_collections
        self.max_records = max_records
        # Written on the event loop and in worker threads, read by the metrics collector.
        self._lock = threading.Lock()
        self._items: dict[str, Collection] = {}
        # Records promised to upserts still embedding, per collection: the cap counts them.
        self._pending: dict[str, int] = {}
        self.data_dir = None if data_dir is None else DataDir(data_dir, checkpoint_every=checkpoint_every)
        """The data dir that keeps the collections (None: they live in memory or in Milvus)."""

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
        if collection is None and self.vector_uri is not None:
            collection = self._adopt(name)
        if collection is None:
            raise self._not_found(name)
        return collection

    def _adopt(self, name: str) -> Collection | None:
        """A collection another replica sharing ``vector_uri`` created since this one started, or None."""
        from gpuprompt.index._milvus_schema import open_client

        client = open_client(self.vector_uri)
        try:
            exists = client.has_collection(milvus_collection(name))
        finally:
            client.close()
        if not exists:
            return None
        with self._lock:
            if name not in self._items and len(self._items) < self.max_collections:
                self._items[name] = self._new(name)
            return self._items.get(name)

    async def count(self, collection: Collection) -> int:
        """The collection's record count, read off the event loop (a Milvus count is a query)."""
        return await off_loop(lambda: collection.index.count)

    def counts(self) -> list[tuple[str, int]]:
        """``(name, count)`` of every collection, by name (blocking). A collection whose index cannot be
        counted (its Milvus collection dropped by another replica, a server gone) is left out, with a warning."""
        out = []
        for name, index in sorted(self.indexes().items()):
            try:
                out.append((name, index.count))
            except Exception as exc:  # noqa: BLE001 - one broken collection must not hide the others
                logger.warning("collection %r cannot be counted (%s: %s); not listed", name, type(exc).__name__, exc)
        return out

    @staticmethod
    def _not_found(name: str) -> ApiError:
        return ApiError(
            404,
            f"collection {name!r} does not exist; create it by adding documents with "
            f"POST /v1/collections/{name}/documents (GET /v1/collections lists them).",
            param="name",
            code="collection_not_found",
        )

    def open_data_dir(self) -> None:
        """Take the data dir's lock (no-op without one); call before :meth:`restore`.

        Raises:
            ConfigurationError: another live server holds the data dir, or it cannot be created.
        """
        if self.data_dir is not None:
            self.data_dir.acquire()

    def restore(self) -> list[str]:
        """Find the collections a previous server left in ``vector_uri`` or ``data_dir`` (none when in memory).

        Returns:
            The names found, in order. From Milvus at most ``max_collections`` (others are left
            untouched and a warning names them); from a data dir all of them (a warning says when
            they pass ``max_collections``: no more can be created until some are dropped).

        Raises:
            SnapshotError: a damaged snapshot or log record in the data dir (the message names the file).
            ConfigurationError: a data dir collection was embedded by another model than the served one.
        """
        if self.data_dir is not None:
            return self._restore_data_dir(self.data_dir)
        if self.vector_uri is None:
            return []
        from gpuprompt.index._milvus_schema import open_client

        client = open_client(self.vector_uri)
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

    def _restore_data_dir(self, data_dir: DataDir) -> list[str]:
        logs = data_dir.recover(self._new_index, self._device)
        try:
            served = self._embedder.identity
            for name, log in logs.items():
                recorded = log.index.config.embedder
                if recorded is not None and recorded != served:
                    raise ConfigurationError(
                        f"collection {name!r} in data dir {str(data_dir.path)!r} holds vectors of embedding model "
                        f"{recorded!r}, but this server embeds with {served!r}; start it with the settings that "
                        f"built them ({_serve_flags_for(recorded)}), or use another --data-dir."
                    )
            try:
                # Fresh snapshots, so the next start replays only what is written from now on.
                data_dir.checkpoint_all(list(logs.values()))
            except OSError as exc:
                raise ConfigurationError(
                    f"'data_dir' must be a folder this server can write: saving the recovered collections in "
                    f"{str(data_dir.path)!r} failed ({exc}); free disk space or fix its permissions."
                ) from exc
        except BaseException:
            for log in logs.values():
                log.close()
                log.index.close()
            raise
        with self._lock:
            for name, log in logs.items():
                self._items[name] = Collection(name, log.index, self._rag(log.index), log)
        if len(logs) > self.max_collections:
            logger.warning("%s holds %d collections, over max_collections=%d: serving them all, but no new one "
                           "can be created until some are deleted", data_dir.path, len(logs), self.max_collections)
        return list(logs)

    def _new_index(self) -> Any:
        from gpuprompt.index import VectorIndex

        return VectorIndex(self._embedder.dim, metric="cosine", device=self._device)

    def _rag(self, index: IndexLike) -> RAGPipeline | None:
        from gpuprompt.rag import RAGPipeline

        if self._llm is None:  # --chat-model none: search and records only
            return None
        return RAGPipeline(
            index, self._llm, embedder=self._embedder, memory=self.memory, k=self._rag_k, max_tokens=self._max_tokens,
            reranker=self._reranker, fetch_k=self._rag_fetch_k,
        )

    def _new(self, name: str) -> Collection:
        index: IndexLike
        if self.vector_uri is None:
            index = self._new_index()
        else:
            from gpuprompt.index import MilvusIndex

            # Connects lazily: building one opens nothing until its first use.
            index = MilvusIndex(self._embedder.dim, metric="cosine", uri=self.vector_uri,
                                collection=milvus_collection(name))
        # A data dir log does no I/O until the first write: a collection built and then discarded leaves nothing.
        log = None if self.data_dir is None else self.data_dir.new_log(name, index)  # type: ignore[arg-type]
        return Collection(name, index, self._rag(index), log)

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
        stored = await self.count(collection)
        with self._lock:
            held = stored + self._pending.get(name, 0)
        if held + incoming > self.max_records and ids is not None:
            # Near the cap: replaced records take no room, so count only the ids not stored yet.
            known = await collection.index.aget(list(set(ids)))
            incoming -= len(known)
            stored = await self.count(collection)
        with self._lock:
            held = stored + self._pending.get(name, 0)
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

        async def embed(collection: Collection) -> tuple[Any, str | None]:
            return await self._embedder.aembed_tensor(documents), self._embedder.identity

        return await self._upsert(name, ids, len(documents), embed, documents, metadatas)

    async def upsert_vectors(
        self,
        name: str,
        ids: list[str],
        vectors: Any,
        documents: list[str | None] | None,
        metadatas: list[dict[str, Any] | None] | None,
        *,
        embedder: str | None,
        allow_other_embedder: bool = False,
    ) -> tuple[list[str], int]:
        """Upsert records whose vectors a client computed (the raw-index routes of ``_records.py``).

        The same caps, creation and data dir logging as :meth:`upsert`. A collection belongs to the
        served embedder: its recorded embedder is the one that made its vectors, or the server's
        own before any add named one. Vectors of another ``embedder`` are refused
        (``EmbedderMismatchError``) unless ``allow_other_embedder``, and then never recorded, so
        the collection (and a replay of its log) keeps the served embedder's record.

        Args:
            name: the collection (created if new).
            ids: one distinct id per vector.
            vectors: ``(len(ids), dim)`` float32.
            documents: one text or None per vector, or None.
            metadatas: one JSON object or None per vector, or None.
            embedder: the identity of the embedder that made ``vectors``, or None (unknown).
            allow_other_embedder: store vectors of another embedder anyway.

        Returns:
            ``(ids, count)``: the ids and the collection's new size.

        Raises:
            ApiError: 409 as :meth:`upsert`.
            EmbedderMismatchError: ``embedder`` is not the collection's; nothing stored changed.
            InvalidInputError, DimensionMismatchError: the index refused the records; nothing changed.
        """

        async def given(collection: Collection) -> tuple[Any, str | None]:
            return vectors, await self._vector_embedder(collection, embedder, allow_other_embedder)

        return await self._upsert(name, ids, len(ids), given, documents, metadatas)

    async def _vector_embedder(self, collection: Collection, embedder: str | None, allow_other: bool) -> str | None:
        """The embedder to record for a client's vectors (see :meth:`upsert_vectors`)."""
        if embedder is None:
            return None
        served = await off_loop(lambda: self._embedder.identity)
        if embedder == served:
            return embedder  # the index records it, or refuses it against another record
        recorded = await off_loop(recorded_embedder, collection.index)
        if embedder == recorded:
            return embedder
        if allow_other:
            return None
        from gpuprompt.errors import EmbedderMismatchError

        expected = recorded or served
        holds = (f"collection {collection.name!r} holds vectors from embedder {expected!r}" if recorded else
                 f"this server embeds with {expected!r} (collection {collection.name!r} records no embedder yet)")
        raise EmbedderMismatchError(
            f"{holds}; vectors from {embedder!r} are in another space and would rank wrongly. Embed with the "
            "server's model (GET /v1/models), or pass allow_other_embedder=True if mixing is intended.",
            expected=expected,
            got=embedder,
        )

    async def _upsert(
        self,
        name: str,
        ids: list[str] | None,
        incoming: int,
        vectors_for: Callable[[Collection], Awaitable[tuple[Any, str | None]]],
        documents: list[str] | list[str | None] | None,
        metadatas: list[dict[str, Any] | None] | None,
    ) -> tuple[list[str], int]:
        """Upsert ``incoming`` records into ``name`` (created if new) within the caps, logged first
        under a data dir; ``vectors_for`` gives their vectors and embedder identity, computed once."""
        made: tuple[Any, str | None] | None = None
        for _ in range(_DROP_RETRIES):
            collection, created = await self._collection_for_upsert(name)
            try:
                promised = await self._reserve(collection, ids, incoming)
                try:
                    if made is None:
                        made = await vectors_for(collection)
                    vectors, identity = made
                    stored = await self._add(collection, ids, vectors, documents, metadatas, identity)
                finally:
                    self._release(name, promised)
            except CollectionDropped:
                continue  # dropped under this request: the upsert comes after the drop, so it recreates it
            except BaseException:
                if created:
                    self._forget_if_empty(collection)
                raise
            return stored, await self.count(collection)
        raise ApiError(
            409,
            f"collection {name!r} was deleted {_DROP_RETRIES} times while these records were being added; "
            "nothing was stored: retry once it is no longer being deleted.",
            param="name",
            code="collection_deleted",
        )

    async def _add(
        self,
        collection: Collection,
        ids: list[str] | None,
        vectors: Any,
        documents: list[str] | list[str | None] | None,
        metadatas: list[dict[str, Any] | None] | None,
        identity: str | None,
    ) -> list[str]:
        """Upsert embedded records into a collection: logged first when it has a log."""
        log = collection.log
        if log is None:
            return await collection.index.aadd(ids, vectors, documents, metadatas, embedder=identity)
        # The ids are fixed before logging, so a replay generates none of its own.
        fixed = list(ids) if ids is not None else [uuid.uuid4().hex for _ in range(len(vectors))]

        def write() -> tuple[list[str], bool]:
            host = vectors.detach().cpu().float().numpy() if hasattr(vectors, "detach") else vectors
            record = encode_upsert(fixed, host, documents, metadatas, identity)
            index = collection.index
            return log.write(record, lambda: index.add(fixed, host, documents, metadatas, embedder=identity))

        return await self._logged(collection, write)

    async def delete(self, name: str, ids: list[str]) -> tuple[int, int]:
        """Delete records of ``name`` by id (unknown ids are ignored).

        Returns:
            ``(deleted, count)``: how many records were deleted and the collection's new size.

        Raises:
            ApiError: 404 when there is no such collection (or it was dropped meanwhile); 503 when
                the data dir's log could not be written (nothing was deleted).
        """
        collection = self.get(name)
        log = collection.log
        if log is None:
            deleted = await collection.index.adelete(ids)
        else:
            index = collection.index
            try:
                deleted = await self._logged(collection, lambda: log.write(encode_delete(ids), lambda: index.delete(ids)))
            except CollectionDropped:
                raise self._not_found(name) from None
        return deleted, await self.count(collection)

    async def _logged(self, collection: Collection, write: Callable[[], tuple[T, bool]]) -> T:
        """Run a logged write off the loop, one per collection at a time; schedule a checkpoint when due."""
        assert collection.log is not None and self.data_dir is not None
        async with collection.writers:
            try:
                result, due = await off_loop(write)
            except OSError as exc:
                raise ApiError(
                    503,
                    f"collection {collection.name!r} was not changed: writing its log in data dir "
                    f"{str(self.data_dir.path)!r} failed ({exc}). Free disk space or fix the folder's "
                    "permissions, then retry.",
                    type="server_error",
                    code="storage_error",
                ) from exc
        if due:
            self.data_dir.schedule_checkpoint(collection.log)
        return result

    def _forget_if_empty(self, collection: Collection) -> None:
        """Drop a collection created by an upsert that failed, unless others have filled it since."""
        log = collection.log
        # Never waits (this runs on the event loop): a log busy with a write or checkpoint is in use, so kept.
        with log.exclusive(blocking=False) if log is not None else contextlib.nullcontext(True) as held:
            if not held:
                return
            trash = None
            with self._lock:
                if (
                    self._items.get(collection.name) is not collection
                    or collection.index.count != 0
                    or self._pending.get(collection.name, 0) != 0
                ):
                    return
                if log is not None:
                    try:
                        # Renamed while the name is still taken, so a new collection of that name gets a new folder.
                        trash = log.remove()
                    except OSError as exc:
                        logger.warning("could not delete the folder of empty collection %r (%s); keeping it",
                                       collection.name, exc)
                        return
                del self._items[collection.name]
        purge(trash)
        # Closed, never dropped: in a shared Milvus another replica may have just created the same collection.
        collection.index.close()

    def drop(self, name: str) -> None:
        """Forget collection ``name`` and its sessions (under a data dir, durably, before returning).

        Raises:
            ApiError: 404 when there is none; 503 when its data dir folder could not be removed
                (then it is kept).
        """
        collection = self.get(name)
        log = collection.log
        trash = None
        # The log first (it waits out a write or checkpoint in progress), then the table of collections.
        with log.exclusive() if log is not None else contextlib.nullcontext(True), self._lock:
            if self._items.get(name) is not collection:
                raise self._not_found(name)  # dropped by another request meanwhile
            if log is not None:
                try:
                    # Renamed while the name is still taken, so a new collection of that name gets a new folder.
                    trash = log.remove()
                except OSError as exc:
                    raise ApiError(
                        503,
                        f"collection {name!r} was not deleted: its folder in data dir "
                        f"{str(log.folder.parent.parent)!r} could not be removed ({exc}); fix the folder's "
                        "permissions, then retry.",
                        type="server_error",
                        code="storage_error",
                    ) from exc
            del self._items[name]
        purge(trash)
        prefix = f"{name}/"
        for key in self.memory.sessions():
            if key.startswith(prefix):
                self.memory.clear(key)
        _discard(collection.index)

    def close(self) -> None:
        """Checkpoint every collection into the data dir (if any) and release it, then close every index."""
        with self._lock:
            items = list(self._items.values())
            self._items.clear()
        try:
            if self.data_dir is not None:
                self.data_dir.close([c.log for c in items if c.log is not None])
        finally:
            for collection in items:
                collection.index.close()
