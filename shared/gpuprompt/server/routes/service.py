"""The service routes: ``GET /health`` (no key needed), ``GET /metrics`` (Prometheus) and the
OpenAI model list ``GET /v1/models`` (``/v1/models/{id}``)."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter
from fastapi.responses import Response

from gpuprompt.server._config import SERVED_NAMES
from gpuprompt.server._http import json_response
from gpuprompt.server._metrics import CONTENT_TYPE_LATEST
from gpuprompt.server.errors import ApiError
from gpuprompt.server.schemas.service import HealthResponse, ModelCard, ModelList
from gpuprompt.server.state import ServerState, State
from gpuprompt.wire import HEALTH, METRICS, MODELS, V1

__all__ = ["router"]

router = APIRouter()


async def _cards(server: ServerState) -> list[ModelCard]:
    """The served models' cards, in :func:`_served`'s order, each with its length: the chat model's
    window (its tokenizer and config, read once off the loop), the others' once they are loaded."""
    lengths: list[int | None] = []
    if server.llm is not None:
        lengths.append(await asyncio.to_thread(lambda: server.require_llm().context_window))
    lengths.append(server.embedder.max_length if server.embedder.loaded else None)
    if server.reranker is not None:
        lengths.append(server.reranker.max_length if server.reranker.loaded else None)
    created = int(server.started)
    return [ModelCard(id=model, created=created, max_model_len=length)
            for model, length in zip(_served(server), lengths, strict=True)]


def _served(server: ServerState) -> list[str]:
    """The served models' ids: the chat model (none with ``--chat-model none``), the embedding model,
    then the rerank model."""
    models = [] if server.llm is None else [server.served_name("chat")]
    models.append(server.served_name("embedding"))
    if server.reranker is not None:
        models.append(server.served_name("rerank"))
    return models


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
    """One served model, by the id a request's ``model`` may name (see ``ServerState.check_model``)."""
    named = {getattr(server.config, field) for field in SERVED_NAMES.values()} - {None}
    for card in await _cards(server):
        if model_id == card.id or (card.id not in named and model_id == card.id.rsplit("/", 1)[-1]):
            return json_response(card)
    raise ApiError(404, f"model {model_id!r} is not served here; GET /v1/models lists the served models.",
                   param="model", code="model_not_found")
