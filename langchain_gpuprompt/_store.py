"""LangGraph ``BaseStore`` (long-term memory) with semantic search on gpuprompt's embedder and index.

Items live by (namespace, key) in an item map; their indexed fields are embedded by the core
Embedder and searched in the core VectorIndex, with the namespace prefix and the value filter
applied as one pre-filter in the core's filter language. In remote mode the item map and the
index are two collections of a running ``gpuprompt serve``; the store's logic is the same code.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from gpuprompt.bridge import off_loop
from gpuprompt.device import check_device
from gpuprompt.errors import ConfigurationError, InputTypeError, describe
from gpuprompt.validation import (
    check_clock,
    check_str,
    check_ttl,
    fail,
)
from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    NamespacePath,
    NotProvided,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
)

from langchain_gpuprompt._embeddings import GPUPromptEmbeddings
from langchain_gpuprompt._vectorstores import GPUPromptVectorStore

if TYPE_CHECKING:
    from gpuprompt.index import Hit

from langchain_gpuprompt._store_checks import (
    _check_listing,
    _check_namespace,
    _check_op,
    _check_put,
    _check_search,
    _embeddings,
    _index_paths,
)
from langchain_gpuprompt._store_items import (
    _DEFAULT_COLLECTION,
    _ITEM,
    _ITEMS_SUFFIX,
    _check_record_ids,
    _core_filter,
    _hit_path,
    _item_id,
    _LocalItems,
    _metadata,
    _namespace_matches,
    _remote_runtime,
    _RemoteItems,
)
from langchain_gpuprompt._store_types import NamespaceError, NamespaceTypeError, _Entry, _Path

__all__ = ["GPUPromptStore", "NamespaceError", "NamespaceTypeError"]


@dataclass
class _Reads:
    """A batch's reads, answered against the state before the batch's writes (as LangGraph's
    InMemoryStore does)."""

    results: list[Result]
    searches: list[tuple[int, SearchOp]]
    puts: dict[_Path, PutOp]


class GPUPromptStore(BaseStore):
    """LangGraph long-term memory store with GPU-backed semantic search.

    A drop-in for LangGraph's ``InMemoryStore``: the same namespaces, items, filters, pagination
    and batch semantics, but ``search(namespace, query=...)`` embeds with gpuprompt's batched
    Embedder (device cache included) and ranks in its VectorIndex, with the namespace prefix and
    ``filter`` applied *before* the top-k cut. Items may expire (TTL) when configured.

    Instantiate:
        .. code-block:: python

            from langchain_gpuprompt import GPUPromptStore

            store = GPUPromptStore()                                # semantic search on "$" (the whole value)
            store = GPUPromptStore(index={"fields": ["text"]})      # embed only the "text" field
            store = GPUPromptStore(ttl={"default_ttl": 60})         # items expire 60 min after last access

    Use:
        .. code-block:: python

            store.put(("users", "42", "memories"), "m1", {"text": "prefers cotton dresses"})
            store.put(("users", "42", "memories"), "m2", {"text": "lives in Oslo"})
            [item.key for item in store.search(("users", "42"), query="what fabric do they like?", limit=1)]
            # ['m1']

    With LangGraph:
        .. code-block:: python

            graph = builder.compile(store=GPUPromptStore())

    Remote mode (every worker process sees the same items; no torch, no model in the worker):
        .. code-block:: python

            store = GPUPromptStore(base_url="http://127.0.0.1:8000", api_key="...", collection="memories")
            # or set GPUPROMPT_URL (and GPUPROMPT_API_KEY) and pass collection="memories" only

        The vectors are the server collection ``collection`` (default ``"langgraph_store"``) and
        the items the collection ``<collection>.items`` (both count against the server's
        ``max_collection_records``; durable under ``gpuprompt serve --data-dir``). Answers are the
        in-process ones; TTLs are measured on the wall clock, which every process shares. A batch
        is not atomic across processes: concurrent writes to one item keep the last one.

    Args:
        index: semantic-search settings in LangGraph's ``IndexConfig`` shape: ``fields`` (JSON
            paths to embed, default ``["$"]``) and ``embed`` (LangChain ``Embeddings`` or an
            embedding function; default the bundled :class:`GPUPromptEmbeddings`). ``dims`` is
            accepted and checked by the index on the first put. ``False`` turns semantic search
            off (a plain key-value store).
        ttl: LangGraph ``TTLConfig``: ``default_ttl`` (minutes) and ``refresh_on_read``. Expired
            items are never returned and are removed (with their vectors) at the next operation.
        device: where the vector index lives (in process only).
        clock: the clock TTLs are measured on (seconds; default ``time.monotonic`` in process,
            ``time.time`` in remote mode, where expiry times are shared); called once now, as a probe.
        base_url: a running ``gpuprompt serve`` holding the items and vectors (remote mode).
        api_key: its API key (None reads ``GPUPROMPT_API_KEY`` when the server comes from ``GPUPROMPT_URL``).
        collection: the server collection (remote mode; 1-58 letters, digits, '.', '_' or '-'; the
            server is ``base_url`` or ``GPUPROMPT_URL``). ``GPUPROMPT_URL`` alone keeps the items
            in process (a server collection is shared and outlives the process, so it is never
            chosen implicitly); the default embeddings then still come from the server.

    Raises:
        ConfigurationError: an option of the wrong type or range (``device`` included, also when
            semantic search is off), a ``clock`` that does not return a finite number, a
            collection without a server, or ``device`` together with a server.
    """

    supports_ttl: bool = True

    def __init__(
        self,
        *,
        index: IndexConfig | Literal[False] | None = None,
        ttl: TTLConfig | None = None,
        device: str = "auto",
        clock: Callable[[], float] | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        collection: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if index is not None and index is not False and not isinstance(index, Mapping):
            raise ConfigurationError(
                "'index' must be None, False or an IndexConfig dict like {'fields': ['text']} "
                f"(got {describe(index)})."
            )
        if ttl is not None and not isinstance(ttl, Mapping):
            raise ConfigurationError(
                f"'ttl' must be None or a TTLConfig dict like {{'default_ttl': 60}} (got {describe(ttl)})."
            )
        check_device(device)
        if clock is not None:
            check_clock(clock)
        runtime = _remote_runtime(base_url, api_key, collection, device, timeout)
        remote = runtime.config if runtime is not None else None
        self.collection: str | None = None
        """The server collection holding the vectors (remote mode; the items are in ``<collection>.items``)."""
        if remote is not None:
            collection = _DEFAULT_COLLECTION if collection is None else collection
            self.collection = collection
        self.ttl_config = dict(ttl) if ttl is not None else None  # type: ignore[assignment]
        check_ttl((ttl or {}).get("default_ttl"), "ttl.default_ttl", unit="minutes")
        self._vectors: GPUPromptVectorStore | None = None
        self._fields: list[tuple[str, Any]] = []
        if index is not False:
            config = dict(index or {})
            embed = config.get("embed")
            if embed is not None:
                embeddings: Embeddings = _embeddings(embed)
            elif remote is None:
                embeddings = GPUPromptEmbeddings()
            else:  # the server's model: its vectors are the ones its collection takes
                embeddings = GPUPromptEmbeddings(base_url=remote.base_url, api_key=remote.api_key, timeout=timeout)
            if remote is None:
                self._vectors = GPUPromptVectorStore(embeddings, device=device)
            else:
                self._vectors = GPUPromptVectorStore(
                    embeddings, base_url=remote.base_url, api_key=remote.api_key, collection=self.collection,
                    timeout=timeout,
                )
            fields = config.get("fields") or ["$"]
            self._fields = _index_paths(fields, "index.fields", error=ConfigurationError)
        self.index_config = (  # type: ignore[assignment]
            {"fields": [path for path, _ in self._fields], "embed": self._vectors.embedding}
            if self._vectors is not None
            else None
        )
        # A remote store's expiry times are shared by every process: they are wall-clock times.
        self._clock = clock if clock is not None else (time.monotonic if remote is None else time.time)
        self._lock = threading.RLock()
        self._items: _LocalItems | _RemoteItems
        if remote is None:
            self._items = _LocalItems()
        else:
            assert runtime is not None
            self._items = _RemoteItems(runtime.index(collection=f"{self.collection}{_ITEMS_SUFFIX}"))

    def __repr__(self) -> str:
        where = "" if self.collection is None else f" collection={self.collection!r}"
        return f"<GPUPromptStore items={len(self._items)} semantic={self._vectors is not None}{where}>"

    @property
    def _data(self) -> dict[tuple[str, ...], dict[str, _Entry]]:
        """The in-process item map, by namespace then key (a remote store keeps its items on the server)."""
        data = getattr(self._items, "_data", None)
        if data is None:
            raise AttributeError("a remote GPUPromptStore keeps its items on the server, not in '_data'")
        return data

    @property
    def embeddings(self) -> Embeddings | None:
        """The embeddings used for semantic search (None when it is off)."""
        return self._vectors.embedding if self._vectors is not None else None

    # ------------------------------------------------------------------ single-op API
    # BaseStore's methods run LangGraph's own namespace checks (raising its InvalidNamespaceError,
    # a bare ValueError to gpuprompt) before ``batch``; these run ours first, naming the argument.
    def get(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        """The item at ``(namespace, key)``, or None.

        Raises:
            NamespaceError: a label is empty or holds '.', NUL or a lone surrogate.
            NamespaceTypeError: ``namespace`` is not a tuple of str.
            InputTypeError: ``key`` is not a str.
        """
        _check_namespace(namespace, "namespace")
        check_str(key, "key")
        return super().get(namespace, key, refresh_ttl=refresh_ttl)

    async def aget(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        """Async :meth:`get`."""
        _check_namespace(namespace, "namespace")
        check_str(key, "key")
        return await super().aget(namespace, key, refresh_ttl=refresh_ttl)

    def put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | None | NotProvided = NOT_PROVIDED,
    ) -> None:
        """Store ``value`` at ``(namespace, key)`` (replacing an item there).

        Raises:
            NamespaceError: ``namespace`` is empty, starts with "langgraph", or a label is empty
                or holds '.', NUL or a lone surrogate.
            NamespaceTypeError: ``namespace`` is not a tuple of str.
            InputTypeError: ``key`` is not a str, ``value`` not a dict, ``index`` not a list of str.
            InvalidInputError: ``value`` is not JSON (NaN, ints beyond 64 bits, lone surrogates,
                cycles, nesting deeper than 31), or ``ttl`` is not minutes > 0. Nothing stored changes.
        """
        _check_put(PutOp(namespace, key, value, index, None if ttl is NOT_PROVIDED else ttl), "")
        super().put(namespace, key, value, index, ttl=ttl)

    async def aput(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | None | NotProvided = NOT_PROVIDED,
    ) -> None:
        """Async :meth:`put`."""
        _check_put(PutOp(namespace, key, value, index, None if ttl is NOT_PROVIDED else ttl), "")
        await super().aput(namespace, key, value, index, ttl=ttl)

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        """Delete the item at ``(namespace, key)`` (a missing item is ignored).

        Raises:
            NamespaceError, NamespaceTypeError: a malformed namespace (see :meth:`put`).
            InputTypeError: ``key`` is not a str.
        """
        _check_namespace(namespace, "namespace")
        check_str(key, "key")
        super().delete(namespace, key)

    async def adelete(self, namespace: tuple[str, ...], key: str) -> None:
        """Async :meth:`delete`."""
        _check_namespace(namespace, "namespace")
        check_str(key, "key")
        await super().adelete(namespace, key)

    def search(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool | None = None,
    ) -> list[SearchItem]:
        """Items under ``namespace_prefix`` matching ``filter``, ranked by similarity to ``query``.

        Raises:
            NamespaceError, NamespaceTypeError: a malformed ``namespace_prefix``.
            InvalidInputError: ``limit`` or ``offset`` is not an int in [0, 2**63 - 1] (bools are
                refused), or ``query`` holds a lone surrogate.
            FilterError: a malformed ``filter``.
        """
        _check_search(SearchOp(namespace_prefix, filter, limit, offset, query), "")
        return super().search(
            namespace_prefix, query=query, filter=filter, limit=limit, offset=offset, refresh_ttl=refresh_ttl
        )

    async def asearch(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool | None = None,
    ) -> list[SearchItem]:
        """Async :meth:`search`."""
        _check_search(SearchOp(namespace_prefix, filter, limit, offset, query), "")
        return await super().asearch(
            namespace_prefix, query=query, filter=filter, limit=limit, offset=offset, refresh_ttl=refresh_ttl
        )

    def list_namespaces(
        self,
        *,
        prefix: NamespacePath | None = None,
        suffix: NamespacePath | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """The namespaces holding items, optionally under ``prefix`` / over ``suffix`` ('*' matches
        any label), truncated to ``max_depth`` labels, paginated.

        Raises:
            NamespaceError, NamespaceTypeError: a malformed ``prefix`` or ``suffix``.
            InvalidInputError: ``max_depth``, ``limit`` or ``offset`` is not an int >= 0.
        """
        _check_listing(prefix, suffix, max_depth, limit, offset)
        return super().list_namespaces(prefix=prefix, suffix=suffix, max_depth=max_depth, limit=limit, offset=offset)

    async def alist_namespaces(
        self,
        *,
        prefix: NamespacePath | None = None,
        suffix: NamespacePath | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """Async :meth:`list_namespaces`."""
        _check_listing(prefix, suffix, max_depth, limit, offset)
        return await super().alist_namespaces(
            prefix=prefix, suffix=suffix, max_depth=max_depth, limit=limit, offset=offset
        )

    # ------------------------------------------------------------------ batch API
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run get / search / put / list-namespaces operations; reads see the state before the
        batch's writes, and puts to the same item keep the last one."""
        reads = self._read(ops)
        for position, op in reads.searches:
            reads.results[position] = self._search(op)
        if reads.puts:
            self._apply(reads.puts, self._embed_puts(reads.puts))
        return reads.results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch`: queries and new texts are embedded by the batched embedder and
        searched in the index off the event loop; concurrent calls share batches."""
        if isinstance(self._items, _RemoteItems):
            # Every step is an HTTP request to the server, which batches embeddings and searches
            # with every other client's: run the whole batch off the event loop.
            return await off_loop(self.batch, ops)
        reads = self._read(ops)
        if reads.searches:
            found = await asyncio.gather(*(self._asearch(op) for _, op in reads.searches))
            for (position, _), result in zip(reads.searches, found):
                reads.results[position] = result
        if reads.puts:
            vectors = await self._aembed_puts(reads.puts)
            await off_loop(self._apply, reads.puts, vectors)
        return reads.results

    def sweep_ttl(self) -> int:
        """Remove expired items (and their vectors) now; returns how many. Every operation also
        sweeps first, so calling this is only needed to free memory while the store is idle."""
        now = self._clock()
        with self._lock:
            expired = self._items.expired(now)
            record_ids = [rid for entry in expired for rid in entry.record_ids]
            if record_ids and self._vectors is not None:
                self._vectors.delete(record_ids)
            self._items.apply([((entry.item.namespace, entry.item.key), None) for entry in expired])
        return len(expired)

    # ------------------------------------------------------------------ reads
    def _read(self, ops: Iterable[Op]) -> _Reads:
        if isinstance(ops, (str, bytes, Mapping)) or not isinstance(ops, Iterable):
            raise fail("ops", "a list of GetOp, SearchOp, PutOp or ListNamespacesOp", ops, error=InputTypeError)
        # Every op is checked (puts get a detached JSON copy of their value) before anything runs.
        ops = [_check_op(op, position) for position, op in enumerate(ops)]
        self.sweep_ttl()
        reads = _Reads(results=[None] * len(ops), searches=[], puts={})
        with self._lock:
            found = self._items.get_many([(tuple(op.namespace), op.key) for op in ops if isinstance(op, GetOp)])
            refreshed: dict[_Path, _Entry] = {}
            for position, op in enumerate(ops):
                if isinstance(op, GetOp):
                    path = (tuple(op.namespace), op.key)
                    entry = found.get(path)
                    if entry is not None and op.refresh_ttl and self._refresh(entry):
                        refreshed[path] = entry
                    reads.results[position] = entry.item if entry is not None else None
                elif isinstance(op, SearchOp):
                    reads.searches.append((position, op))
                elif isinstance(op, ListNamespacesOp):
                    reads.results[position] = self._list_namespaces(op)
                else:
                    reads.puts[(tuple(op.namespace), op.key)] = op
            self._items.touch(list(refreshed.values()))
        return reads

    def _refresh(self, entry: _Entry) -> bool:
        """Push ``entry``'s expiry back by its TTL; returns whether it has one."""
        if entry.ttl_minutes is None:
            return False
        entry.expires_at = self._clock() + entry.ttl_minutes * 60.0
        return True

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces = self._items.namespaces()
        if op.match_conditions:
            namespaces = [ns for ns in namespaces if all(_namespace_matches(c, ns) for c in op.match_conditions)]
        if op.max_depth is not None:
            namespaces = sorted({ns[: op.max_depth] for ns in namespaces})
        else:
            namespaces = sorted(namespaces)
        return namespaces[op.offset : op.offset + op.limit]

    def _candidates(self, op: SearchOp, core_filter: dict[str, Any] | None) -> list[_Entry]:
        # The namespace prefix is part of core_filter (labels by position).
        with self._lock:
            return self._items.candidates(core_filter)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        core_filter = _core_filter(op)
        if not op.query or self._vectors is None:
            return self._listing(op, core_filter)
        need = op.offset + op.limit
        hits: list[Hit] = []
        if need > 0:
            vectors = self._vectors.embed_query_matrix(op.query)
            index = self._vectors.ensure_index(int(vectors.shape[1]))
            hits = index.search_groups(vectors, need, group_by=_ITEM, filter=core_filter)
        return self._page(op, core_filter, self._rank(hits))

    async def _asearch(self, op: SearchOp) -> list[SearchItem]:
        core_filter = _core_filter(op)
        if not op.query or self._vectors is None:
            return self._listing(op, core_filter)
        need = op.offset + op.limit
        hits: list[Hit] = []
        if need > 0:
            vectors = await self._vectors.aembed_query_matrix(op.query)
            index = self._vectors.ensure_index(int(vectors.shape[1]))
            hits = await index.asearch_groups(vectors, need, group_by=_ITEM, filter=core_filter)
        return self._page(op, core_filter, self._rank(hits))

    def _rank(self, hits: list[Hit]) -> list[tuple[float, _Entry]]:
        # The index grouped the hits by item (an item indexed on several fields has several
        # vectors and ranks by its best one); drop items replaced or deleted since the search.
        seen: set[_Path] = set()
        ranked: list[tuple[float, _Entry]] = []
        paths = [_hit_path(hit) for hit in hits]
        with self._lock:
            entries = self._items.get_many(list(dict.fromkeys(paths)))
            for hit, path in zip(hits, paths):
                entry = entries.get(path)
                if path in seen or entry is None or hit.id not in entry.record_ids:
                    continue  # a duplicate vector, or an item replaced or deleted meanwhile
                seen.add(path)
                ranked.append((float(hit.score), entry))
        return ranked

    def _page(
        self, op: SearchOp, core_filter: dict[str, Any] | None, ranked: list[tuple[float, _Entry]]
    ) -> list[SearchItem]:
        kept: list[tuple[float | None, _Entry]] = list(ranked[op.offset : op.offset + op.limit])
        if len(kept) < op.limit:
            # Matching items with nothing to embed still fill the page, unscored (as InMemoryStore).
            unscored = [entry for entry in self._candidates(op, core_filter) if not entry.record_ids]
            kept.extend((None, entry) for entry in unscored[: op.limit - len(kept)])
        return self._results(op, kept)

    def _listing(self, op: SearchOp, core_filter: dict[str, Any] | None) -> list[SearchItem]:
        entries = self._candidates(op, core_filter)[op.offset : op.offset + op.limit]
        return self._results(op, [(None, entry) for entry in entries])

    def _results(self, op: SearchOp, kept: list[tuple[float | None, _Entry]]) -> list[SearchItem]:
        if op.refresh_ttl:
            with self._lock:
                self._items.touch([entry for _, entry in kept if self._refresh(entry)])
        return [
            SearchItem(
                namespace=entry.item.namespace,
                key=entry.item.key,
                value=entry.item.value,
                created_at=entry.item.created_at,
                updated_at=entry.item.updated_at,
                score=score,
            )
            for score, entry in kept
        ]

    # ------------------------------------------------------------------ writes
    def _texts(self, puts: dict[_Path, PutOp]) -> tuple[list[str], list[str], list[dict[str, Any]]]:
        texts: list[str] = []
        ids: list[str] = []
        metadatas: list[dict[str, Any]] = []
        if self._vectors is None:
            return texts, ids, metadatas
        for (namespace, key), op in puts.items():
            if op.value is None or op.index is False:
                continue
            paths = self._fields if op.index is None else _index_paths(op.index, "index")
            for path, tokens in paths:
                found = get_text_at_path(op.value, tokens)
                names = [path] if len(found) == 1 else [f"{path}.{i}" for i in range(len(found))]
                for name, text in zip(names, found):
                    texts.append(text)
                    ids.append(json.dumps([list(namespace), key, name]))
                    metadatas.append(_metadata(namespace, key, op.value))
        return texts, ids, metadatas

    def _embed_puts(self, puts: dict[_Path, PutOp]) -> tuple[list[str], list[str], list[dict[str, Any]], Any]:
        texts, ids, metadatas = self._texts(puts)
        vectors = self._vectors.embed_documents_matrix(texts) if texts and self._vectors is not None else None
        return texts, ids, metadatas, vectors

    async def _aembed_puts(self, puts: dict[_Path, PutOp]) -> tuple[list[str], list[str], list[dict[str, Any]], Any]:
        texts, ids, metadatas = self._texts(puts)
        vectors = await self._vectors.aembed_documents_matrix(texts) if texts and self._vectors is not None else None
        return texts, ids, metadatas, vectors

    def _apply(
        self, puts: dict[_Path, PutOp], embedded: tuple[list[str], list[str], list[dict[str, Any]], Any]
    ) -> None:
        texts, ids, metadatas, vectors = embedded
        now = datetime.now(timezone.utc)
        first_order = time.time_ns()
        if isinstance(self._items, _RemoteItems):  # the server's id limit, checked before anything is sent
            _check_record_ids([*ids, *(_item_id(path) for path in puts)])
        with self._lock:
            old_entries = self._items.get_many(list(puts))
            if vectors is not None and self._vectors is not None:
                # Added first: a rejected add (bad metadata, wrong dimension) leaves everything as it was.
                index = self._vectors.ensure_index(int(vectors.shape[1]))
                index.add(ids, vectors, documents=texts, metadatas=metadatas)
            new_ids: dict[_Path, list[str]] = {}
            for record_id in ids:
                namespace, key, _ = json.loads(record_id)
                new_ids.setdefault((tuple(namespace), key), []).append(record_id)
            stale: list[str] = []
            changes: list[tuple[_Path, _Entry | None]] = []
            for position, (path, op) in enumerate(puts.items()):
                namespace, key = path
                old = old_entries.get(path)
                fresh = new_ids.get(path, [])
                if old is not None:
                    stale.extend(rid for rid in old.record_ids if rid not in fresh)
                if op.value is None:
                    if old is not None:
                        changes.append((path, None))
                    continue
                item = Item(
                    value=op.value,  # the detached JSON copy made when the op was checked
                    key=key,
                    namespace=namespace,
                    created_at=old.item.created_at if old is not None else now,
                    updated_at=now,
                )
                order = old.order if old is not None else first_order + position
                entry = _Entry(item=item, record_ids=fresh, ttl_minutes=op.ttl, order=order,
                               ns_order=old.ns_order if old is not None else None)
                self._refresh(entry)
                changes.append((path, entry))
            self._items.apply(changes)
            if stale and self._vectors is not None:
                self._vectors.delete(stale)


# ---------------------------------------------------------------------- helpers
