"""LangChain ``VectorStore`` over gpuprompt's VectorIndex (pre-filtering, upsert, MMR, safe snapshots).

The adapter converts LangChain documents to index records and back; search, filtering, MMR,
batching of concurrent queries and persistence all live in the core index (in process, or a
server collection through :class:`gpuprompt.remote.RemoteIndex`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprompt.bridge import off_loop
from gpuprompt.errors import ConfigurationError, InputTypeError, describe
from gpuprompt.validation import (
    check_real_matrix,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from typing_extensions import Self

from langchain_gpuprompt._embeddings import GPUPromptEmbeddings

if TYPE_CHECKING:
    from gpuprompt.index import Hit, IndexLike
from langchain_gpuprompt._vectorstore_hybrid import GPUPromptRetriever, HybridStoreMixin
from langchain_gpuprompt._vectorstore_inputs import (  # noqa: I001 - kept compact: this file is at its size limit
    _check_ids, _check_query, _check_score_threshold, _clamp01, _faiss_filter, _from_documents,
    _hit_document, _identity, _no_kwargs, _prepare, _record_document, _scored, _search_kwargs, _snapshot_path, _vector,
)

__all__ = ["GPUPromptVectorStore"]

_UNSET = object()  # the default of an index option: any value given is one an in-process index takes


class GPUPromptVectorStore(HybridStoreMixin, VectorStore):
    """Drop-in LangChain vector store backed by a gpuprompt index: a :class:`~gpuprompt.VectorIndex`
    (the default, in process) or a :class:`~gpuprompt.index.MilvusIndex` passed as ``index=``.

    Works with any LangChain ``Embeddings``; with :class:`GPUPromptEmbeddings` the query
    embedding stays on the device and concurrent searches are coalesced into batched index
    searches. Filters use the core's dict language, so a LangChain user's ``{"color": "red"}``
    just works, as do ``{"price": {"$lt": 50}}``, ``{"$or": [...]}`` and friends; a field's bare list
    means one of its values, as in FAISS (``{"color": ["red", "blue"]}``). Filters are
    applied before the top-k cut: a search always returns ``min(k, matching documents)`` hits.
    Scores are higher-is-better (cosine similarity for the default metric).

    Setup:
        .. code-block:: bash

            pip install "gpuprompt[langchain]"

    Instantiate:
        .. code-block:: python

            from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptVectorStore

            store = GPUPromptVectorStore(GPUPromptEmbeddings())

    Add documents (ids upsert):
        .. code-block:: python

            from langchain_core.documents import Document

            store.add_documents(
                [
                    Document(page_content="red summer dress", metadata={"color": "red", "price": 40}),
                    Document(page_content="blue denim jeans", metadata={"color": "blue", "price": 60}),
                ],
                ids=["p1", "p2"],
            )

    Search:
        .. code-block:: python

            store.similarity_search("something red to wear", k=1)
            # [Document(id='p1', metadata={'color': 'red', 'price': 40}, page_content='red summer dress')]
            store.similarity_search("clothes", k=5, filter={"price": {"$lt": 50}})
            # [Document(id='p1', metadata={'color': 'red', 'price': 40}, page_content='red summer dress')]

    Retriever:
        .. code-block:: python

            retriever = store.as_retriever(search_type="mmr", search_kwargs={"k": 4, "fetch_k": 20})

    Hybrid and lexical search (exact codes, names, error numbers: BM25 over the stored documents,
    fused with the vectors under the same filter; no extra flag when adding):
        .. code-block:: python

            store.as_retriever(search_type="hybrid", search_kwargs={"k": 4, "filter": {"size": "M"}})
            store.as_retriever(search_type="hybrid", search_kwargs={"k": 4, "alpha": 0.3})  # weighted
            store.as_retriever(search_type="lexical", search_kwargs={"k": 4})  # instead of BM25Retriever

    Persist (no pickle: nothing on the load path can execute code):
        .. code-block:: python

            store.save_local("kb")
            store = GPUPromptVectorStore.load_local("kb", GPUPromptEmbeddings())

    Remote mode (the index is a collection of a running ``gpuprompt serve``, shared by every
    worker process; filters, MMR, upserts, deletes, async and typed errors as in process):
        .. code-block:: python

            store = GPUPromptVectorStore(
                GPUPromptEmbeddings(base_url="http://127.0.0.1:8000"),  # or any Embeddings
                base_url="http://127.0.0.1:8000", api_key="...", collection="kb",
            )
            # or set GPUPROMPT_URL (and GPUPROMPT_API_KEY) and pass collection="kb" only

        ``delete()`` without ids drops the server collection; ``save_local`` writes a local
        snapshot of its records. ``backend``, ``device`` and index options are refused there.

    Args:
        embedding: the LangChain embeddings used for documents and queries.
        index: an existing core index to wrap, any :class:`~gpuprompt.index.IndexLike` such as
            ``MilvusIndex(384, uri="kb.db")`` (its metric then applies).
        metric: ``"cosine"`` (default), ``"ip"`` or ``"l2"``; with ``index``, the index's own (another is refused).
        backend: ``"auto"``, ``"faiss"`` or ``"torch"``.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        base_url: a running ``gpuprompt serve`` whose collection is the index (remote mode).
        api_key: its API key (None reads ``GPUPROMPT_API_KEY`` when the server comes from ``GPUPROMPT_URL``).
        collection: the server collection (remote mode; the server is ``base_url`` or ``GPUPROMPT_URL``).
        timeout: remote mode: seconds a request to the server may wait for an answer (None reads
            ``GPUPROMPT_TIMEOUT``, else 60); a silent server raises ``RequestTimeoutError``.
        **index_options: further :class:`~gpuprompt.VectorIndex` options (``index_factory``, ...).

    Raises:
        ConfigurationError: an option the core index would refuse (checked now, by the core, so it
            never fails the first add instead); ``index`` is not an :class:`~gpuprompt.index.IndexLike`;
            a server without a collection or the reverse, or an in-process option with a server;
            ``backend``, ``device`` or index options next to an ``index`` (they would be ignored).
    """

    def __init__(
        self,
        embedding: Embeddings,
        *,
        index: IndexLike | None = None,
        metric: str | None = None,
        backend: str = "auto",
        device: str = "auto",
        base_url: str | None = None,
        api_key: str | None = None,
        collection: str | None = None,
        timeout: float | None = None,
        **index_options: Any,
    ) -> None:
        if not isinstance(embedding, Embeddings):
            raise InputTypeError(
                "'embedding' must be a langchain_core Embeddings, e.g. GPUPromptEmbeddings() "
                f"(got {describe(embedding)})."
            )
        from gpuprompt.index import VectorIndex, check_index
        from gpuprompt.runtime import connect_index

        check_index(index, allow_none=True)
        if "dim" in index_options:
            raise ConfigurationError(
                f"'dim' is not an option of GPUPromptVectorStore (got dim={describe(index_options['dim'])}): the "
                "dimension is taken from the embeddings' first vectors."
            )
        given_metric, metric = metric, "cosine" if metric is None else metric
        options: dict[str, Any] = {"metric": metric, "backend": backend, "device": device, **index_options}
        local = {"backend": (backend, "auto"), "device": (device, "auto")}
        local.update((name, (value, _UNSET)) for name, value in index_options.items())
        remote = connect_index(base_url, api_key, collection, owner="GPUPromptVectorStore", index=index,
                               metric=given_metric, timeout=timeout, local_options=local)
        if remote is not None:
            index = remote  # connects at first use
        elif index is None:
            # The core checks the options now, so a bad one fails here rather than at the first add,
            # when the index is built (the dimension is only known then). Loads nothing.
            VectorIndex.check_options(**options)
        self.embedding = embedding
        self._index: IndexLike | None = index
        self._metric = index.metric if index is not None else metric
        self._index_options = options
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        count = len(self._index) if self._index is not None else 0
        return f"<GPUPromptVectorStore {type(self.embedding).__name__} metric={self._metric!r} count={count}>"

    # ------------------------------------------------------------------ plumbing
    @property
    def embeddings(self) -> Embeddings:
        """The embeddings used for documents and queries."""
        return self.embedding

    @property
    def index(self) -> IndexLike | None:
        """The core index (None until the first vectors fix its dimension)."""
        return self._index

    def ensure_index(self, dim: int) -> IndexLike:
        """The core index, created with this store's options for ``dim`` if it does not exist yet."""
        if self._index is None:
            with self._lock:
                if self._index is None:
                    from gpuprompt.index import VectorIndex

                    self._index = VectorIndex(dim, **self._index_options)
        return self._index

    @property
    def _device_embeddings(self) -> GPUPromptEmbeddings | None:
        embedding = self.embedding
        # Remote embeddings come back as host arrays: their tensors would only import torch here.
        if isinstance(embedding, GPUPromptEmbeddings) and not embedding.remote:
            return embedding
        return None

    def embed_documents_matrix(self, texts: list[str]) -> Any:
        """``texts`` embedded as an ``(n, dim)`` matrix (a device tensor with gpuprompt embeddings)."""
        device = self._device_embeddings
        if device is not None:
            return device.embed_tensor(texts)
        return check_real_matrix(self.embedding.embed_documents(texts), "embeddings")

    async def aembed_documents_matrix(self, texts: list[str]) -> Any:
        """Async :meth:`embed_documents_matrix` (batched with other tasks)."""
        device = self._device_embeddings
        if device is not None:
            return await device.aembed_tensor(texts)
        return check_real_matrix(await self.embedding.aembed_documents(texts), "embeddings")

    def embed_query_matrix(self, query: str) -> Any:
        """``query`` embedded as a ``(1, dim)`` matrix (a device tensor with gpuprompt embeddings),
        with the query prefix (``query_instruction``), as ``embed_query`` embeds it."""
        _check_query(query)
        device = self._device_embeddings
        if device is not None:
            return device.embed_query_tensor([query])
        return check_real_matrix([self.embedding.embed_query(query)], "embedding")

    async def aembed_query_matrix(self, query: str) -> Any:
        """Async :meth:`embed_query_matrix`."""
        _check_query(query)
        device = self._device_embeddings
        if device is not None:
            return await device.aembed_query_tensor([query])
        return check_real_matrix([await self.embedding.aembed_query(query)], "embedding")

    def _text_index(self) -> Any:
        """The index when it embeds query text itself in one request (a server collection searched
        with that server's own embeddings: :class:`gpuprompt.protocols.TextSearchLike`), else None.

        The hits equal embedding the query here and searching by vector: the server embeds it with
        the same model; only the round trip of the vector is saved.
        """
        from gpuprompt.protocols import TextSearchLike

        embedding, index = self.embedding, self._index
        if not (isinstance(embedding, GPUPromptEmbeddings) and embedding.remote and isinstance(index, TextSearchLike)):
            return None
        client = getattr(index, "client", None)
        if client is None or client.config.base_url != embedding.base_url:
            return None
        return index

    def _embedder_identity(self) -> str | None:
        """The core embedder's identity (model, quantisation), recorded by the index at the first
        add: vectors of another gpuprompt embedder are then refused (``EmbedderMismatchError``).
        None for other Embeddings classes, whose vectors the index cannot tell apart."""
        embedding = self.embedding
        return embedding.embedder.identity if isinstance(embedding, GPUPromptEmbeddings) else None

    def _embedding_dim(self) -> int:
        device = self._device_embeddings
        if device is not None:
            return device.embedder.dim
        return len(self.embedding.embed_query("dimension probe"))

    # ------------------------------------------------------------------ writes
    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str | None] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed ``texts`` and upsert them (an existing id is replaced, never duplicated).

        Args:
            texts: the texts to add.
            metadatas: one JSON-serialisable dict per text (or None).
            ids: one id per text; None (or a None entry) gets a generated uuid4 hex id.

        Returns:
            The ids, in order.

        Raises:
            InvalidInputError: lengths differ, or an item has the wrong type; nothing is stored.
        """
        _no_kwargs("add_texts", kwargs)
        texts, metadatas, ids = _prepare(texts, metadatas, ids)
        if not texts:
            return []
        vectors = self.embed_documents_matrix(texts)
        index = self.ensure_index(int(vectors.shape[1]))
        return index.add(ids, vectors, documents=texts, metadatas=metadatas, embedder=self._embedder_identity())

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str | None] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Async :meth:`add_texts`: embedding is batched with other tasks; the index write is the
        core's ``aadd``, never on the event loop."""
        _no_kwargs("aadd_texts", kwargs)
        texts, metadatas, ids = _prepare(texts, metadatas, ids)
        if not texts:
            return []
        vectors = await self.aembed_documents_matrix(texts)
        index = self.ensure_index(int(vectors.shape[1]))
        return await index.aadd(ids, vectors, documents=texts, metadatas=metadatas, embedder=self._embedder_identity())

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        """Upsert ``documents``; ids come from ``ids=...``, else from each ``Document.id``."""
        texts, metadatas, ids = _from_documents(documents, kwargs)
        return self.add_texts(texts, metadatas, ids=ids, **kwargs)

    async def aadd_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        """Async :meth:`add_documents`."""
        texts, metadatas, ids = _from_documents(documents, kwargs)
        return await self.aadd_texts(texts, metadatas, ids=ids, **kwargs)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete documents by id (missing ids are ignored); ``ids=None`` deletes everything.

        Returns:
            True (the store no longer holds any of ``ids``).
        """
        _no_kwargs("delete", kwargs)
        if ids is not None:
            ids = _check_ids(ids)
        if self._index is None:
            return True
        if ids is None:
            self._index.clear()
        elif ids:
            self._index.delete(ids)
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Async :meth:`delete`, off the event loop (a cancelled call deletes all or nothing)."""
        return await off_loop(self.delete, ids, **kwargs)

    # ------------------------------------------------------------------ reads
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in the order asked; missing ids are skipped."""
        ids = _check_ids(ids)
        if self._index is None or not ids:
            return []
        return [_record_document(record) for record in self._index.get(ids)]

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """Async :meth:`get_by_ids`, off the event loop."""
        return await off_loop(self.get_by_ids, ids)

    # ------------------------------------------------------------------ similarity search
    def similarity_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents most similar to ``query`` (among those matching ``filter``).

        Args:
            query: the query text.
            k: how many documents to return.
            filter: a metadata filter in the core's dict language.
            **kwargs: ``fetch_k`` is accepted for drop-in compatibility with FAISS and ignored
                (the index pre-filters, so it never needs to over-fetch by hand).
        """
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter=filter, **kwargs)]

    async def asimilarity_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """Async :meth:`similarity_search`: concurrent searches run as one batched index search."""
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, filter=filter, **kwargs)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Like :meth:`similarity_search`, with each document's score (higher is more similar:
        cosine similarity, inner product, or ``1 / (1 + squared L2)`` by metric)."""
        filter = _search_kwargs(kwargs, filter)
        text_index = self._text_index()
        if text_index is not None:  # one request: the server embeds and searches
            self.embedding.embedder.load()  # the served model is checked once (a cached answer after that)
            return _scored(text_index.search_text(self.embedding._query(query), k, filter=filter)[0])
        vectors = self.embed_query_matrix(query)
        return _scored(self._search(vectors, k, filter))

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Async :meth:`similarity_search_with_score`."""
        filter = _search_kwargs(kwargs, filter)
        text_index = self._text_index()
        if text_index is not None:  # one request: the server embeds and searches
            await self.embedding.embedder.aload()
            return _scored((await text_index.asearch_text(self.embedding._query(query), k, filter=filter))[0])
        vectors = await self.aembed_query_matrix(query)
        index = self.ensure_index(int(vectors.shape[1]))
        return _scored((await index.asearch(vectors, k, filter=filter))[0])

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents most similar to an embedding vector."""
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter=filter, **kwargs)]

    async def asimilarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """Async :meth:`similarity_search_by_vector`."""
        filter = _search_kwargs(kwargs, filter)
        vectors = _vector(embedding)
        index = self.ensure_index(int(vectors.shape[1]))
        return [doc for doc, _ in _scored((await index.asearch(vectors, k, filter=filter))[0])]

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Like :meth:`similarity_search_by_vector`, with scores (higher is more similar)."""
        filter = _search_kwargs(kwargs, filter)
        return _scored(self._search(_vector(embedding), k, filter))

    def as_retriever(self, **kwargs: Any) -> GPUPromptRetriever:
        """A retriever over this store: LangChain's search types (``similarity``,
        ``similarity_score_threshold``, ``mmr``) and ``hybrid`` / ``lexical`` (see :meth:`hybrid_search`)."""
        tags = kwargs.pop("tags", None) or [*self._get_retriever_tags()]
        return GPUPromptRetriever(vectorstore=self, tags=tags, **kwargs)

    def _search(self, vectors: Any, k: int, filter: dict[str, Any] | None) -> list[Hit]:
        index = self.ensure_index(int(vectors.shape[1]))
        return index.search(vectors, k, filter=filter)[0]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Map the index's higher-is-better score to a [0, 1] relevance.

        ``l2`` scores are already ``1 / (1 + squared L2)`` in (0, 1]: kept as they are. ``cosine``
        (and ``ip``, which equals cosine on normalised embeddings) is the similarity itself,
        clamped to [0, 1]: a negative cosine is as irrelevant as an orthogonal one.
        """
        if self._metric == "l2":
            return _identity
        return _clamp01

    def similarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Documents with relevance scores in [0, 1]; ``score_threshold`` (optional) drops the
        less relevant ones.

        Raises:
            InvalidInputError: ``score_threshold`` is not a finite number (NaN would silently drop
                every document).
        """
        _check_score_threshold(kwargs)
        return super().similarity_search_with_relevance_scores(query, k, **kwargs)

    async def asimilarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Async :meth:`similarity_search_with_relevance_scores`."""
        _check_score_threshold(kwargs)
        return await super().asimilarity_search_with_relevance_scores(query, k, **kwargs)

    # ------------------------------------------------------------------ MMR
    def max_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """Documents chosen by maximal marginal relevance (similar to ``query``, diverse among
        themselves), computed by the core index on the device.

        Args:
            query: the query text.
            k: how many documents to return.
            fetch_k: how many nearest candidates MMR chooses from.
            lambda_mult: 1 = pure similarity, 0 = maximum diversity.
            filter: a metadata filter in the core's dict language.
        """
        _no_kwargs("max_marginal_relevance_search", kwargs)
        vectors = self.embed_query_matrix(query)
        return self._mmr(vectors, k, fetch_k, lambda_mult, filter)

    async def amax_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """Async :meth:`max_marginal_relevance_search`."""
        _no_kwargs("amax_marginal_relevance_search", kwargs)
        vectors = await self.aembed_query_matrix(query)
        return await self._ammr(vectors, k, fetch_k, lambda_mult, filter)

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """:meth:`max_marginal_relevance_search` from an embedding vector."""
        _no_kwargs("max_marginal_relevance_search_by_vector", kwargs)
        return self._mmr(_vector(embedding), k, fetch_k, lambda_mult, filter)

    async def amax_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """Async :meth:`max_marginal_relevance_search_by_vector`."""
        _no_kwargs("amax_marginal_relevance_search_by_vector", kwargs)
        return await self._ammr(_vector(embedding), k, fetch_k, lambda_mult, filter)

    def _mmr(
        self, vectors: Any, k: int, fetch_k: int, lambda_mult: float, filter: dict[str, Any] | None
    ) -> list[Document]:
        index = self.ensure_index(int(vectors.shape[1]))
        hits = index.mmr(vectors[0], k=k, fetch_k=fetch_k, lambda_mult=lambda_mult, filter=_faiss_filter(filter))
        return [_hit_document(hit) for hit in hits]

    async def _ammr(
        self, vectors: Any, k: int, fetch_k: int, lambda_mult: float, filter: dict[str, Any] | None
    ) -> list[Document]:
        index = self.ensure_index(int(vectors.shape[1]))
        hits = await index.ammr(vectors[0], k=k, fetch_k=fetch_k, lambda_mult=lambda_mult,
                                filter=_faiss_filter(filter))
        return [_hit_document(hit) for hit in hits]

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str | None] | None = None,
        **kwargs: Any,
    ) -> Self:
        """A new store holding ``texts``; ``kwargs`` go to the constructor (``metric``, ...)."""
        store = cls(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    async def afrom_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str | None] | None = None,
        **kwargs: Any,
    ) -> Self:
        """Async :meth:`from_texts`."""
        store = cls(embedding, **kwargs)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store

    # ------------------------------------------------------------------ persistence
    def save_local(self, folder_path: str | Path, index_name: str = "index") -> None:
        """Save a snapshot to ``folder_path/index_name`` in the core's safe format.

        Vectors go in the backend's native format, documents and metadata as JSON, with a
        checksummed manifest; the snapshot is written aside and renamed into place, so a crash
        mid-save leaves the previous snapshot intact. Nothing is pickled.

        Raises:
            InvalidInputError: ``index_name`` is not a plain name (empty, ``.``/``..``, or holding
                ``/``, ``\\`` or NUL: it would write outside ``folder_path``), or ``folder_path`` is
                empty or holds NUL.
            InputTypeError: ``folder_path`` or ``index_name`` has the wrong type.
        """
        folder, name = _snapshot_path(folder_path, index_name)
        index = self._index if self._index is not None else self.ensure_index(self._embedding_dim())
        folder.mkdir(parents=True, exist_ok=True)
        index.save(folder / name)

    @classmethod
    def load_local(
        cls,
        folder_path: str | Path,
        embeddings: Embeddings,
        index_name: str = "index",
        *,
        allow_dangerous_deserialization: bool = False,
        device: str = "auto",
        **kwargs: Any,
    ) -> Self:
        """Load a snapshot written by :meth:`save_local`.

        Args:
            folder_path: the folder given to :meth:`save_local`.
            embeddings: the embeddings to use for queries (the same model that built it).
            index_name: the snapshot's name inside the folder.
            allow_dangerous_deserialization: accepted so code written for community FAISS runs
                unchanged; it changes nothing, because nothing on this load path is unpickled.
            device: where to load the index.
            **kwargs: ``backend`` and other index options, applied over the saved ones as the
                index loads (``VectorIndex.load``); ``metric`` must be the saved one.

        Raises:
            SnapshotError: the snapshot is missing, truncated, tampered with or of another format.
            InvalidInputError: ``index_name`` is not a plain name (it would read outside
                ``folder_path``; see :meth:`save_local`).
        """
        from gpuprompt.index import load_index

        folder, name = _snapshot_path(folder_path, index_name)
        store_args = ("metric", "base_url", "api_key", "collection", "timeout")
        load_options = {key: kwargs.pop(key) for key in list(kwargs) if key not in store_args}
        index = load_index(folder / name, device=device, **load_options)
        return cls(embeddings, index=index, **kwargs)
