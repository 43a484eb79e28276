"""The rerank routes: ``POST /v1/rerank`` (also ``/v2/rerank``) in the Cohere / Jina shape vLLM and
infinity serve; ``POST /rerank`` in that shape or in text-embeddings-inference's (a body with
``texts`` gets TEI's list of ``{index, score}``); vLLM's ``POST /score`` (``/v1/score``). Pairs of
every concurrent request share the reranker's batches.

Served only with ``gpuprompt serve --rerank-model NAME``; without it these routes answer 404
naming the flag.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from gpuprompt.server._http import json_response, until_disconnect
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
    TeiRank,
    TeiRerankRequest,
)
from gpuprompt.server.state import ServerState, State
from gpuprompt.wire import RERANK, SCORE, V1

__all__ = ["router"]

router = APIRouter()



def _reranker(server: ServerState, model: str | None):
    reranker = server.reranker
    if reranker is None:
        raise ApiError(
            404,
            "this server reranks nothing: start it with --rerank-model NAME (a cross-encoder: a local folder or a hub "
            "id such as cross-encoder/ms-marco-MiniLM-L-6-v2) to serve /v1/rerank and /score.",
            param="model",
            code="model_not_found",
        )
    server.check_model(model, "rerank")
    return reranker


async def _usage(reranker: Any, pairs: list[tuple[str, str]]) -> RerankUsage:
    tokens = await reranker.acount_tokens(pairs)  # off the loop unless quick
    return RerankUsage(total_tokens=tokens, prompt_tokens=tokens)


async def _ranked(server: ServerState, reranker: Any, query: str, documents: list[str], top_n: int | None) -> list:
    started = time.perf_counter()
    hits = await reranker.arerank(query, documents, top_n=top_n)
    server.metrics.rerank_latency.observe(time.perf_counter() - started)
    server.metrics.rerank_documents.observe(len(documents))
    return hits


@router.post(V1 + RERANK, response_model=RerankResponse, tags=["rerank"])
@router.post("/v2/rerank", response_model=RerankResponse, tags=["rerank"], include_in_schema=False)
async def rerank(server: State, body: RerankRequest, request: Request) -> Response:
    """Rank the documents by relevance to the query, best first (``top_n`` keeps the best). A client
    that goes away takes its pairs that are still queued out of the queue."""
    reranker = _reranker(server, body.model)
    documents = body.texts()
    hits = await until_disconnect(request, _ranked(server, reranker, body.query, documents, body.top_n))
    if isinstance(hits, Response):
        return hits  # the client went away (nobody reads it)
    results = [
        RerankResult(index=hit.index, relevance_score=hit.score,
                     document=RerankDocument(text=hit.document) if body.return_documents else None)
        for hit in hits
    ]
    usage = await _usage(reranker, [(body.query, d) for d in documents])
    return json_response(RerankResponse(id=f"rerank-{uuid.uuid4().hex}", model=server.served_name("rerank"),
                                        results=results, usage=usage), exclude_none=True)


@router.post(RERANK, include_in_schema=False)
async def rerank_any(server: State, request: Request, payload: dict[str, Any] = Body(...)) -> Response:  # noqa: B008 - FastAPI's way
    """``/v1/rerank``'s request and answer, or text-embeddings-inference's when the body has ``texts``."""
    tei = "texts" in payload and "documents" not in payload
    try:
        body = TeiRerankRequest.model_validate(payload) if tei else RerankRequest.model_validate(payload)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in exc.errors(include_url=False)]) from None
    if isinstance(body, RerankRequest):
        return await rerank(server, body, request)
    reranker = _reranker(server, None)
    if body.raw_scores and reranker.activation != "identity":
        raise ApiError(400, f"raw_scores=true asks for logits before the model's activation, and this server's "
                            f"reranker returns {reranker.activation}-activated scores only; send raw_scores=false.",
                       param="raw_scores", code="unsupported_value")
    hits = await until_disconnect(request, _ranked(server, reranker, body.query, body.texts, None))
    if isinstance(hits, Response):
        return hits
    ranks = [TeiRank(index=h.index, score=h.score, text=h.document if body.return_text else None) for h in hits]
    return Response(f"[{','.join(r.model_dump_json(exclude_none=True) for r in ranks)}]",
                    media_type="application/json")


@router.post(SCORE, response_model=ScoreResponse, tags=["rerank"])
@router.post(V1 + SCORE, response_model=ScoreResponse, tags=["rerank"], include_in_schema=False)
async def score(server: State, body: ScoreRequest, request: Request) -> Response:
    """The relevance score of each (``text_1``, ``text_2``) pair, in order (vLLM's score API)."""
    reranker = _reranker(server, body.model)
    pairs = body.pairs()
    started = time.perf_counter()
    scores = await until_disconnect(request, reranker.ascore(pairs))
    if isinstance(scores, Response):
        return scores
    server.metrics.rerank_latency.observe(time.perf_counter() - started)
    server.metrics.rerank_documents.observe(len(pairs))
    return json_response(ScoreResponse(
        id=f"score-{uuid.uuid4().hex}", created=int(time.time()), model=server.served_name("rerank"),
        data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)], usage=await _usage(reranker, pairs),
    ))
