"""RAGPipeline: retrieve -> assemble context -> generate, with per-stage timings.

Every stage goes through the shared batchers (embedder, index, engine), so many concurrent sessions
are served together; the prompt keeps a stable prefix so the engine's prefix cache hits turn after
turn, and the session's history embeddings are never recomputed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuprompt.batching import check_priority
from gpuprompt.bridge import run_sync
from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, describe
from gpuprompt.llm._types import MAX_TOKENS_LIMIT
from gpuprompt.rag._retrieve import Retrieval, check_retrieval, lexical_capable
from gpuprompt.validation import check_int, check_number, check_str, check_text, fail

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache, Turn
    from gpuprompt.embed import Embedder
    from gpuprompt.index import Hit, IndexLike
    from gpuprompt.llm import LLMEngine, Usage
    from gpuprompt.protocols import RerankerLike

__all__ = ["DEFAULT_SYSTEM_PROMPT", "RAGAnswer", "RAGPipeline", "StageTimings", "format_facts"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful customer-support assistant for an online clothing shop. Answer the customer's "
    "question in one or two sentences, using only the product facts given with the question. If the "
    "facts do not answer it, say so."
)


@dataclass(frozen=True)
class StageTimings:
    """Seconds spent in each stage of one answer.

    Attributes:
        embed_s: embedding the question (batched; a cache hit if asked before).
        retrieve_s: the vector search (batched with concurrent searches).
        context_s: picking the session's history window (on the device, no re-encoding).
        generate_s: LLM generation (batched with concurrent requests).
        total_s: the whole answer, recording the turn included.
        rerank_s: reranking the retrieved candidates with the cross-encoder (batched with
            concurrent calls); 0 without a reranker.
    """

    embed_s: float
    retrieve_s: float
    context_s: float
    generate_s: float
    total_s: float
    rerank_s: float = 0.0


@dataclass(frozen=True)
class RAGAnswer:
    """One answer with its sources and timings.

    Attributes:
        session_id: the conversation it belongs to.
        question: the customer's question.
        answer: the generated answer.
        sources: the retrieved records that were given to the model, best first (with a reranker:
            in its order, each ``score`` the cross-encoder's).
        history: the earlier turns that were given to the model, chronological.
        usage: the engine's token counts.
        finish_reason: the engine's finish reason.
        timings: per-stage seconds.
    """

    session_id: str
    question: str
    answer: str
    sources: list[Hit]
    history: list[Turn]
    usage: Usage
    finish_reason: str
    timings: StageTimings


def format_facts(hits: Sequence[Hit]) -> str:
    """Render retrieved records as a numbered fact list for the prompt."""
    return "\n".join(f"[{i + 1}] {hit.document or ''}".rstrip() for i, hit in enumerate(hits))


MAX_K = 2**31 - 1
"""The largest ``k`` accepted (fewer records than ``k`` simply return them all)."""


class RAGPipeline:
    """Answer questions in sessions over an index of documents: a :class:`~gpuprompt.VectorIndex`,
    a :class:`~gpuprompt.index.MilvusIndex`, or any :class:`~gpuprompt.index.IndexLike`.

    Example:
        >>> from gpuprompt import RAGPipeline, VectorIndex, get_runtime
        >>> rt = get_runtime()
        >>> embedder, llm = rt.embedder(), rt.llm()
        >>> docs = ["Aurora dress: red, 100% cotton, shrinks 3% at 40 C, 49 EUR."]
        >>> index = VectorIndex(embedder.dim)
        >>> index.add(None, embedder.embed(docs), documents=docs)
        >>> rag = RAGPipeline(index, llm, embedder=embedder)
        >>> reply = rag.answer("customer-1", "Will the red dress shrink?")
        >>> reply.answer, reply.sources[0].document, reply.timings.generate_s

    Args:
        index: the knowledge base (vectors from ``embedder``, documents stored as text).
        llm: the generation engine.
        embedder: embeds questions (default: the runtime's shared embedder).
        reranker: a cross-encoder (a :class:`~gpuprompt.Reranker`, or any
            :class:`~gpuprompt.protocols.RerankerLike`) that reorders ``fetch_k`` retrieved
            candidates and keeps the best ``k``; None keeps the index's order.
        fetch_k: candidates retrieved for the reranker (default ``max(20, 4 * k)``); needs ``reranker``.
        retrieval: ``"dense"`` (the question's embedding), ``"lexical"`` (BM25 over the stored
            documents: exact codes and names) or ``"hybrid"`` (both, fused), or a
            :class:`~gpuprompt.rag.Retrieval`; lexical and hybrid need an index with a lexical leg.
        alpha: hybrid only: weighted fusion with this dense weight (1 dense only, 0 lexical only);
            None fuses by reciprocal rank.
        memory: the sessions' history (default: a new :class:`~gpuprompt.ContextCache` over
            ``embedder``).
        system_prompt: the fixed instructions; kept first so the prompt prefix is stable.
        k: documents retrieved per question.
        history_turns: most earlier turns put in the prompt.
        history_tokens: token budget for those turns (None: no budget).
        max_tokens: most tokens generated per answer.
        temperature: sampling temperature (0 = greedy).
    """

    def __init__(
        self,
        index: IndexLike,
        llm: LLMEngine,
        *,
        embedder: Embedder | None = None,
        memory: ContextCache | None = None,
        reranker: RerankerLike | None = None,
        fetch_k: int | None = None,
        retrieval: str | Retrieval = "dense",
        alpha: float | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        k: int = 4,
        history_turns: int = 6,
        history_tokens: int | None = None,
        max_tokens: int = 128,
        temperature: float = 0.0,
    ) -> None:
        check_int(k, "k", min=1, max=MAX_K, error=ConfigurationError)
        check_int(history_turns, "history_turns", min=0, max=MAX_K, error=ConfigurationError)
        check_int(history_tokens, "history_tokens", min=1, max=MAX_TOKENS_LIMIT, allow_none=True, error=ConfigurationError)
        check_int(max_tokens, "max_tokens", min=1, max=MAX_TOKENS_LIMIT, error=ConfigurationError)
        temperature = check_number(temperature, "temperature", min=0.0, max=100.0, error=ConfigurationError)
        check_str(system_prompt, "system_prompt", error=ConfigurationError)
        from gpuprompt.index._protocol import check_index

        check_index(index)
        _check_component("llm", llm, ("agenerate",), "a gpuprompt LLMEngine")
        _check_component("embedder", embedder, ("aembed_tensor",), "a gpuprompt Embedder or None", optional=True)
        _check_component("memory", memory, ("awindow", "aextend"), "a gpuprompt ContextCache or None", optional=True)
        _check_component("reranker", reranker, ("arerank",), "a gpuprompt Reranker or None", optional=True)
        check_int(fetch_k, "fetch_k", min=1, max=MAX_K, allow_none=True, error=ConfigurationError)
        if fetch_k is not None and reranker is None:
            raise ConfigurationError(
                f"'fetch_k' ({fetch_k}) is how many candidates a reranker reorders, but no reranker was given: pass "
                "reranker=..., or drop fetch_k (then k records are retrieved)."
            )
        if not isinstance(retrieval, Retrieval):
            retrieval = check_retrieval(retrieval, alpha=alpha, error=ConfigurationError)
        elif alpha is not None:
            raise ConfigurationError("'alpha' is part of the Retrieval given: set it there, or pass retrieval='hybrid'.")
        lexical_capable(index, retrieval.mode)
        if embedder is None:
            from gpuprompt.runtime import get_runtime

            embedder = get_runtime().embedder()
        if memory is None:
            from gpuprompt.context import ContextCache

            memory = ContextCache(embedder)
        self.index = index
        self.llm = llm
        self.embedder = embedder
        self.memory = memory
        self.reranker = reranker
        self.fetch_k = fetch_k
        self.retrieval = retrieval
        self.system_prompt = system_prompt
        self.k = k
        self.history_turns = history_turns
        self.history_tokens = history_tokens
        self.max_tokens = max_tokens
        self.temperature = temperature

    def __repr__(self) -> str:
        return f"<RAGPipeline k={self.k} history_turns={self.history_turns} index={self.index!r}>"

    def messages(self, question: str, hits: Sequence[Hit], history: Sequence[Turn]) -> list[dict[str, Any]]:
        """The chat prompt: fixed system instructions, the history, then facts + question.

        The retrieved facts go in the last user message (not the system message) so that the
        prefix ``system + history`` stays the same from one turn to the next and the engine's
        prefix cache serves it.
        """
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}]
        messages.extend(turn.as_message() for turn in history)
        messages.append({"role": "user", "content": f"Product facts:\n{format_facts(hits)}\n\nQuestion: {question}"})
        return messages

    async def aanswer(
        self,
        session_id: str,
        question: str,
        *,
        k: int | None = None,
        filter: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        priority: int = 0,
        retrieval: Retrieval | None = None,
    ) -> RAGAnswer:
        """Answer ``question`` in session ``session_id`` and record the turn.

        ``retrieval`` overrides the pipeline's retrieval mode for this question (a checked
        :class:`~gpuprompt.rag.Retrieval`, from :func:`~gpuprompt.rag.check_retrieval`).

        Raises:
            InputTypeError: ``session_id`` or ``question`` is not a non-empty str.
            FilterError: ``filter`` is malformed.
            ContextLengthError: the prompt does not fit even after dropping history.
        """
        from gpuprompt.llm import GenerationRequest
        from gpuprompt.llm._types import affinity_key

        _check_text("session_id", session_id)
        _check_text("question", question)
        # None means "the pipeline's default"; 0 or a bool is a mistake, never a silent default.
        k = self.k if k is None else check_int(k, "k", min=1, max=MAX_K)
        max_tokens = self.max_tokens if max_tokens is None else check_int(max_tokens, "max_tokens", min=1, max=MAX_TOKENS_LIMIT)
        priority = check_priority(priority)
        if retrieval is None:
            retrieval = self.retrieval
        elif not isinstance(retrieval, Retrieval):
            raise InputTypeError(f"'retrieval' must be a gpuprompt.rag.Retrieval or None (got {describe(retrieval)}).")
        else:
            lexical_capable(self.index, retrieval.mode, error=InvalidInputError)
        started = time.perf_counter()
        query = None if retrieval.mode == "lexical" else await self.embedder.aembed_tensor([question], priority=priority)
        embedded = time.perf_counter()
        fetch = k if self.reranker is None else max(k, self.fetch_k or max(20, 4 * k))
        if retrieval.mode == "dense":
            hits = (await self.index.asearch(query, fetch, filter=filter))[0]
        elif retrieval.mode == "lexical":
            hits = (await self.index.alexical_search([question], fetch, filter))[0]  # type: ignore[attr-defined]
        else:
            hits = (await self.index.ahybrid_search(  # type: ignore[attr-defined]
                query, [question], fetch, filter, **retrieval.fusion_options()))[0]
        retrieved = time.perf_counter()
        if self.reranker is not None and hits:
            ranked = await self.reranker.arerank(question, [hit.document or "" for hit in hits], top_n=k)
            hits = [dataclasses.replace(hits[r.index], score=r.score) for r in ranked]
        reranked = time.perf_counter()
        history = await self.memory.awindow(
            session_id, query=question, max_turns=self.history_turns, max_tokens=self.history_tokens
        )
        contextualised = time.perf_counter()
        request = GenerationRequest(
            messages=self.messages(question, hits, history),
            max_tokens=max_tokens,
            temperature=self.temperature,
            priority=priority,
            truncate="left",
            session_id=affinity_key(session_id),  # a remote fleet keeps the session on one replica
        )
        result = await self.llm.agenerate(request)
        generated = time.perf_counter()
        answer = result.text.strip()
        await self.memory.aextend(session_id, [("user", question), ("assistant", answer)])
        finished = time.perf_counter()
        return RAGAnswer(
            session_id=session_id,
            question=question,
            answer=answer,
            sources=list(hits),
            history=list(history),
            usage=result.usage,
            finish_reason=result.finish_reason,
            timings=StageTimings(
                embed_s=embedded - started,
                retrieve_s=retrieved - embedded,
                context_s=contextualised - reranked,
                generate_s=generated - contextualised,
                total_s=finished - started,
                rerank_s=reranked - retrieved,
            ),
        )

    def answer(
        self,
        session_id: str,
        question: str,
        *,
        k: int | None = None,
        filter: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        priority: int = 0,
        retrieval: Retrieval | None = None,
    ) -> RAGAnswer:
        """Sync :meth:`aanswer`; works from any thread, with or without an event loop of its own
        (the work runs on gpuprompt's one background loop, :mod:`gpuprompt.bridge`)."""
        return run_sync(
            self.aanswer(session_id, question, k=k, filter=filter, max_tokens=max_tokens, priority=priority,
                         retrieval=retrieval)
        )


def _check_component(name: str, value: Any, methods: tuple[str, ...], expected: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not all(callable(getattr(value, method, None)) for method in methods):
        raise fail(name, expected, value, error=ConfigurationError)


def _check_text(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InputTypeError(f"'{name}' must be a non-empty str (got {describe(value)}).")
    check_text(value, name)
