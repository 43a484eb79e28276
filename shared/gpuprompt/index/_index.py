"""VectorIndex: vectors with ids, documents and metadata; filtered, batched, concurrent search.

The facade: the public API (sync and async) and the locks. Configuration, planning, search, MMR,
input checks and persistence live in the modules beside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuprompt.batching import BatcherStats, MicroBatcher
from gpuprompt.errors import ClosedError
from gpuprompt.index._async import AsyncIndexMixin
from gpuprompt.index._checks import check_filter, check_id_list, check_storable, check_upsert
from gpuprompt.index._config import BackendName, IndexConfig, check_embedder_args, record_embedder, resolve_config
from gpuprompt.index._groups import GroupSearchMixin
from gpuprompt.index._hybrid import HybridSearchMixin
from gpuprompt.index._lexical import LexicalIndex, LexicalStats
from gpuprompt.index._mmr import check_mmr, check_one_query
from gpuprompt.index._plan import Backend, apply_change, fill, new_backend, settle, tune
from gpuprompt.index._search import (
    FilterCache,
    SearchRequest,
    embed_deferred,
    make_request,
    run_batch,
    search_batcher,
)
from gpuprompt.index._snapshot import load_records, open_snapshot, restore_backend, write_state
from gpuprompt.index._store import RWLock, Store, copy_json
from gpuprompt.index._types import Hit, IndexStats, Record

__all__ = ["VectorIndex"]

_ASYNC_INLINE = 1 << 16  # asearch validates at most this many numbers on the loop thread


class VectorIndex(AsyncIndexMixin, GroupSearchMixin, HybridSearchMixin):
    """Vectors with their ids, documents and metadata; exact or ANN search with pre-filtering.

    Concurrent :meth:`search` / :meth:`asearch` calls, from threads or asyncio tasks, are coalesced
    by one :class:`~gpuprompt.batching.MicroBatcher` into batched backend searches. Reads and writes
    are guarded by a readers-writer lock, so a search never sees half of a write; a rejected write
    changes nothing. Every operation has an async twin (``aadd``, ``adelete``, ``aget``, ``aids``,
    ``aclear``, ``asearch``, ``ammr``, ``asave``, ``aload``) that never blocks the event loop.

    Backends: exact torch search, any faiss index, or ``"auto"`` (exact search up to
    :data:`ANN_THRESHOLD` records on a CPU, then HNSW); see :class:`IndexConfig` for each option.

    Scores are higher-is-better for every metric: ``"cosine"`` gives the cosine similarity in
    [-1, 1]; ``"ip"`` the inner product; ``"l2"`` gives ``1 / (1 + squared L2 distance)`` in (0, 1].

    Example:
        >>> import numpy as np
        >>> from gpuprompt import VectorIndex
        >>> index = VectorIndex(3)
        >>> index.add(["a", "b"], np.array([[1, 0, 0], [0, 1, 0]]), documents=["apple", "banana"],
        ...           metadatas=[{"kind": "fruit"}, {"kind": "fruit", "yellow": True}])
        ['a', 'b']
        >>> index.search(np.array([[0.9, 0.1, 0]]), k=1)
        [[Hit(id='a', score=0.9939, document='apple')]]
        >>> index.search(np.array([[0.9, 0.1, 0]]), k=5, filter={"yellow": True})
        [[Hit(id='b', score=0.1104, document='banana')]]
        >>> index.config.metric, VectorIndex(config=index.config.replace(metric="ip")).metric
        ('cosine', 'ip')

    Args:
        dim: vector dimension (or None with ``config``).
        config: a whole :class:`IndexConfig`; keyword ``options`` given too are applied to it.
        **options: any other :class:`IndexConfig` field (``metric``, ``backend``, ``device``,
            ``index_factory``, ``ef_search``, ``max_batch_size``, ...), documented there.

    Raises:
        ConfigurationError: an option of the wrong type or range, a malformed device string, or
            an unknown option (the message lists the valid ones). A faiss factory string is
            checked when the backend is built (that needs faiss), at the first add or search.
    """

    _embeds_in_batch = True  # hybrid_search(embed_function, texts, ...): the batch embeds the texts

    def __init__(self, dim: int | None = None, *, config: IndexConfig | None = None, **options: Any) -> None:
        self._config = resolve_config(dim, config, options)
        self._store = Store(self._config.dim)
        self._lock = RWLock()  # readers: searches, get, ids, save; writers: writes, switches
        self._backend: Backend | None = None
        self._device: str | None = None
        self._setup_lock = threading.Lock()  # builds the backend and the batcher once; close()
        self._save_lock = threading.Lock()  # one save of this index at a time
        self._batcher: MicroBatcher[SearchRequest, Any] | None = None
        self._filters = FilterCache()
        self._lexical: LexicalIndex | None = None  # built from the documents at the first lexical search
        self._closed = False

    @classmethod
    def check_options(cls, **options: Any) -> None:
        """Validate constructor options without building an index (``dim`` optional).

        For callers that construct the index later, once the dimension is known (the adapters), so
        a bad option fails where it was given rather than at the first add. Loads nothing.

        Raises:
            ConfigurationError: as the constructor would.
        """
        resolve_config(options.pop("dim", 1), None, options)

    # ------------------------------------------------------------------ properties
    @property
    def config(self) -> IndexConfig:
        """The current configuration (:meth:`switch_backend` and :meth:`set_search_params` replace it)."""
        return self._config

    @property
    def dim(self) -> int:
        """Vector dimension."""
        return self._config.dim

    @property
    def metric(self) -> str:
        """``"cosine"``, ``"ip"`` or ``"l2"``."""
        return self._config.metric

    @property
    def count(self) -> int:
        """Live records."""
        return self._store.size

    def __len__(self) -> int:
        return self._store.size

    @property
    def backend_name(self) -> str | None:
        """The backend in use (``"torch:cpu:float32"``, ``"faiss:HNSW32:cpu"``...), None before first use."""
        backend = self._backend
        return backend.describe() if backend is not None else None

    @property
    def device(self) -> str:
        """The resolved device (resolving imports torch)."""
        if self._device is None:
            from gpuprompt.device import resolve_device

            self._device = resolve_device(self._config.device)
        return self._device

    def __repr__(self) -> str:
        backend = self.backend_name or f"{self._config.backend} (not started)"
        return f"<VectorIndex dim={self.dim} metric={self.metric!r} backend={backend!r} count={self.count}>"

    def stats(self) -> IndexStats:
        """A snapshot of the counters."""
        backend, batcher = self._backend, self._batcher
        return IndexStats(
            count=self.count,
            tombstones=backend.tombstones if backend is not None else 0,
            backend=backend.describe() if backend is not None else None,
            batcher=batcher.stats() if batcher is not None else BatcherStats(0, 0, 0.0, 0, 0.0, 0.0, 0, 0, 0, 0),
        )

    # ------------------------------------------------------------------ backends
    def _ensure_backend(self, incoming: int = 0) -> Backend:
        """Build the backend on first use; ``incoming`` records about to be added count towards
        the ``auto`` choice (a first bulk add of 1M vectors goes straight to HNSW)."""
        backend = self._backend
        if backend is not None:
            return backend
        with self._setup_lock:
            if self._closed:
                raise ClosedError("this VectorIndex was closed; create or load a new one.")
            if self._backend is None:
                with self._lock.write():
                    backend = new_backend(self._config, self.device, self._store.size + incoming)
                    fill(backend, self._store)
                    self._backend = backend
            return self._backend

    def switch_backend(
        self, backend: BackendName, *, index_factory: str | None = None, device: str | None = None
    ) -> None:
        """Move the records to another backend (ids, documents and metadata are kept).

        Args:
            backend: ``"auto"``, ``"faiss"`` or ``"torch"``.
            index_factory: the faiss factory string for ``"faiss"`` (default ``"Flat"``).
            device: a new device, or None to keep the current one.

        Raises:
            ConfigurationError: a bad combination (for example ``index_factory`` with ``"torch"``).
        """
        changes: dict[str, Any] = {"backend": backend, "index_factory": index_factory}
        if device is not None:
            changes["device"] = device
        self._config.replace(**changes)  # a bad value fails before any lock is taken
        from gpuprompt.device import resolve_device

        with self._setup_lock, self._lock.write():
            config = self._config.replace(**changes)
            resolved = self.device if device is None else resolve_device(config.device)
            new = new_backend(config, resolved, self._store.size)
            fill(new, self._store)
            self._config, self._device, self._backend = config, resolved, new
            self._filters.clear()

    def set_search_params(self, *, ef_search: int | None = None, nprobe: int | None = None) -> None:
        """Change the ANN search knobs for later searches (the recall / speed trade-off).

        Args:
            ef_search: HNSW ``efSearch`` (candidates kept while walking the graph), or None to keep.
            nprobe: IVF lists probed per query, or None to keep.

        Raises:
            ConfigurationError: a value that is not an int >= 1.
        """
        changes = {name: value for name, value in (("ef_search", ef_search), ("nprobe", nprobe)) if value is not None}
        self._config.replace(**changes)  # a bad value fails before any lock is taken
        with self._lock.write():
            self._config = self._config.replace(**changes)
            tune(self._backend, self._config)

    # ------------------------------------------------------------------ writes
    def add(
        self,
        ids: Sequence[str | None] | None,
        vectors: Any,
        documents: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        embedder: str | None = None,
        allow_other_embedder: bool = False,
    ) -> list[str]:
        """Insert or replace records (upsert): an existing id is replaced, never duplicated.

        Args:
            ids: one str per vector, or None (or None items) for generated ``uuid4().hex`` ids.
                An id repeated inside one call: the last occurrence wins.
            vectors: ``(n, dim)`` real numbers (numpy, nested lists or a torch tensor), finite as
                float32; under ``"ip"`` / ``"l2"`` each squared norm at most :data:`SQUARED_NORM_LIMIT`.
            documents: one str or None per vector, or None.
            metadatas: one JSON dict or None per vector, or None: str keys; values str, int within
                int64, finite float, bool, None, lists and dicts, no cycles, at most 32 levels deep.
            embedder: the :attr:`~gpuprompt.Embedder.identity` that made ``vectors``; the first add
                naming one records it in :attr:`IndexConfig.embedder`, later adds must match.
            allow_other_embedder: add vectors of another embedder anyway (the record is kept).

        Returns:
            The ids, in the order given (generated ones filled in).

        Raises:
            DimensionMismatchError: vectors of another dimension (the message says expected and got).
            InvalidInputError: NaN/inf values, vectors too long for the metric, mismatched lengths,
                empty ids, text with lone surrogates, or metadata that would not save (see above).
                Nothing stored changes.
            InputTypeError: an item of the wrong type (named by its index), complex or string vectors.
            EmbedderMismatchError: ``embedder`` differs from the index's recorded embedder.
        """
        check_embedder_args(embedder, allow_other_embedder)
        upsert = check_upsert(ids, vectors, documents, metadatas, dim=self.dim, metric=self.metric)
        if not upsert.ids:
            return []
        check_storable(upsert.vectors, upsert.positions, self._ensure_backend(len(upsert.positions)), self.metric)
        with self._lock.write():
            self._config = record_embedder(self._config, embedder, allow_other_embedder)
            store = self._store
            change = store.plan_upsert(upsert.unique_ids, upsert.vectors)
            store.reserve(change.size)
            # Read the backend under the lock: another writer may have switched it meanwhile.
            apply_change(self._backend, store, change)
            if self._lexical is not None:
                self._lexical.apply_upsert(change, upsert.documents)
            store.apply_upsert(change, upsert.unique_ids, upsert.documents, upsert.metadatas)
            self._settle()
        return upsert.ids

    def delete(self, ids: Sequence[str]) -> int:
        """Delete records by id; missing ids are ignored.

        Returns:
            How many records were deleted (missing and repeated ids are not counted).

        Raises:
            InputTypeError: ``ids`` is not a list of str.
        """
        id_list = check_id_list(ids)
        if not id_list:
            return 0
        self._ensure_backend()
        with self._lock.write():
            store = self._store
            change = store.plan_delete(id_list)
            if not change.removed_labels.size:
                return 0
            apply_change(self._backend, store, change)
            if self._lexical is not None:
                self._lexical.apply_delete(change, store)
            store.apply_delete(change)
            self._settle()
            return int(change.removed_labels.size)

    def clear(self) -> None:
        """Delete every record (a trained faiss index keeps its training) and the embedder record."""
        with self._lock.write():
            self._config = dataclasses.replace(self._config, embedder=None)
            self._store.clear()
            if self._lexical is not None:
                self._lexical.clear()
            if self._backend is not None:
                self._backend.reset()
            self._filters.clear()

    def _settle(self) -> None:
        """After a write (write lock held): train, compact or switch the backend where due."""
        self._backend = settle(self._config, self.device, self._backend, self._store)

    # ------------------------------------------------------------------ reads
    def get(self, ids: Sequence[str]) -> list[Record]:
        """The records for ``ids``, in the order asked; missing ids are skipped.

        Raises:
            InputTypeError: ``ids`` is not a list of str.
        """
        id_list = check_id_list(ids)
        with self._lock.read():
            store = self._store
            rows = [store.row_of.get(key) for key in id_list]
            return [
                Record(key, store.vectors[row].copy(), store.documents[row], copy_json(store.metadatas[row]))
                for key, row in zip(id_list, rows)
                if row is not None
            ]

    def ids(self, filter: Mapping[str, Any] | None = None) -> list[str]:
        """Every id, in storage order; with ``filter``, only the ids of the matching records.

        The filter is evaluated once per index version and cached, like a search's.

        Raises:
            FilterError: a malformed filter (the message names the path in it).
        """
        key = check_filter(filter)
        with self._lock.read():
            store = self._store
            allowed = self._filters.allowed(store, key, filter)
            if allowed is None:
                return list(store.ids)
            return [store.ids[row] for row in allowed.rows.tolist()]

    def search(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]:
        """The ``k`` best records for each query, best first.

        Always ``min(k, matching records)`` hits per query: a filter never makes a query come back
        short (selective filters search only the matching rows; broad ones over-fetch until enough
        matches are found, topped up exactly if an ANN index misses some). Safe to call from many
        threads at once: concurrent calls are batched into one backend search.

        Args:
            queries: ``(q, dim)`` numbers (numpy, lists or a torch tensor, kept on its device for
                the torch backend); one ``(dim,)`` vector is taken as ``q = 1``.
            k: hits per query, an int >= 1.
            filter: a metadata filter (see :mod:`gpuprompt.index.filters`), or None.

        Returns:
            One list of :class:`Hit` per query.

        Raises:
            DimensionMismatchError: queries of another dimension.
            InvalidInputError: ``k`` < 1, NaN/inf in the queries.
            FilterError: a malformed filter (the message names the path in it).
        """
        request = self._request(queries, k, filter)
        if request.queries.shape[0] == 0:
            return []
        return self._submit(request).result()

    async def asearch(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]:
        """Async :meth:`search`: concurrent tasks are batched together; the loop never runs a search.

        Small queries are checked on the loop thread, large ones in a worker thread; the search
        runs on the index's batch worker. Cancelling the task drops a search still queued.
        """
        size = getattr(queries, "size", None)
        if isinstance(size, int) and size > _ASYNC_INLINE:
            request = await asyncio.to_thread(self._request, queries, k, filter)
        else:
            request = self._request(queries, k, filter)
        if request.queries.shape[0] == 0:
            return []
        return await asyncio.wrap_future(self._submit(request))

    def mmr(
        self,
        query: Any,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Mapping[str, Any] | None = None,
    ) -> list[Hit]:
        """Maximal marginal relevance: ``k`` hits that are relevant to ``query`` yet unlike each other.

        Fetches the ``fetch_k`` best hits (honouring ``filter``), then picks greedily the candidate
        maximising ``lambda_mult * cos(query, c) - (1 - lambda_mult) * max cos(c, picked)``,
        vectorised on the index's device. ``lambda_mult=1`` is plain relevance, 0 pure diversity.
        Hits keep the metric's score (see :class:`Hit`).

        Raises:
            InvalidInputError: ``k`` or ``fetch_k`` < 1, ``lambda_mult`` outside [0, 1], a query
                that is not one vector of the index's dimension.
        """
        return self._submit(self._mmr_request(query, k, fetch_k, lambda_mult, filter)).result()[0]

    async def ammr(
        self,
        query: Any,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Mapping[str, Any] | None = None,
    ) -> list[Hit]:
        """Async :meth:`mmr`: batched with other searches on the index's batch worker."""
        request = self._mmr_request(query, k, fetch_k, lambda_mult, filter)
        return (await asyncio.wrap_future(self._submit(request)))[0]

    def _request(self, queries: Any, k: Any, filter: Any, mmr: tuple[int, float] | None = None) -> SearchRequest:
        return make_request(queries, k, filter, dim=self.dim, metric=self.metric, mmr=mmr)

    def _mmr_request(self, query: Any, k: Any, fetch_k: Any, lambda_mult: Any, filter: Any) -> SearchRequest:
        k, fetch, lambda_mult = check_mmr(k, fetch_k, lambda_mult)
        request = self._request(query, fetch, filter, mmr=(k, lambda_mult))
        check_one_query(request.queries, self.dim)
        return request

    # ------------------------------------------------------------------ the batch
    def _submit(self, request: SearchRequest) -> Any:
        batcher = self._batcher
        if batcher is None:
            with self._setup_lock:
                if self._closed:
                    raise ClosedError("this VectorIndex was closed; create or load a new one.")
                if self._batcher is None:
                    self._batcher = search_batcher(self)
                batcher = self._batcher
        return batcher.submit(request)

    def _run_batch(self, requests: list[SearchRequest]) -> list[Any]:
        self._ensure_backend()
        errors = embed_deferred(requests, dim=self.dim, metric=self.metric)  # outside the lock: writers go on
        ready = [request for request, error in zip(requests, errors) if error is None]
        with self._lock.read():
            results = iter(run_batch(
                ready, store=self._store, backend=self._backend, filters=self._filters, metric=self.metric,
                lexical=self._lexical,
            ))
        return [next(results) if error is None else error for error in errors]

    def _ensure_lexical(self) -> None:
        """Build the lexical leg from the stored documents, once (later writes keep it in step)."""
        if self._lexical is None:
            with self._lock.write():
                if self._lexical is None:
                    self._lexical = LexicalIndex.build(self._store)

    async def _aensure_lexical(self) -> None:
        if self._lexical is None:
            await asyncio.to_thread(self._ensure_lexical)

    def lexical_stats(self) -> LexicalStats:
        """The lexical leg's size (documents, terms, postings, bytes); builds it if needed."""
        self._ensure_lexical()
        with self._lock.read():
            assert self._lexical is not None
            return self._lexical.stats()

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write a snapshot folder at ``path``; a crash at any point leaves a whole snapshot to load.

        The folder holds a manifest (format version, dim, metric, count, the :class:`IndexConfig`,
        sha256 of each file), the vectors as ``.npy``, ids/documents/metadata as JSON lines and,
        for the faiss backend, faiss's native index file. No pickle is written or read. It is
        written beside ``path`` under a hidden temporary name and renamed into place; the snapshot
        it replaces is kept as one hidden previous generation (``.<name>.gpuprompt-prev``), which
        :meth:`load` falls back to. Nothing else beside ``path`` is touched (see
        :mod:`gpuprompt.index._persist`).

        The backend and the records are read under the same lock writers take, so a snapshot is
        one consistent state even while other threads add, delete or switch backends. Searches go
        on during a save; writes wait for it.

        Raises:
            InputTypeError: ``path`` is not a str or path object.
            InvalidInputError: ``path`` exists and is neither a snapshot nor an empty folder, or lies
                below a file (nothing there is changed), or names no folder.
            StorageError: the file system refused a write, such as a folder this process may not
                write (an ``OSError``; the message names the path; the previous snapshot stays loadable).
        """
        from gpuprompt.index._persist import snapshot_names

        snapshot_names(path)  # a bad path fails before any lock is taken
        with self._save_lock, self._lock.read():  # switch_backend() and writes change what is saved
            write_state(path, self._config, self._store, self._backend)

    @classmethod
    def load(
        cls, path: str | Path, device: str = "auto", *, backend: BackendName | None = None, **options: Any
    ) -> VectorIndex:
        """Load a snapshot written by :meth:`save`, validating its manifest, checksums and contents.

        The newest generation that verifies is loaded: ``path`` itself, else the previous one a
        save kept beside it (after an interrupted save, or if ``path`` was damaged; a warning is
        logged). Vectors must be finite float32 of the manifest's shape and records well-formed,
        or the generation is refused. The saved :class:`IndexConfig` is restored with the
        arguments applied over it (``dataclasses.replace``). A faiss index file is reused when the
        loaded index runs faiss on this machine; otherwise the backend is rebuilt from the saved
        vectors (for example a CPU HNSW snapshot loaded with ``device="cuda"`` runs on torch).

        Args:
            path: the snapshot folder.
            device: where to run (``"auto"``, ``"cpu"``, ``"cuda"``...).
            backend: override the saved backend request (``"auto"``, ``"faiss"``, ``"torch"``).
            **options: override other saved options (``ef_search``, ``nprobe``, ``max_batch_size``...).

        Raises:
            ConfigurationError: an unknown or invalid ``device``, ``backend`` or option.
            InputTypeError: ``path`` is not a str or path object.
            SnapshotError: missing (also below a file), truncated, tampered with, or of another
                format version.
            StorageError: the file system refused a read, such as a folder this process may not read
                (an ``OSError`` naming the path; no older generation is loaded in its place).
        """
        config, snapshot = open_snapshot(path, device, backend, options)
        index = cls(config=config)
        load_records(index._store, snapshot)  # nobody else sees the new index yet
        with index._setup_lock, index._lock.write():
            index._backend = restore_backend(config, index.device, index._store, snapshot)
        return index

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the search queue (queued searches fail with ``ClosedError``); the data stays readable."""
        with self._setup_lock:
            self._closed = True
            batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.close()

    def __enter__(self) -> VectorIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
