"""Lexical and hybrid search, mixed into every index with a lexical leg (VectorIndex, MilvusIndex,
RemoteIndex): the requests are checked here and go through the index's one search queue, so
concurrent hybrid searches are batched with every dense one (VectorIndex: one read lock, one filter
evaluation per distinct filter, one backend search for the dense leg; RemoteIndex: one request).

A hybrid search may pass, instead of its query vectors, the function that embeds its texts. A
VectorIndex then embeds the texts of every hybrid search of a batch in one call to it, in the batch
that searches them: a caller waits in one queue rather than in an embedder's queue and then the
index's (where each stage would see only part of the callers, and the two stages would contend for
the cores). The other indexes call it at once, for the search's own texts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import InvalidInputError
from gpuprompt.index._checks import check_filter, check_k
from gpuprompt.index._fusion import DEFAULT_RRF_K, Fusion, check_fusion, check_query_texts
from gpuprompt.index._search import SearchRequest, make_request

if TYPE_CHECKING:

    from gpuprompt.index._types import Hit

__all__ = ["HybridSearchMixin"]


class HybridSearchMixin:
    """``lexical_search`` and ``hybrid_search`` (sync and async) over the index's two legs."""

    dim: int
    metric: str
    _embeds_in_batch: bool = False  # a VectorIndex embeds deferred texts in its batch (see embed_deferred)

    def _ensure_lexical(self) -> None:  # pragma: no cover - provided by the index
        """Make the lexical leg ready (build it, or learn the remote collection's layout)."""
        raise NotImplementedError

    async def _aensure_lexical(self) -> None:  # pragma: no cover - provided by the index
        raise NotImplementedError

    def _submit(self, request: SearchRequest) -> Any:  # pragma: no cover - provided by the index
        raise NotImplementedError

    @staticmethod
    def _lexical_request(texts: Any, k: Any, filter: Any) -> SearchRequest:
        checked = check_query_texts(texts)
        k = check_k(k)
        key = check_filter(filter)
        import numpy as np

        return SearchRequest(np.empty((0, 1), dtype=np.float32), k, filter if key else None, key,
                             texts=checked, mode="lexical")

    @staticmethod
    def _hybrid_plan(texts: Any, k: Any, filter: Any, alpha: Any, fusion: Any, fetch_k: Any,
                     rrf_k: Any) -> tuple[list[str], int, Fusion]:
        checked = check_query_texts(texts)
        k = check_k(k)
        check_filter(filter)
        return checked, k, check_fusion(k, alpha=alpha, fusion=fusion, fetch_k=fetch_k, rrf_k=rrf_k)

    def _hybrid_request(self, queries: Any, filter: Any, plan: tuple[list[str], int, Fusion]) -> SearchRequest:
        checked, k, fusion = plan
        if callable(queries):
            import numpy as np

            if not checked:
                queries = np.empty((0, self.dim), dtype=np.float32)
            elif self._embeds_in_batch:
                key = check_filter(filter)
                return SearchRequest(np.empty((0, self.dim), dtype=np.float32), k, filter if key else None, key,
                                     texts=checked, mode="hybrid", fusion=fusion, embed=queries)
            else:
                queries = queries(list(checked))
        request = make_request(queries, k, filter, dim=self.dim, metric=self.metric)
        rows = int(request.queries.shape[0])
        if rows != len(checked):
            raise InvalidInputError(
                f"'texts' must hold one text per query vector ({rows}) (got {len(checked)}): the lexical leg of each "
                "query searches its own text."
            )
        request.texts, request.mode, request.fusion = checked, "hybrid", fusion
        return request

    def lexical_search(self, texts: Sequence[str], k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]:
        """The ``k`` best records for each query text by BM25 over the stored documents, best first
        (records without a document never match; fewer than ``k`` when fewer documents hold a query
        word). The filter is a pre-filter, as for :meth:`search`.

        Raises:
            InputTypeError: ``texts`` is not a list of str (a bare str is refused).
            InvalidInputError: an empty or blank text, a lone surrogate, ``k`` < 1.
            FilterError: a malformed filter.
        """
        request = self._lexical_request(texts, k, filter)
        if not request.texts:
            return []
        self._ensure_lexical()
        return self._submit(request).result()  # type: ignore[no-any-return]

    async def alexical_search(self, texts: Sequence[str], k: int,
                              filter: Mapping[str, Any] | None = None) -> list[list[Hit]]:
        """Async :meth:`lexical_search` (batched with other searches; the loop never runs one)."""
        request = self._lexical_request(texts, k, filter)
        if not request.texts:
            return []
        await self._aensure_lexical()
        return await asyncio.wrap_future(self._submit(request))  # type: ignore[no-any-return]

    def hybrid_search(
        self,
        queries: Any,
        texts: Sequence[str],
        k: int,
        filter: Mapping[str, Any] | None = None,
        *,
        alpha: float | None = None,
        fusion: str | None = None,
        fetch_k: int | None = None,
        rrf_k: int = DEFAULT_RRF_K,
    ) -> list[list[Hit]]:
        """The ``k`` best records for each (query vector, query text) pair: the dense and the lexical
        leg each fetch ``fetch_k`` candidates under the same pre-filter, fused by reciprocal rank
        (default) or, with ``alpha``, by weighted normalised scores (see :mod:`gpuprompt.index._fusion`).

        Args:
            queries: ``(q, dim)`` query vectors, as for :meth:`search`; or a function that embeds a
                list of query texts into such a matrix (one row per text, in order). A VectorIndex
                calls it in the batch that searches them, once for the texts of every concurrent
                hybrid search that passed the same function (a bound method such as
                ``embedder.embed_tensor`` compares equal between calls; a new lambda per call does
                not batch): the embedding is batched with the search, in one queue. It runs on the
                index's search thread, so it must not search this index itself.
            texts: one query text per vector (the lexical leg's query).
            k: hits per query.
            filter: a metadata filter applied to both legs, or None.
            alpha: None for rank fusion; else the dense leg's weight, 1 = dense only, 0 = lexical only.
            fusion: ``"rrf"`` or ``"weighted"`` (None: weighted when ``alpha`` is given, else rrf).
            fetch_k: candidates per leg (default ``max(20, 4 * k)``).
            rrf_k: the RRF constant.

        Returns:
            One list of :class:`Hit` per query, best first; ``score`` is the fused score.

        Raises:
            InvalidInputError: ``alpha`` outside [0, 1] or NaN, ``alpha`` with ``fusion="rrf"``, an
                unknown fusion, ``fetch_k`` < ``k``, blank texts, one text per vector not given.
        """
        plan = self._hybrid_plan(texts, k, filter, alpha, fusion, fetch_k, rrf_k)
        self._ensure_lexical()
        request = self._hybrid_request(queries, filter, plan)
        if request.embed is None and request.queries.shape[0] == 0:
            return []
        return self._submit(request).result()  # type: ignore[no-any-return]

    async def ahybrid_search(
        self,
        queries: Any,
        texts: Sequence[str],
        k: int,
        filter: Mapping[str, Any] | None = None,
        *,
        alpha: float | None = None,
        fusion: str | None = None,
        fetch_k: int | None = None,
        rrf_k: int = DEFAULT_RRF_K,
    ) -> list[list[Hit]]:
        """Async :meth:`hybrid_search`: batched with every concurrent search."""
        plan = self._hybrid_plan(texts, k, filter, alpha, fusion, fetch_k, rrf_k)
        await self._aensure_lexical()
        if callable(queries) and not self._embeds_in_batch:
            # embedding at once (another index) runs the caller's function: keep it off the loop
            request = await asyncio.to_thread(self._hybrid_request, queries, filter, plan)
        else:
            request = self._hybrid_request(queries, filter, plan)
        if request.embed is None and request.queries.shape[0] == 0:
            return []
        return await asyncio.wrap_future(self._submit(request))  # type: ignore[no-any-return]


