"""The protocols of gpuprompt: what a surface (the server, the LangChain and LlamaIndex adapters, the
pipeline) may call on a component. The in-process classes and the remote-mode clients both satisfy
them, and :func:`gpuprompt.connect` hands out one or the other; code written against these runs
unchanged in process and against a ``gpuprompt serve``::

    protocol          in process                          remote mode
    EmbedderLike      Embedder                            RemoteEmbedder      /v1/embeddings
    RerankerLike      Reranker                            RemoteReranker      /v1/rerank
    EngineLike        LLMEngine                           RemoteLLM           /v1/chat/completions, /v1/completions
    ContextLike       ContextCache                        RemoteContextCache  /v1/sessions
    AnswerCacheLike   AnswerCache                         RemoteAnswerCache   /v1/cache
    IndexLike         VectorIndex, MilvusIndex            RemoteIndex         /v1/collections/{name}/records
    TextSearchLike    (an index that embeds query text itself: RemoteIndex, one request per search)

``tests/contracts/`` runs one suite per protocol against every implementation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from gpuprompt.context._types import Turn
    from gpuprompt.index._types import Hit, Record
    from gpuprompt.llm._types import GenerationRequest, GenerationResult, StreamDelta
    from gpuprompt.rerank._types import RerankHit

__all__ = [
    "AnswerCacheLike",
    "ContextLike",
    "EmbedderLike",
    "EngineLike",
    "HybridSearchLike",
    "IndexLike",
    "RerankerLike",
    "TextSearchLike",
]


@runtime_checkable
class EmbedderLike(Protocol):
    """Texts to vectors, batched across callers: :class:`~gpuprompt.Embedder` and ``RemoteEmbedder``.

    ``embed`` returns a float32 ``(n, dim)`` numpy array; ``embed_tensor`` the same rows where the
    embedder keeps them (a device tensor in process, the array in remote mode). ``identity`` names
    the vectors' space (model and quantisation): vectors of two identities never share an index.
    """

    @property
    def model_id(self) -> str: ...

    @property
    def identity(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def load(self) -> Any: ...

    async def aload(self) -> Any: ...

    def embed(self, texts: Sequence[str], *, priority: int = 0) -> np.ndarray: ...

    async def aembed(self, texts: Sequence[str], *, priority: int = 0) -> np.ndarray: ...

    def embed_tensor(self, texts: Sequence[str], *, priority: int = 0) -> Any: ...

    async def aembed_tensor(self, texts: Sequence[str], *, priority: int = 0) -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class RerankerLike(Protocol):
    """A cross-encoder scoring (query, document) pairs, batched across callers:
    :class:`~gpuprompt.Reranker` and ``RemoteReranker``.

    ``rerank`` returns hits best first, each with ``index`` (the document's position in the call),
    ``score`` and ``document``; ``score`` scores raw pairs in order.
    """

    @property
    def model_id(self) -> str: ...

    def load(self) -> Any: ...

    async def aload(self) -> Any: ...

    def rerank(self, query: str, documents: Sequence[str], top_n: int | None = None) -> list[RerankHit]: ...

    async def arerank(self, query: str, documents: Sequence[str], top_n: int | None = None) -> list[RerankHit]: ...

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]: ...

    async def ascore(self, pairs: Sequence[tuple[str, str]]) -> list[float]: ...

    def close(self) -> None: ...


@runtime_checkable
class EngineLike(Protocol):
    """Batched generation: :class:`~gpuprompt.LLMEngine` and ``RemoteLLM``, with the core's request,
    result and stream types (tools, guided decoding, stop strings, priorities, cancellation)."""

    @property
    def model_name(self) -> str: ...

    @property
    def context_window(self) -> int: ...

    @property
    def capabilities(self) -> dict[str, Any]: ...

    def load(self) -> Any: ...

    async def aload(self) -> Any: ...

    def generate(self, requests: Sequence[GenerationRequest], *, timeout: float | None = None,
                 max_retries: int = 0) -> list[GenerationResult]: ...

    async def agenerate(self, request: GenerationRequest, *, timeout: float | None = None,
                        max_retries: int = 0) -> GenerationResult: ...

    def stream(self, request: GenerationRequest, *, timeout: float | None = None) -> Iterator[StreamDelta]: ...

    def astream(self, request: GenerationRequest, *, timeout: float | None = None) -> AsyncIterator[StreamDelta]: ...

    def count_tokens(self, messages_or_prompt: Any, *, tools: Any = None) -> int: ...

    def tokenize(self, messages_or_prompt: Any, *, tools: Any = None) -> list[int]: ...

    def detokenize(self, ids: Sequence[int]) -> str: ...

    def close(self) -> None: ...


@runtime_checkable
class ContextLike(Protocol):
    """Per-session conversation memory: :class:`~gpuprompt.ContextCache` and ``RemoteContextCache``.

    A turn to append is a ``(role, text)`` pair or a chat message dict (an assistant's
    ``tool_calls``, a tool result's ``tool_call_id``, ``name``, ``status``); ``append`` takes a
    role and a text, or one such dict with the text omitted (see :meth:`ContextCache.extend`)."""

    def append(self, session_id: str, role: Any, text: str | None = None) -> Turn: ...

    def extend(self, session_id: str, turns: Any) -> list[Turn]: ...

    async def aappend(self, session_id: str, role: Any, text: str | None = None) -> Turn: ...

    async def aextend(self, session_id: str, turns: Any) -> list[Turn]: ...

    def turns(self, session_id: str) -> list[Turn]: ...

    async def aturns(self, session_id: str) -> list[Turn]: ...

    def check_session_id(self, value: Any, name: str = "session_id") -> str: ...

    def window(self, session_id: str, query: str | None = None, **budgets: Any) -> list[Turn]: ...

    async def awindow(self, session_id: str, query: str | None = None, **budgets: Any) -> list[Turn]: ...

    def clear(self, session_id: str | None = None) -> None: ...

    async def aclear(self, session_id: str | None = None) -> None: ...


@runtime_checkable
class AnswerCacheLike(Protocol):
    """A semantic cache of answers keyed by prompt meaning: ``AnswerCache`` and ``RemoteAnswerCache``.

    Attributes:
        score_threshold: the least cosine similarity that counts as the same prompt.
        max_entries: most answers kept (a server's cache: the server's bound).
        ttl_seconds: an answer's lifetime in seconds (None: no expiry).
    """

    score_threshold: float
    max_entries: int
    ttl_seconds: float | None

    def lookup(self, prompt: str, namespace: str = "", **options: Any) -> Any: ...

    async def alookup(self, prompt: str, namespace: str = "", **options: Any) -> Any: ...

    def update(self, prompt: str, namespace: str, value: Any, **options: Any) -> None: ...

    async def aupdate(self, prompt: str, namespace: str, value: Any, **options: Any) -> None: ...

    def clear(self, namespace: str | None = None) -> None: ...

    async def aclear(self, namespace: str | None = None) -> None: ...

    def stats(self) -> Any: ...


@runtime_checkable
class IndexLike(Protocol):
    """Vectors with ids, documents and metadata; upsert, filtered search, MMR; sync and async.

    The contract (documented on :class:`~gpuprompt.VectorIndex`): ``add`` upserts; ``search``
    returns ``min(k, matches)`` hits per query, best first, scores higher-is-better by metric;
    filters are :mod:`gpuprompt.index.filters`'s language; bad input raises the typed errors of
    :mod:`gpuprompt.errors` before anything is stored; ``save(path)`` writes what
    :func:`load_index` reopens.
    """

    @property
    def dim(self) -> int: ...

    @property
    def metric(self) -> str: ...

    @property
    def count(self) -> int: ...

    def __len__(self) -> int: ...

    def add(
        self,
        ids: Sequence[str | None] | None,
        vectors: Any,
        documents: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        embedder: str | None = None,
        allow_other_embedder: bool = False,
    ) -> list[str]: ...

    def delete(self, ids: Sequence[str]) -> int: ...

    def clear(self) -> None: ...

    def get(self, ids: Sequence[str]) -> list[Record]: ...

    def ids(self, filter: Mapping[str, Any] | None = None) -> list[str]: ...

    def search(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]: ...

    def mmr(
        self, query: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, filter: Mapping[str, Any] | None = None
    ) -> list[Hit]: ...

    def search_groups(
        self, query: Any, k: int, *, group_by: str | Sequence[str], filter: Mapping[str, Any] | None = None
    ) -> list[Hit]: ...

    async def aadd(
        self,
        ids: Sequence[str | None] | None,
        vectors: Any,
        documents: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        embedder: str | None = None,
        allow_other_embedder: bool = False,
    ) -> list[str]: ...

    async def adelete(self, ids: Sequence[str]) -> int: ...

    async def aclear(self) -> None: ...

    async def aget(self, ids: Sequence[str]) -> list[Record]: ...

    async def aids(self, filter: Mapping[str, Any] | None = None) -> list[str]: ...

    async def asearch(self, queries: Any, k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]: ...

    async def ammr(
        self, query: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, filter: Mapping[str, Any] | None = None
    ) -> list[Hit]: ...

    def save(self, path: str | Path) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class TextSearchLike(Protocol):
    """An index that embeds query text itself (a capability beside :class:`IndexLike`).

    ``RemoteIndex`` has it: a text search is one request, embedded and searched on the server (the
    query text travels once, its vector never). An in-process index has no embedder of its own, so
    a surface embeds the query and calls ``search``: the same hits either way.
    """

    def search_text(self, queries: Sequence[str], k: int, filter: Mapping[str, Any] | None = None,
                    **options: Any) -> list[list[Hit]]: ...

    async def asearch_text(self, queries: Sequence[str], k: int, filter: Mapping[str, Any] | None = None,
                           **options: Any) -> list[list[Hit]]: ...


@runtime_checkable
class HybridSearchLike(Protocol):
    """An index with a lexical (BM25) leg beside its vectors (a capability beside :class:`IndexLike`).

    ``VectorIndex``, ``MilvusIndex`` and ``RemoteIndex`` have it. ``lexical_search`` ranks the
    stored documents by BM25 over the query text's words; ``hybrid_search`` runs both legs under
    the same pre-filter and fuses them (reciprocal rank by default; ``alpha`` weighs normalised
    scores, 1 = dense only, 0 = lexical only). Records stored without a document are never found
    by the lexical leg.
    """

    def lexical_search(self, texts: Sequence[str], k: int, filter: Mapping[str, Any] | None = None) -> list[list[Hit]]: ...

    async def alexical_search(self, texts: Sequence[str], k: int,
                              filter: Mapping[str, Any] | None = None) -> list[list[Hit]]: ...

    def hybrid_search(self, queries: Any, texts: Sequence[str], k: int, filter: Mapping[str, Any] | None = None,
                      **fusion: Any) -> list[list[Hit]]: ...

    async def ahybrid_search(self, queries: Any, texts: Sequence[str], k: int,
                             filter: Mapping[str, Any] | None = None, **fusion: Any) -> list[list[Hit]]: ...
