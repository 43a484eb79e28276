"""GPUPromptVectorStore: a LlamaIndex vector store over gpuprompt's ``VectorIndex``.

Nodes are kept whole (text, metadata, relationships); searches are pre-filtered in the core,
coalesced across concurrent ``aquery`` calls, and scored higher-is-better.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpuprompt.bridge import off_loop
from gpuprompt.errors import (
    ConfigurationError,
    DimensionMismatchError,
    InputTypeError,
    InvalidInputError,
    SnapshotError,
    describe,
)
from gpuprompt.validation import (
    check_metadata,
    check_path,
    check_path_name,
    check_real_vector,
    check_str,
    check_text,
    configuration_error,
)
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr, SecretStr, ValidationError
from llama_index.core.schema import BaseNode, MetadataMode
from llama_index.core.vector_stores.types import (
    DEFAULT_PERSIST_DIR,
    DEFAULT_PERSIST_FNAME,
    BasePydanticVectorStore,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

from llamaindex_gpuprompt._common import check_options
from llamaindex_gpuprompt._filters import RESERVED_KEY, is_reserved_key, to_core_filter
from llamaindex_gpuprompt._vector_store_query import Restriction, _id_list, _ref_doc_id, lexical_index, plan_query

if TYPE_CHECKING:
    from gpuprompt.index import Hit, IndexLike, Record

__all__ = ["GPUPromptVectorStore"]

NODE_KEY = RESERVED_KEY
"""The metadata key the store reserves: the node's serialised form, id and ref_doc_id.

User metadata may hold neither this key nor any key starting with ``"_llamaindex_node."`` (the
core would resolve the bookkeeping's dotted paths to such a key); everything else in a record's
metadata is the user's node metadata, which filters see."""

_NAMESPACE_SEP = "__"
_DEFAULT_NAMESPACE = "default"
_EMPTY_MARK = "gpuprompt-empty-vector-store.json"
"""What :meth:`GPUPromptVectorStore.persist` writes for a store that never got a node (no dimension,
so no index snapshot yet): its settings, in a folder at the persist path."""



class GPUPromptVectorStore(BasePydanticVectorStore):
    """LlamaIndex vector store backed by gpuprompt's VectorIndex (Faiss or torch, CPU or GPU).

    Unlike the stock ``FaissVectorStore`` it keeps each node's text, metadata and relationships
    (``stores_text=True``, so ``VectorStoreIndex.from_vector_store`` and ``VectorMemoryBlock``
    work), deletes by document or by node, filters with every ``FilterOperator`` (nested
    ``MetadataFilters`` too) *before* ranking, supports MMR, returns similarities where higher is
    better, batches concurrent ``aquery`` calls into one search, and persists without pickle.

    Because the store keeps the text, ``VectorStoreIndex`` writes no nodes to its docstore (as with
    every text-keeping store, Chroma's included): ``index.ref_doc_info`` is then unavailable, and
    ``refresh_ref_docs`` does not re-insert a document deleted with ``delete_ref_doc`` (the
    docstore still holds its hash). Build the index with ``store_nodes_override=True`` where those
    matter: the docstore then keeps the nodes too, as with LlamaIndex's default store.

    Example:
        >>> from llama_index.core import StorageContext, VectorStoreIndex
        >>> from llamaindex_gpuprompt import GPUPromptVectorStore
        >>> store = GPUPromptVectorStore()                       # dim taken from the first nodes
        >>> storage = StorageContext.from_defaults(vector_store=store)
        >>> index = VectorStoreIndex.from_documents(documents, storage_context=storage)
        >>> index.as_retriever(similarity_top_k=3, filters=filters).retrieve("red dress")
        >>> storage.persist("./storage")                          # writes ./storage/default__vector_store.json/
        >>> store = GPUPromptVectorStore.from_persist_dir("./storage")
        >>> index = VectorStoreIndex.from_vector_store(store)

    Remote mode: ``GPUPromptVectorStore(base_url="http://127.0.0.1:8000", api_key="...",
    collection="kb")`` (or ``GPUPROMPT_URL`` and ``collection=`` only) keeps the nodes in a
    collection of a running ``gpuprompt serve``, shared by every worker process, with the same
    filters, MMR, deletes and typed errors (:class:`gpuprompt.remote.RemoteIndex`); ``clear``
    drops the server collection and ``persist`` writes a local snapshot of it.

    Args:
        index: an existing core index to wrap: a :class:`gpuprompt.VectorIndex`, a
            :class:`gpuprompt.index.MilvusIndex` or any :class:`gpuprompt.index.IndexLike` (then
            ``dim`` and ``metric`` are taken from it; another ``dim`` or ``metric``, or ``backend``,
            ``device`` or ``index_options``, is refused with it: it is used as it is).
        **kwargs: the fields below.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    stores_text: bool = True
    is_embedding_query: bool = True
    dim: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        strict=True,
        description="Vector dimension; None: taken from the first nodes added.",
    )
    metric: Literal["cosine", "ip", "l2"] = Field(default="cosine", description="Similarity metric of the index.")
    backend: Literal["auto", "faiss", "torch"] = Field(default="auto", description="Index backend.")
    device: str = Field(default="auto", description="'auto', 'cpu', 'cuda', 'cuda:N'.")
    index_options: dict[str, Any] = Field(
        default_factory=dict, description="Other gpuprompt.VectorIndex options (index_factory, ...)."
    )
    mmr_prefetch_factor: float = Field(
        default=4.0,
        ge=1.0,
        le=1e6,
        allow_inf_nan=False,
        description="MMR: candidates fetched = similarity_top_k x this (at least 20).",
    )
    base_url: str | None = Field(
        default=None, description="A running gpuprompt serve whose collection holds the nodes (remote mode)."
    )
    api_key: SecretStr | None = Field(
        default=None, description="Its API key (None reads GPUPROMPT_API_KEY when the server comes from GPUPROMPT_URL)."
    )
    collection: str | None = Field(
        default=None, description="The server collection (remote mode; the server is base_url or GPUPROMPT_URL)."
    )
    timeout: float | None = Field(
        default=None, description="Remote mode: seconds a request to the server may wait for an answer (None reads "
        "GPUPROMPT_TIMEOUT, else 60).")

    _index: IndexLike | None = PrivateAttr(default=None)
    _index_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, *, index: IndexLike | None = None, **kwargs: Any) -> None:
        if index is not None:
            from gpuprompt.index import check_index

            check_index(index, allow_none=True)
            kwargs.setdefault("dim", index.dim)
            kwargs.setdefault("metric", index.metric)
        check_options("index_options", kwargs.get("index_options"), ("dim", "metric", "backend", "device"))
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:  # a field of the wrong type: our typed error, naming it
            raise configuration_error(exc, "GPUPromptVectorStore") from exc
        from gpuprompt.runtime import connect_index

        local = {"backend": (self.backend, "auto"), "device": (self.device, "auto"),
                 "index_options": (self.index_options, {})}
        remote = connect_index(self.base_url, self.api_key, self.collection, owner="GPUPromptVectorStore", index=index,
                               dim=self.dim, metric=self.metric, timeout=self.timeout, local_options=local)
        if remote is not None:
            index = remote  # connects at first use
            self.base_url = remote.client.config.base_url
            key = remote.client.config.api_key
            self.api_key = SecretStr(key) if key is not None else None
        if index is None:
            from gpuprompt.index import VectorIndex

            # The core checks the options now, so a bad one fails here rather than when the index
            # is built at the first add (the dimension may only be known then). Loads nothing.
            VectorIndex.check_options(
                dim=self.dim or 1, metric=self.metric, backend=self.backend, device=self.device, **self.index_options
            )
        self._index = index

    @classmethod
    def class_name(cls) -> str:
        return "GPUPromptVectorStore"

    def __repr__(self) -> str:
        count = len(self._index) if self._index is not None else 0
        return f"GPUPromptVectorStore(dim={self.dim}, metric={self.metric!r}, nodes={count})"

    # ------------------------------------------------------------------ the core object
    @property
    def client(self) -> IndexLike | None:
        """The core index, a VectorIndex or MilvusIndex (None until the dimension is known)."""
        if self._index is None and self.dim is not None:
            return self._ensure_index(self.dim)
        return self._index

    def _ensure_index(self, dim: int) -> IndexLike:
        with self._index_lock:
            if self._index is None:
                from gpuprompt.index import VectorIndex

                self._index = VectorIndex(
                    dim, metric=self.metric, backend=self.backend, device=self.device, **self.index_options
                )
                self.dim = dim
            return self._index

    # ------------------------------------------------------------------ node <-> record
    def _records(self, nodes: Sequence[BaseNode]) -> tuple[list[str], list[Any], list[str], list[dict]]:
        if isinstance(nodes, (BaseNode, str, bytes)) or not isinstance(nodes, Sequence):
            raise InputTypeError(f"'nodes' must be a list of nodes (got {describe(nodes)}).")
        ids: list[str] = []
        vectors: list[Any] = []
        documents: list[str] = []
        metadatas: list[dict] = []
        dim = self.dim
        for i, node in enumerate(nodes):
            if not isinstance(node, BaseNode):
                raise InputTypeError(f"'nodes[{i}]' must be a LlamaIndex node (got {describe(node)}).")
            check_str(node.node_id, f"nodes[{i}].id_", allow_empty=False)
            if node.embedding is None:
                raise InvalidInputError(
                    f"'nodes[{i}]' (id {node.node_id!r}) has no embedding; embed the nodes first "
                    "(VectorStoreIndex does) or set node.embedding."
                )
            embedding = check_real_vector(node.embedding, f"nodes[{i}].embedding")
            dim = dim or len(embedding)
            if len(embedding) != dim:
                raise DimensionMismatchError(
                    f"'nodes[{i}].embedding' must have {dim} dimensions (got {len(embedding)}); embed every "
                    "node with the same model as the store's index.",
                    expected=dim,
                    got=len(embedding),
                )
            # A detached JSON copy: what is stored can always be saved, filtered and read back as given.
            metadata = check_metadata(node.metadata, f"nodes[{i}].metadata", allow_none=False)
            for key in metadata:
                if is_reserved_key(key):
                    raise InvalidInputError(
                        f"'nodes[{i}].metadata' must not use the reserved key {key!r} (got it in node "
                        f"{node.node_id!r}): {NODE_KEY!r} and keys starting with '{NODE_KEY}.' hold the store's "
                        "own bookkeeping; rename that key."
                    )
            ref_doc_id = node.ref_doc_id
            if ref_doc_id is not None:
                check_str(ref_doc_id, f"nodes[{i}].ref_doc_id")
            # The node is serialised without its metadata (kept once, as the filterable record
            # metadata) and without its text (kept once, as the record's document).
            try:
                bare = node.model_copy(update={"metadata": {}})
                serialised = node_to_metadata_dict(bare, remove_text=True)
            except (TypeError, ValueError, RecursionError) as exc:
                raise InvalidInputError(
                    f"'nodes[{i}]' (id {node.node_id!r}) must be JSON-serialisable apart from its metadata: its "
                    f"relationships or other fields could not be serialised ({type(exc).__name__}: {exc})."[:600]
                ) from None
            document = check_str(node.get_content(metadata_mode=MetadataMode.NONE), f"nodes[{i}].text")
            check_text(serialised["_node_content"], f"nodes[{i}] (its relationships and other fields, serialised)")
            metadata[NODE_KEY] = {
                "id": node.node_id,
                "ref_doc_id": ref_doc_id,
                "type": serialised["_node_type"],
                "content": serialised["_node_content"],
            }
            ids.append(node.node_id)
            vectors.append(embedding)
            documents.append(document)
            metadatas.append(metadata)
        seen: set[str] = set()
        for node_id in ids:
            if node_id in seen:
                raise InvalidInputError(f"'nodes' must have distinct ids (got {node_id!r} more than once).")
            seen.add(node_id)
        return ids, vectors, documents, metadatas

    @staticmethod
    def _node(record: Hit | Record) -> BaseNode:
        metadata = dict(record.metadata)
        info = metadata.pop(NODE_KEY, None)
        if not isinstance(info, dict) or "content" not in info:
            # A record added to the core index directly, not through this store.
            from llama_index.core.schema import TextNode

            return TextNode(id_=record.id, text=record.document or "", metadata=metadata)
        node = metadata_dict_to_node(
            {"_node_content": info["content"], "_node_type": info.get("type")}, text=record.document
        )
        node.metadata = metadata
        return node

    # ------------------------------------------------------------------ writes
    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """Add (or replace, by node id) nodes with their embeddings, in one batched core call.

        Returns:
            The node ids, in order.

        Raises:
            InvalidInputError: a node has no embedding, a duplicated id, metadata that is not
                JSON (non-str keys, NaN, ints beyond 64 bits, lone surrogates, cycles, nesting
                deeper than 32) or that uses the reserved key ``_llamaindex_node`` (or a key
                starting with ``_llamaindex_node.``); nothing is stored then.
            InputTypeError: ``nodes`` is not a list of nodes, or an embedding is not a list of numbers.
            DimensionMismatchError: an embedding of another dimension than the index's.
        """
        ids, vectors, documents, metadatas = self._records(nodes)
        if not ids:
            return []
        index = self._ensure_index(len(vectors[0]))
        import numpy as np

        index.add(ids, np.stack(vectors), documents=documents, metadatas=metadatas)
        if self.dim is None:  # a given index (a server collection) learnt its dimension now
            self.dim = index.dim
        return ids

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """Async :meth:`add`: serialisation and the core insert run off the event loop (a cancelled
        call leaves every node stored or none)."""
        return await off_loop(self.add, nodes, **kwargs)

    def _matching_ids(self, core_filter: dict[str, Any] | None, node_ids: list[str] | None = None) -> list[str]:
        index = self._index
        if index is None:
            return []
        matched = index.ids(filter=core_filter)
        if node_ids is None:
            return matched
        wanted = set(node_ids)
        return [node_id for node_id in matched if node_id in wanted]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the document ``ref_doc_id`` (unknown ids are ignored).

        Raises:
            InputTypeError: ``ref_doc_id`` is not a str.
            InvalidInputError: ``ref_doc_id`` holds a lone surrogate.
        """
        check_str(ref_doc_id, "ref_doc_id")
        ids = self._matching_ids({f"{NODE_KEY}.ref_doc_id": ref_doc_id})
        if ids and self._index is not None:
            # Confirmed against each record's own bookkeeping: a snapshot written before reserved
            # keys were refused may hold a user key literally named "_llamaindex_node.ref_doc_id".
            owned = [record.id for record in self._index.get(ids) if _ref_doc_id(record) == ref_doc_id]
            if owned:
                self._index.delete(owned)

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Async :meth:`delete`, off the event loop."""
        await off_loop(self.delete, ref_doc_id, **delete_kwargs)

    def delete_nodes(
        self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None, **delete_kwargs: Any
    ) -> None:
        """Delete the nodes whose id is in ``node_ids`` (None: any id) and that match ``filters``.

        With neither argument every node is deleted, as in LlamaIndex's ``SimpleVectorStore``.
        """
        ids = _id_list(node_ids, "node_ids")
        core_filter = to_core_filter(filters)
        if self._index is None or ids == []:
            return
        if core_filter is None and ids is not None:
            self._index.delete(ids)
            return
        matched = self._matching_ids(core_filter, ids)
        if matched:
            self._index.delete(matched)

    async def adelete_nodes(
        self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None, **delete_kwargs: Any
    ) -> None:
        """Async :meth:`delete_nodes`, off the event loop."""
        await off_loop(self.delete_nodes, node_ids, filters, **delete_kwargs)

    def clear(self) -> None:
        """Delete every node (the index keeps its dimension and metric)."""
        if self._index is not None:
            self._index.clear()

    async def aclear(self) -> None:
        """Async :meth:`clear` (the core's ``aclear``)."""
        if self._index is not None:
            await self._index.aclear()

    # ------------------------------------------------------------------ reads
    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The stored nodes with their text, metadata and relationships (without embeddings).

        Args:
            node_ids: the ids wanted (returned in this order; unknown ids are skipped); None for
                every node.
            filters: only nodes matching these metadata filters.
        """
        ids = _id_list(node_ids, "node_ids")
        core_filter = to_core_filter(filters)
        if self._index is None or ids == []:
            return []
        if core_filter is not None or ids is None:
            matched = set(self._matching_ids(core_filter, ids))
            ids = [i for i in ids if i in matched] if ids is not None else self._matching_ids(core_filter)
        return [self._node(record) for record in self._index.get(ids)]

    async def aget_nodes(
        self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None
    ) -> list[BaseNode]:
        """Async :meth:`get_nodes`, off the event loop."""
        return await off_loop(self.get_nodes, node_ids, filters)

    def _result(self, hits: Sequence[Hit], restriction: Restriction) -> VectorStoreQueryResult:
        hits = [hit for hit in hits if restriction.allows(hit)]
        return VectorStoreQueryResult(
            nodes=[self._node(hit) for hit in hits],
            similarities=[float(hit.score) for hit in hits],
            ids=[hit.id for hit in hits],
        )

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Top ``similarity_top_k`` nodes for ``query.query_embedding``.

        Honours ``filters`` (pre-filtering: k results whenever k nodes match), ``node_ids`` and
        ``doc_ids`` (an empty list means no restriction) and ``mode``:

        * ``DEFAULT``; ``MMR``, with ``query.mmr_threshold`` or the ``mmr_threshold`` keyword as the
          relevance weight, default 0.5; ``mmr_prefetch_k`` or ``mmr_prefetch_factor`` size the pool.
        * ``HYBRID``: the embedding and ``query_str`` (BM25 over the nodes' text) under the same
          filters, fused: ``alpha`` None by reciprocal rank, else weighted normalised scores (1 dense
          only, 0 lexical only). With ``hybrid_top_k``, that many are returned from
          ``max(similarity_top_k, sparse_top_k)`` candidates per leg; else ``similarity_top_k`` from
          ``max(20, 4 * k)`` (or ``sparse_top_k``) candidates.
        * ``TEXT_SEARCH``: ``query_str`` by BM25 alone (no embedding needed), ``sparse_top_k`` or
          ``similarity_top_k`` nodes. Nodes without text never match the lexical leg.

        Returns:
            Nodes (with text, metadata, relationships), similarities (higher is better) and ids.

        Raises:
            InvalidInputError: no query embedding (but for TEXT_SEARCH), no ``query_str`` for HYBRID or
                TEXT_SEARCH, ``alpha`` outside [0, 1], an unsupported mode, a bad ``similarity_top_k``,
                ``mmr_threshold``, ``mmr_prefetch_k`` or ``mmr_prefetch_factor``.
            InputTypeError: the query embedding is not a flat list of numbers (strs, bools, ragged
                rows), or ``node_ids`` / ``doc_ids`` are not lists of str.
            DimensionMismatchError: the query embedding's dimension differs from the index's.
            FilterError: a malformed filter (the message names where).
        """
        vector, k, core_filter, mmr, restriction = plan_query(query, kwargs, dim=self.dim, prefetch_factor=self.mmr_prefetch_factor)
        index = self.client
        if index is None or k == 0:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        if mmr is not None and "text" in mmr:
            words = lexical_index(index)
            if vector is None:
                hits = words.lexical_search([mmr["text"]], k, core_filter)[0]
            else:
                hits = words.hybrid_search(vector[None, :], [mmr["text"]], k, core_filter, alpha=mmr["alpha"],
                                           fetch_k=mmr.get("fetch_k"))[0]
        elif mmr is not None:
            hits = index.mmr(vector, k=k, fetch_k=mmr["fetch_k"], lambda_mult=mmr["lambda_mult"], filter=core_filter)
        else:
            hits = index.search(vector[None, :], k, filter=core_filter)[0]
        return self._result(hits, restriction)

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Async :meth:`query`: awaits the core's batched search, so concurrent calls share one search."""
        vector, k, core_filter, mmr, restriction = plan_query(query, kwargs, dim=self.dim, prefetch_factor=self.mmr_prefetch_factor)
        index = self.client
        if index is None or k == 0:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        if mmr is not None and "text" in mmr:
            words = lexical_index(index)
            if vector is None:
                hits = (await words.alexical_search([mmr["text"]], k, core_filter))[0]
            else:
                hits = (await words.ahybrid_search(vector[None, :], [mmr["text"]], k, core_filter, alpha=mmr["alpha"],
                                                   fetch_k=mmr.get("fetch_k")))[0]
        elif mmr is not None:
            hits = await index.ammr(
                vector, k=k, fetch_k=mmr["fetch_k"], lambda_mult=mmr["lambda_mult"], filter=core_filter
            )
        else:
            hits = (await index.asearch(vector[None, :], k, filter=core_filter))[0]
        return self._result(hits, restriction)

    # ------------------------------------------------------------------ persistence
    def persist(self, persist_path: str = os.path.join(DEFAULT_PERSIST_DIR, DEFAULT_PERSIST_FNAME), fs: Any = None) -> None:
        """Save the store to ``persist_path`` in the core's safe snapshot format (no pickle).

        ``StorageContext.persist(dir)`` calls this with ``dir/default__vector_store.json``; the
        snapshot is written there (atomically, by the core).

        A store that never got a node and has no ``dim`` (an index built from no documents) has no
        index yet: its settings are written instead (``metric``, ``backend``, ``index_options``), and
        :meth:`from_persist_path` gives back such an empty store; a later persist to the same path
        writes the snapshot in their place.

        Raises:
            ConfigurationError: ``fs`` is a non-local fsspec filesystem.
            InvalidInputError: ``persist_path`` is empty, holds NUL, ends in ``.``/``..``, or steps
                back out of a folder it named (``a/../b``: how a namespace like ``"../x"`` would
                escape the folder); or, for a store with no index yet, something other than such a
                record or an empty folder is there already.
            InputTypeError: ``persist_path`` is not a str or ``os.PathLike``.
        """
        _check_local_fs(fs)
        persist_path = check_path(persist_path, "persist_path")
        index = self.client
        folder = Path(persist_path)
        if index is None:
            self._persist_settings(folder)
            return
        mark = folder / _EMPTY_MARK
        if mark.is_file() and len(os.listdir(folder)) == 1:  # the empty store's record gives way to its snapshot
            mark.unlink()
        index.save(persist_path)

    def _persist_settings(self, folder: Path) -> None:
        """Write the settings of a store with no index yet (see :meth:`persist`)."""
        if folder.exists() and not (folder.is_dir() and set(os.listdir(folder)) <= {_EMPTY_MARK}):
            raise InvalidInputError(
                f"this GPUPromptVectorStore has no index yet (no node was added and 'dim' is None), and "
                f"{str(folder)!r} already holds something else (an index snapshot?); persist it elsewhere, or "
                "pass dim=... so that an empty index is saved."
            )
        try:
            text = json.dumps({"metric": self.metric, "backend": self.backend, "index_options": self.index_options})
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"'index_options' must be JSON to persist a store with no index yet ({exc}); "
                                    "pass dim=... so that an empty index is saved.") from exc
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{_EMPTY_MARK}.partial"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, folder / _EMPTY_MARK)

    @classmethod
    def from_persist_path(
        cls, persist_path: str, fs: Any = None, *, device: str = "auto", **kwargs: Any
    ) -> GPUPromptVectorStore:
        """Load a store saved by :meth:`persist` (``device``, ``backend`` and ``index_options`` apply to
        the load, over the saved settings; other ``kwargs`` go to the constructor).

        Raises:
            SnapshotError: the snapshot is missing, truncated or tampered with.
            InvalidInputError: ``persist_path`` is not a usable folder path (see :meth:`persist`).
            ConfigurationError: a load option the index refuses.
        """
        _check_local_fs(fs)
        persist_path = check_path(persist_path, "persist_path")
        from gpuprompt.index import load_index

        mark = Path(persist_path) / _EMPTY_MARK
        if mark.is_file():  # a store persisted before it got a node: the same empty store
            try:
                saved = json.loads(mark.read_text(encoding="utf-8"))
                settings = {"metric": saved["metric"], "backend": saved["backend"],
                            "index_options": dict(saved["index_options"])}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise SnapshotError(f"{str(mark)!r} is not a readable empty-store record ({exc}); persist the "
                                    "store again.") from exc
            return cls(**{**settings, "device": device, **kwargs})
        options = dict(kwargs.pop("index_options", None) or {})
        if "backend" in kwargs:
            options["backend"] = kwargs.pop("backend")
        return cls(index=load_index(persist_path, device=device, **options), **kwargs)

    @classmethod
    def from_persist_dir(
        cls, persist_dir: str = DEFAULT_PERSIST_DIR, namespace: str = _DEFAULT_NAMESPACE, fs: Any = None, **kwargs: Any
    ) -> GPUPromptVectorStore:
        """Load the store that ``StorageContext.persist(persist_dir)`` saved under ``namespace``.

        Raises:
            SnapshotError: the snapshot is missing, truncated or tampered with.
            InvalidInputError: ``namespace`` is not a plain name (empty, ``.``/``..``, or holding
                ``/``, ``\\`` or NUL: it would read outside ``persist_dir``), or ``persist_dir`` is
                not a usable folder path.
        """
        check_path_name(namespace, "namespace", fix="Pick a name such as 'default'; it becomes part of a file name.")
        persist_dir = check_path(persist_dir, "persist_dir")
        path = os.path.join(persist_dir, f"{namespace}{_NAMESPACE_SEP}{DEFAULT_PERSIST_FNAME}")
        return cls.from_persist_path(path, fs=fs, **kwargs)


def _check_local_fs(fs: Any) -> None:
    if fs is None:
        return
    protocol = getattr(fs, "protocol", None)
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol or ())
    if not set(protocols) & {"file", "local"}:
        raise ConfigurationError(
            f"'fs' must be None or a local fsspec filesystem (got {describe(fs)}); GPUPromptVectorStore "
            "snapshots are written to the local disk."
        )
