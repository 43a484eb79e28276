"""``POST /v1/embeddings``: OpenAI's embeddings route over the batched, cached embedder."""

from __future__ import annotations

import asyncio
import functools
import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpuprompt.server._http import json_response, until_disconnect
from gpuprompt.server._token_ids import decode_token_ids
from gpuprompt.server.errors import ApiError
from gpuprompt.server.schemas.base import UsageModel
from gpuprompt.server.schemas.service import EmbeddingItem, EmbeddingRequest, EmbeddingResponse
from gpuprompt.server.state import State
from gpuprompt.wire import EMBEDDINGS, V1, encode_vectors

__all__ = ["router"]

router = APIRouter()


@router.post(V1 + EMBEDDINGS, response_model=EmbeddingResponse, tags=["openai"])
@router.post(EMBEDDINGS, response_model=EmbeddingResponse, tags=["openai"], include_in_schema=False)  # infinity's path
async def embeddings(server: State, body: EmbeddingRequest, request: Request) -> Response:
    """Embed a text or a list of texts (batched with every concurrent request). A client that goes
    away takes its texts that are still queued out of the queue."""
    name = server.check_model(body.model, "embedding")
    texts = [body.input] if isinstance(body.input, str) else body.input
    if any(not isinstance(t, str) for t in texts):
        # Token ids of tiktoken (langchain-openai's default): read back to text only when exact.
        ids = [texts] if all(isinstance(t, int) for t in texts) else texts
        texts = await asyncio.to_thread(
            functools.partial(decode_token_ids, ids, accept=server.config.accept_token_ids)
        )
    if body.dimensions is not None:
        dim = (await server.embedder.aload()).dim  # loads the model off the loop if not preloaded
        if body.dimensions != dim:
            raise ApiError(
                400,
                f"'dimensions' must be {dim}, the model's dimension (got {body.dimensions}); this server does "
                "not shorten embeddings.",
                param="dimensions",
                code="invalid_value",
            )
    started = time.perf_counter()
    vectors = await until_disconnect(request, server.embedder.aembed(texts))
    if isinstance(vectors, Response):
        return vectors  # the client went away (nobody reads it)
    server.metrics.embedding_latency.observe(time.perf_counter() - started)
    server.metrics.embedding_inputs.observe(len(texts))
    tokens = sum(await server.count_tokens(texts))
    if body.encoding_format == "base64":
        items = [EmbeddingItem(index=i, embedding=encode_vectors(row)) for i, row in enumerate(vectors)]
    else:
        items = [EmbeddingItem(index=i, embedding=row) for i, row in enumerate(vectors.tolist())]
    return json_response(
        EmbeddingResponse(data=items, model=name,
                          usage=UsageModel(prompt_tokens=tokens, total_tokens=tokens))
    )
