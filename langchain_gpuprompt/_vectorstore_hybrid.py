"""Lexical (BM25) and hybrid search of :class:`~langchain_gpuprompt.GPUPromptVectorStore`, and the
retriever that serves them as ``search_type="lexical"`` / ``"hybrid"``.

The lexical leg is the core index's own (:class:`gpuprompt.protocols.HybridSearchLike`): a
``VectorIndex`` builds it from its stored documents at the first lexical or hybrid query and keeps
it in step with every write after that (no flag at ``from_texts``/``add_texts``, no second copy of
the corpus); a ``MilvusIndex`` keeps BM25 sparse vectors beside its vectors; a server collection
searches both on the server.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, ClassVar

from gpuprompt.errors import ConfigurationError, InvalidInputError
from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStoreRetriever

from langchain_gpuprompt._vectorstore_inputs import _check_query, _faiss_filter, _scored

__all__ = ["GPUPromptRetriever", "HybridStoreMixin"]

_HYBRID_KWARGS = frozenset({"k", "filter", "alpha", "fusion", "fetch_k", "rrf_k"})
_LEXICAL_KWARGS = frozenset({"k", "filter"})


def _check_words(query: Any) -> None:
    _check_query(query)
    if not query.strip():
        raise InvalidInputError(f"'query' must hold words for lexical or hybrid search to match (got {query!r}).")


def _check_kwargs(method: str, kwargs: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise InvalidInputError(f"{method}() got unknown keyword arguments {unknown}; it takes {sorted(allowed)}.")


class HybridStoreMixin:
    """``lexical_search`` and ``hybrid_search`` (with scores, sync and async) of the vector store."""

    _index: Any

    def ensure_index(self, dim: int) -> Any:  # pragma: no cover - provided by the store
        raise NotImplementedError

    def embed_query_matrix(self, query: str) -> Any:  # pragma: no cover - provided by the store
        raise NotImplementedError

    async def aembed_query_matrix(self, query: str) -> Any:  # pragma: no cover - provided by the store
        raise NotImplementedError

    def _text_index(self) -> Any:  # pragma: no cover - provided by the store
        raise NotImplementedError

    @property
    def _device_embeddings(self) -> Any:  # pragma: no cover - provided by the store
        raise NotImplementedError

    def _query_embedder(self) -> Any:
        """The function that embeds query texts, for the index to call in its search batch (one
        queue for the embedding and the search of concurrent callers), or None to embed here first
        (embeddings other than gpuprompt's, or no index yet)."""
        from gpuprompt.index import VectorIndex

        device = self._device_embeddings
        if device is None or not isinstance(self._index, VectorIndex):
            return None
        return device.embed_query_tensor  # a bound method: equal between calls, so the index batches them

    def _lexical_index(self) -> Any:
        index = self._index
        if index is not None and not callable(getattr(index, "lexical_search", None)):
            raise ConfigurationError(
                f"lexical and hybrid search need an index with a lexical leg (VectorIndex, MilvusIndex, a server "
                f"collection), not {type(index).__name__}; search it with search_type='similarity'."
            )
        return index

    def _one_request(self) -> Any:
        """The server collection when a text search is one request there (no query prefix to strip)."""
        text_index = self._text_index()
        if text_index is None or getattr(self.embedding, "_query_prefix", ""):  # type: ignore[attr-defined]
            return None
        return text_index

    # ------------------------------------------------------------------ lexical
    def lexical_search_with_score(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                                  **kwargs: Any) -> list[tuple[Document, float]]:
        """The ``k`` documents whose words best match ``query`` by BM25 (a drop-in for
        ``BM25Retriever``, over the store's own documents and under the same filters), with their
        BM25 scores. Documents added without text never match.

        Raises:
            InvalidInputError: an empty or blank query, ``k`` < 1, an unknown keyword.
            FilterError: a malformed filter.
        """
        filter = _faiss_filter(filter)
        _check_kwargs("lexical_search", kwargs, _LEXICAL_KWARGS)
        _check_words(query)
        index = self._lexical_index()
        if index is None:
            return []
        return _scored(index.lexical_search([query], k, filter)[0])

    async def alexical_search_with_score(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                                         **kwargs: Any) -> list[tuple[Document, float]]:
        """Async :meth:`lexical_search_with_score` (batched with concurrent searches)."""
        filter = _faiss_filter(filter)
        _check_kwargs("lexical_search", kwargs, _LEXICAL_KWARGS)
        _check_words(query)
        index = self._lexical_index()
        if index is None:
            return []
        return _scored((await index.alexical_search([query], k, filter))[0])

    def lexical_search(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                       **kwargs: Any) -> list[Document]:
        """:meth:`lexical_search_with_score` without the scores."""
        return [doc for doc, _ in self.lexical_search_with_score(query, k, filter, **kwargs)]

    async def alexical_search(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                              **kwargs: Any) -> list[Document]:
        """Async :meth:`lexical_search`."""
        return [doc for doc, _ in await self.alexical_search_with_score(query, k, filter, **kwargs)]

    # ------------------------------------------------------------------ hybrid
    def hybrid_search_with_score(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                                 **kwargs: Any) -> list[tuple[Document, float]]:
        """The ``k`` best documents for ``query`` by both legs, fused, with the fused scores.

        The dense leg (the query's embedding) and the lexical leg (BM25 over the documents) each
        fetch ``fetch_k`` candidates under the same filter. Fusion: reciprocal rank (the default,
        ``rrf_k=60``, no tuning: as ``EnsembleRetriever`` fuses), or with ``alpha`` weighted
        normalised scores, ``alpha`` in LlamaIndex's meaning (1 dense only, 0 lexical only).
        With gpuprompt embeddings over a ``VectorIndex``, the query is embedded (with the query
        instruction) in the index's search batch, together with the queries of concurrent callers.

        Args:
            query: the query text.
            k: documents returned.
            filter: a metadata filter applied to both legs.
            **kwargs: ``alpha``, ``fusion`` (``"rrf"`` | ``"weighted"``), ``fetch_k``, ``rrf_k``.

        Raises:
            InvalidInputError: a blank query, ``alpha`` outside [0, 1] or NaN, ``alpha`` with
                ``fusion="rrf"``, ``fetch_k`` < ``k``, an unknown keyword.
        """
        filter = _faiss_filter(filter)
        _check_kwargs("hybrid_search", kwargs, _HYBRID_KWARGS)
        _check_words(query)
        self._lexical_index()
        served = self._one_request()
        if served is not None:
            self.embedding.embedder.load()  # type: ignore[attr-defined]
            return _scored(served.search_text([query], k, filter, mode="hybrid", **kwargs)[0])
        embed = self._query_embedder()
        if embed is not None:
            self.embedding.embedder.load()  # type: ignore[attr-defined]  # here, not on the index's search thread
            return _scored(self._index.hybrid_search(embed, [query], k, filter, **kwargs)[0])
        vectors = self.embed_query_matrix(query)
        index = self.ensure_index(int(vectors.shape[1]))
        self._lexical_index()
        return _scored(index.hybrid_search(vectors, [query], k, filter, **kwargs)[0])

    async def ahybrid_search_with_score(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                                        **kwargs: Any) -> list[tuple[Document, float]]:
        """Async :meth:`hybrid_search_with_score` (both legs batched with concurrent searches)."""
        filter = _faiss_filter(filter)
        _check_kwargs("hybrid_search", kwargs, _HYBRID_KWARGS)
        _check_words(query)
        self._lexical_index()
        served = self._one_request()
        if served is not None:
            await self.embedding.embedder.aload()  # type: ignore[attr-defined]
            return _scored((await served.asearch_text([query], k, filter, mode="hybrid", **kwargs))[0])
        embed = self._query_embedder()
        if embed is not None:
            await self.embedding.embedder.aload()  # type: ignore[attr-defined]  # the model loads off the loop
            return _scored((await self._index.ahybrid_search(embed, [query], k, filter, **kwargs))[0])
        vectors = await self.aembed_query_matrix(query)
        index = self.ensure_index(int(vectors.shape[1]))
        self._lexical_index()
        return _scored((await index.ahybrid_search(vectors, [query], k, filter, **kwargs))[0])

    def hybrid_search(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                      **kwargs: Any) -> list[Document]:
        """:meth:`hybrid_search_with_score` without the scores."""
        return [doc for doc, _ in self.hybrid_search_with_score(query, k, filter, **kwargs)]

    async def ahybrid_search(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                             **kwargs: Any) -> list[Document]:
        """Async :meth:`hybrid_search`."""
        return [doc for doc, _ in await self.ahybrid_search_with_score(query, k, filter, **kwargs)]


class GPUPromptRetriever(VectorStoreRetriever):
    """The store's retriever: LangChain's ``VectorStoreRetriever`` (``similarity``,
    ``similarity_score_threshold``, ``mmr``) plus ``search_type="hybrid"`` (search_kwargs ``k``,
    ``filter``, ``alpha``, ``fusion``, ``fetch_k``, ``rrf_k``) and ``search_type="lexical"`` (``k``,
    ``filter``: a drop-in for ``BM25Retriever``)."""

    allowed_search_types: ClassVar[Collection[str]] = (
        "similarity", "similarity_score_threshold", "mmr", "hybrid", "lexical",
    )

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        options = self.search_kwargs | kwargs
        if self.search_type == "hybrid":
            return self.vectorstore.hybrid_search(query, **options)  # type: ignore[attr-defined, no-any-return]
        if self.search_type == "lexical":
            return self.vectorstore.lexical_search(query, **options)  # type: ignore[attr-defined, no-any-return]
        return super()._get_relevant_documents(query, run_manager=run_manager, **kwargs)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        options = self.search_kwargs | kwargs
        if self.search_type == "hybrid":
            return await self.vectorstore.ahybrid_search(query, **options)  # type: ignore[attr-defined, no-any-return]
        if self.search_type == "lexical":
            return await self.vectorstore.alexical_search(query, **options)  # type: ignore[attr-defined, no-any-return]
        return await super()._aget_relevant_documents(query, run_manager=run_manager, **kwargs)
