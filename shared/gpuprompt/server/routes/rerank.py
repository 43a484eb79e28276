"""The rerank routes, in the shape vLLM, infinity and text-embeddings-inference serve:
``POST /v1/rerank`` (also ``/rerank`` and ``/v2/rerank``, Cohere / Jina style) and vLLM's
``POST /score`` (``/v1/score``). Pairs of every concurrent request share the reranker's batches.

Served only with ``gpuprompt serve --rerank-model NAME``; without it these routes answer 404
naming the flag.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter
from fastapi.responses import Response

from gpuprompt.server._http import json_response
from gpuprompt.server.errors import ApiError
from gpuprompt.server.schemas.rerank import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from gpuprompt.server.state import ServerState, State

__all__ = ["router"]

router = APIRouter()

_INLINE_PAIRS = 32  # count a request's tokens on the loop thread only up to this many pairs


def _reranker(server: ServerState, model: str | None):  # noqa: ANN202 - a Reranker
    reranker = server.reranker
    if reranker is None:
        raise ApiError(
            404,
            "this server reranks nothing: start it with --rerank-model NAME (a cross-encoder: a local folder or a hub "
            "id such as cross-encoder/ms-marco-MiniLM-L-6-v2) to serve /v1/rerank and /score.",
            param="model",
            code="model_not_found",
        )
    server.check_model(model, reranker.model_id, "rerank")
    return reranker


async def _usage(reranker: object, pairs: list[tuple[str, str]]) -> RerankUsage:
    count = reranker.count_tokens  # type: ignore[attr-defined]
    tokens = await asyncio.to_thread(count, pairs) if len(pairs) > _INLINE_PAIRS else count(pairs)
    return RerankUsage(total_tokens=tokens, prompt_tokens=tokens)


@router.post("/v1/rerank", response_model=RerankResponse, tags=["rerank"])
@router.post("/rerank", response_model=RerankResponse, tags=["rerank"], include_in_schema=False)
@router.post("/v2/rerank", response_model=RerankResponse, tags=["rerank"], include_in_schema=False)
async def rerank(server: State, body: RerankRequest) -> Response:
    """Rank the documents by relevance to the query, best first (``top_n`` keeps the best)."""
    reranker = _reranker(server, body.model)
    documents = body.texts()
    started = time.perf_counter()
    hits = await reranker.arerank(body.query, documents, top_n=body.top_n)
    server.metrics.rerank_latency.observe(time.perf_counter() - started)
    server.metrics.rerank_documents.observe(len(documents))
    results = [
        RerankResult(index=hit.index, relevance_score=hit.score,
                     document=RerankDocument(text=hit.document) if body.return_documents else None)
        for hit in hits
    ]
    usage = await _usage(reranker, [(body.query, d) for d in documents])
    return json_response(RerankResponse(id=f"rerank-{uuid.uuid4().hex}", model=reranker.model_id, results=results,
                                        usage=usage))


@router.post("/score", response_model=ScoreResponse, tags=["rerank"])
@router.post("/v1/score", response_model=ScoreResponse, tags=["rerank"], include_in_schema=False)
async def score(server: State, body: ScoreRequest) -> Response:
    """The relevance score of each (``text_1``, ``text_2``) pair, in order (vLLM's score API)."""
    reranker = _reranker(server, body.model)
    pairs = body.pairs()
    started = time.perf_counter()
    scores = await reranker.ascore(pairs)
    server.metrics.rerank_latency.observe(time.perf_counter() - started)
    server.metrics.rerank_documents.observe(len(pairs))
    return json_response(ScoreResponse(
        id=f"score-{uuid.uuid4().hex}", created=int(time.time()), model=reranker.model_id,
        data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)], usage=await _usage(reranker, pairs),
    ))
