"""The service routes: ``GET /health`` (no key needed), ``GET /metrics`` (Prometheus) and the
OpenAI model list ``GET /v1/models`` (``/v1/models/{id}``)."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter
from fastapi.responses import Response

from gpuprompt.server._http import json_response
from gpuprompt.server._metrics import CONTENT_TYPE_LATEST
from gpuprompt.server.errors import ApiError
from gpuprompt.server.schemas.service import HealthResponse, ModelCard, ModelList
from gpuprompt.server.state import ServerState, State
from gpuprompt.wire import HEALTH, METRICS, MODELS, V1

__all__ = ["router"]

router = APIRouter()


async def _cards(server: ServerState) -> list[ModelCard]:
    """The served models' cards, in :meth:`ServerState.served_kinds`' order, each with its length: the
    chat model's window (its tokenizer and config, read once off the loop), the others' once loaded."""
    created = int(server.started)
    return [ModelCard(id=server.served_name(kind), created=created, max_model_len=await _length(server, kind))
            for kind in server.served_kinds()]


async def _length(server: ServerState, kind: str) -> int | None:
    if kind == "chat":
        return await asyncio.to_thread(lambda: server.require_llm().context_window)
    model = server.embedder if kind == "embedding" else server.reranker
    return model.max_length if model is not None and model.loaded else None


@router.get(HEALTH, response_model=HealthResponse, tags=["service"])
async def health(server: State) -> Response:
    """Liveness and what is served (no API key needed); ``chat_model`` is null on a server started
    with ``--chat-model none``."""
    llm = server.llm
    if llm is not None:
        # backend_name loads the engine: only ask once it is loaded (it is after a preload).
        backend = llm.backend_name if server.loaded else f"{server.config.llm_backend} (not loaded)"
        device = llm.device
    else:
        from gpuprompt.device import resolve_device

        backend, device = None, resolve_device(server.config.device)
    return json_response(
        HealthResponse(
            chat_model=server.served_name("chat") if llm is not None else None,
            embedding_model=server.served_name("embedding"),
            embedder_identity=server.embedder.identity if server.loaded else None,
            rerank_model=server.served_name("rerank") if server.reranker is not None else None,
            embed_backend=server.embedder.backend if server.loaded else server.embedder.config.backend,
            rerank_backend=None if server.reranker is None else
            server.reranker.backend if server.loaded else server.reranker.config.backend,
            llm_backend=backend,
            device=device,
            collections=len(server.collections),
            in_flight=llm.stats().in_flight if llm is not None else 0,
            uptime_s=round(time.time() - server.started, 3),
        )
    )


@router.get(METRICS, tags=["service"], response_class=Response)
async def prometheus(server: State) -> Response:
    """Prometheus text format: queue depths, batch sizes, latency histograms, cache hit rates."""
    return Response(await asyncio.to_thread(server.metrics.render), media_type=CONTENT_TYPE_LATEST)


@router.get(V1 + MODELS, response_model=ModelList, tags=["openai"])
@router.get(MODELS, response_model=ModelList, tags=["openai"], include_in_schema=False)  # infinity's path
async def models(server: State) -> Response:
    """The served models: chat (unless ``--chat-model none``), embedding (and rerank, when one is loaded)."""
    return json_response(ModelList(data=await _cards(server)))


@router.get(V1 + MODELS + "/{model_id:path}", response_model=ModelCard, tags=["openai"])
@router.get(MODELS + "/{model_id:path}", response_model=ModelCard, tags=["openai"], include_in_schema=False)
async def model(server: State, model_id: str) -> Response:
    """One served model, by the id a request's ``model`` may name (``ServerState.names``)."""
    for kind, card in zip(server.served_kinds(), await _cards(server), strict=True):
        if server.names(model_id, kind):
            return json_response(card)
    raise ApiError(404, f"model {model_id!r} is not served here; GET /v1/models lists the served models.",
                   param="model", code="model_not_found")
