"""The FastAPI app: OpenAI-compatible routes plus collections, health and metrics.

Handlers only translate HTTP <-> core calls; batching, caching and scheduling happen in the core's
async methods (``aembed``, ``asearch``, ``agenerate``, ``astream``, ``aanswer``), which coalesce
concurrent requests.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, Path, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from gpuprompt._validate import INT64_MIN
from gpuprompt.errors import ConfigurationError, ContextLengthError, InvalidInputError
from gpuprompt.server import _schemas as s
from gpuprompt.server._collections import COLLECTION_NAME_PATTERN, Collections
from gpuprompt.server._config import ServerConfig
from gpuprompt.server._errors import ApiError, CatchAll, error_event, install_error_handlers
from gpuprompt.server._gate import Gate
from gpuprompt.server._metrics import CONTENT_TYPE_LATEST, Metrics

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache
    from gpuprompt.embedder import Embedder
    from gpuprompt.llm import GenerationRequest, GenerationResult, LLMEngine

__all__ = ["create_app"]

logger = logging.getLogger("gpuprompt.server")

T = TypeVar("T")

_INLINE_TOKEN_COUNT = 64  # count tokens on the loop thread only for this many texts
_SEED_SPAN = 2**64  # per-choice seeds (seed + i) wrap around inside the int64 range
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _json(model: BaseModel, status: int = 200) -> Response:
    # pydantic-core serialises in Rust; FastAPI's response_model path would validate again.
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


def _sse(payload: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class _Server:
    """The state behind the routes of one app."""

    def __init__(
        self,
        config: ServerConfig,
        embedder: Embedder | None,
        llm: LLMEngine | None,
        memory: ContextCache | None,
    ) -> None:
        from gpuprompt.runtime import get_runtime

        self.config = config
        runtime = get_runtime()
        if embedder is None:
            embedder = runtime.embedder(config.embedding_model, device=config.device)
        if llm is None:
            llm = runtime.llm(config.chat_model, backend=config.llm_backend, device=config.device)
        if memory is None:
            from gpuprompt.context import ContextCache

            memory = ContextCache(embedder)
        self.embedder = embedder
        self.llm = llm
        self.memory = memory
        self.collections = Collections(
            embedder=embedder,
            llm=llm,
            memory=memory,
            device=config.device,
            rag_k=config.rag_k,
            max_tokens=config.default_max_tokens,
            max_collections=config.max_collections,
            max_records=config.max_collection_records,
        )
        self.metrics = Metrics(
            embedder=lambda: self.embedder,
            llm=lambda: self.llm,
            memory=lambda: self.memory,
            collections=self.collections.indexes,
        )
        self.started = time.time()
        self.loaded = False

    # ------------------------------------------------------------------ helpers
    def check_model(self, requested: str | None, served: str, kind: str) -> None:
        """Refuse a ``model`` that names neither served model (unless the config allows any)."""
        if requested is None or not self.config.strict_model_names:
            return
        if requested in (served, served.rstrip("/").rsplit("/", 1)[-1]):
            return
        raise ApiError(
            404,
            f"'model' must name the served {kind} model {served!r} (got {requested!r}); GET /v1/models lists "
            "the served models.",
            param="model",
            code="model_not_found",
        )

    async def count_tokens(self, texts: list[str]) -> list[int]:
        """Token counts of texts under the embedder's tokenizer, off the loop for big requests."""
        if len(texts) > _INLINE_TOKEN_COUNT:
            return await asyncio.to_thread(self.embedder.count_tokens, texts)
        return self.embedder.count_tokens(texts)

    def generation_request(self, body: s.ChatCompletionRequest, request_id: str, index: int = 0) -> GenerationRequest:
        """The core request for one choice of a chat completion."""
        from gpuprompt.llm import GenerationRequest

        if body.tools:
            raise ApiError(
                400,
                f"'tools' must be empty: this server does not call tools (got {len(body.tools)} tool definitions); "
                "use a framework agent with a tool-calling model instead.",
                param="tools",
                code="unsupported",
            )
        if body.logprobs:
            raise ApiError(400, "'logprobs' must be false: this server does not return log-probabilities (got true).",
                           param="logprobs", code="unsupported")
        if body.stream and body.n != 1:
            raise ApiError(400, f"'n' must be 1 when 'stream' is true (got {body.n}); stream one choice per request.",
                           param="n", code="unsupported")
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages
        ]
        response_format: dict[str, Any] | None = None
        if body.response_format is not None and body.response_format.type == "json_object":
            response_format = {"type": "json_object"}
        elif body.response_format is not None and body.response_format.type == "json_schema":
            response_format = body.response_format.model_dump(by_alias=True, exclude_none=True)
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
        seed = None
        if body.seed is not None:  # stays an int64 for every choice: (seed + i) wraps around
            seed = (body.seed + index - INT64_MIN) % _SEED_SPAN + INT64_MIN
        return GenerationRequest(
            messages=messages,
            max_tokens=body.max_completion_tokens or body.max_tokens or self.config.default_max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=seed,
            stop=stop,
            priority=body.priority,
            response_format=response_format,
            request_id=f"{request_id}-{index}",
        )


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T | Response:
    """Run ``work``; if the client disconnects first, cancel it (the engine aborts the request).

    Returns:
        The result, or a 499 response (nobody will read it) when the client went away.
    """
    task = asyncio.ensure_future(work)
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if gone:
            return Response(status_code=499)
        raise
    finally:
        watcher.cancel()
        task.cancel()


async def _all_or_none(works: list[Awaitable[T]]) -> list[T]:
    """Await every choice; if one fails (or the caller is cancelled), cancel the others in the engine."""
    tasks = [asyncio.ensure_future(work) for work in works]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


def create_app(
    config: ServerConfig | None = None,
    *,
    embedder: Embedder | None = None,
    llm: LLMEngine | None = None,
    memory: ContextCache | None = None,
    **options: Any,
) -> FastAPI:
    """Build the OpenAI-compatible FastAPI app over the batched core.

    Example:
        >>> import uvicorn
        >>> from gpuprompt.server import create_app
        >>> app = create_app(llm_backend="transformers", api_key="secret")
        >>> uvicorn.run(app, host="127.0.0.1", port=8000)     # or: gpuprompt serve

    Args:
        config: a full :class:`ServerConfig` (then pass no other option).
        embedder: the embedder to serve (default: the runtime's shared one for the config).
        llm: the engine to serve (default: the runtime's shared one for the config).
        memory: the conversation memory of collection chat (default: a new ContextCache).
        **options: :class:`ServerConfig` fields (``api_key``, ``max_body_bytes``,
            ``llm_backend``, ...).

    Returns:
        The app; models load at start-up when ``preload`` (the default), else on first use.

    Raises:
        ConfigurationError: an unknown or invalid option.
    """
    if config is not None and options:
        raise ConfigurationError("pass either 'config' or individual options to create_app, not both.")
    if config is None:
        valid = sorted(f.name for f in dataclasses.fields(ServerConfig))
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ConfigurationError(f"unknown server option(s) {unknown}; valid options: {valid}.")
        config = ServerConfig(**options)
    server = _Server(config, embedder, llm, memory)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if config.preload:
            await server.embedder.aload()
            await server.llm.aload()
            server.loaded = True
        logger.info(
            "serving chat model %s and embedding model %s", server.llm.model_name, server.embedder.model_id
        )
        yield
        server.collections.close()

    app = FastAPI(
        title="gpuprompt",
        summary="OpenAI-compatible embeddings and chat over gpuprompt's batched core, plus RAG collections.",
        version=_version(),
        lifespan=lifespan,
    )
    app.state.gpuprompt = server
    install_error_handlers(app, config.retry_after_s)
    gate_options = {
        "api_key": config.resolved_api_key(),
        "max_body_bytes": config.max_body_bytes,
        "max_in_flight": config.max_in_flight,
        "retry_after_s": config.retry_after_s,
        "metrics": server.metrics,
    }
    # Innermost first: CatchAll sits inside the Gate, so the Gate counts its 500s.
    app.add_middleware(CatchAll, retry_after_s=config.retry_after_s)  # type: ignore[arg-type]
    app.add_middleware(Gate, **gate_options)  # type: ignore[arg-type]
    _routes(app, server)
    return app


def _version() -> str:
    from gpuprompt import __version__

    return __version__


def _routes(app: FastAPI, server: _Server) -> None:  # noqa: C901 - one function keeps the route table readable
    config = server.config
    metrics = server.metrics
    name_path = Path(pattern=COLLECTION_NAME_PATTERN, description="the collection's name")
    session_path = Path(min_length=1, max_length=s.MAX_NAME_LENGTH, description="the session's id")

    # ------------------------------------------------------------------ service
    @app.get("/health", response_model=s.HealthResponse, tags=["service"])
    async def health() -> Response:
        """Liveness and what is served (no API key needed)."""
        # backend_name loads the engine: only ask once it is loaded (it is after a preload).
        backend = server.llm.backend_name if server.loaded else f"{config.llm_backend} (not loaded)"
        return _json(
            s.HealthResponse(
                chat_model=server.llm.model_name,
                embedding_model=server.embedder.model_id,
                llm_backend=backend,
                device=server.llm.device,
                collections=len(server.collections),
                in_flight=server.llm.stats().in_flight,
                uptime_s=round(time.time() - server.started, 3),
            )
        )

    @app.get("/metrics", tags=["service"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus text format: queue depths, batch sizes, latency histograms, cache hit rates."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=s.ModelList, tags=["openai"])
    async def models() -> Response:
        """The served chat and embedding models."""
        created = int(server.started)
        return _json(
            s.ModelList(
                data=[s.ModelCard(id=server.llm.model_name, created=created),
                      s.ModelCard(id=server.embedder.model_id, created=created)]
            )
        )

    @app.get("/v1/models/{model_id:path}", response_model=s.ModelCard, tags=["openai"])
    async def model(model_id: str) -> Response:
        """One served model."""
        for served in (server.llm.model_name, server.embedder.model_id):
            if model_id in (served, served.rsplit("/", 1)[-1]):
                return _json(s.ModelCard(id=served, created=int(server.started)))
        raise ApiError(404, f"model {model_id!r} is not served here; GET /v1/models lists the served models.",
                       param="model", code="model_not_found")

    # ------------------------------------------------------------------ embeddings
    @app.post("/v1/embeddings", response_model=s.EmbeddingResponse, tags=["openai"])
    async def embeddings(body: s.EmbeddingRequest) -> Response:
        """Embed a text or a list of texts (batched with every concurrent request)."""
        server.check_model(body.model, server.embedder.model_id, "embedding")
        texts = [body.input] if isinstance(body.input, str) else body.input
        if any(not isinstance(t, str) for t in texts):
            raise ApiError(
                400,
                "'input' must be a str or a list of str (got token ids); this server tokenizes itself. With "
                "LangChain's OpenAIEmbeddings pass check_embedding_ctx_length=False.",
                param="input",
                code="invalid_value",
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
        vectors = await server.embedder.aembed(texts)
        metrics.embedding_latency.observe(time.perf_counter() - started)
        metrics.embedding_inputs.observe(len(texts))
        tokens = sum(await server.count_tokens(texts))
        if body.encoding_format == "base64":
            little = vectors.astype("<f4", copy=False)
            items = [s.EmbeddingItem(index=i, embedding=base64.b64encode(row.tobytes()).decode()) for i, row in enumerate(little)]
        else:
            items = [s.EmbeddingItem(index=i, embedding=row) for i, row in enumerate(vectors.tolist())]
        return _json(
            s.EmbeddingResponse(
                data=items,
                model=server.embedder.model_id,
                usage=s.UsageModel(prompt_tokens=tokens, total_tokens=tokens),
            )
        )

    # ------------------------------------------------------------------ chat completions
    @app.post("/v1/chat/completions", response_model=s.ChatCompletionResponse, tags=["openai"])
    async def chat_completions(body: s.ChatCompletionRequest, request: Request) -> Response:
        """Chat completion; ``stream: true`` answers with server-sent events ending in ``[DONE]``.

        A client that disconnects cancels its generation inside the engine.
        """
        server.check_model(body.model, server.llm.model_name, "chat")
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        requests = [server.generation_request(body, completion_id, i) for i in range(body.n)]
        if body.stream:
            return await _stream_chat(server, request, body, requests[0], completion_id)
        started = time.perf_counter()
        outcome = await _until_disconnect(request, _all_or_none([server.llm.agenerate(r) for r in requests]))
        if isinstance(outcome, Response):
            return outcome
        results: list[GenerationResult] = list(outcome)
        for result in results:
            metrics.ttft.labels("chat").observe(result.timings.ttft_s)
            metrics.generation_latency.labels("chat").observe(result.timings.total_s)
        logger.debug("chat %s done in %.3f s", completion_id, time.perf_counter() - started)
        prompt_tokens = results[0].usage.prompt_tokens
        completion_tokens = sum(r.usage.completion_tokens for r in results)
        return _json(
            s.ChatCompletionResponse(
                id=completion_id,
                created=int(time.time()),
                model=results[0].model,
                choices=[
                    s.ChatChoice(index=i, message=s.ChatChoiceMessage(content=r.text), finish_reason=r.finish_reason)
                    for i, r in enumerate(results)
                ],
                usage=s.UsageModel(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    total_tokens=prompt_tokens + completion_tokens,
                ),
            )
        )

    # ------------------------------------------------------------------ collections
    @app.get("/v1/collections", response_model=s.CollectionList, tags=["collections"])
    async def list_collections() -> Response:
        """Every collection with its record count."""
        return _json(
            s.CollectionList(
                data=[s.CollectionInfo(name=n, count=i.count) for n, i in sorted(server.collections.indexes().items())]
            )
        )

    @app.delete("/v1/collections/{name}", tags=["collections"])
    async def drop_collection(name: str = name_path) -> Response:
        """Forget a collection, its records and its sessions."""
        await asyncio.to_thread(server.collections.drop, name)
        return Response(json.dumps({"object": "collection.deleted", "name": name, "deleted": True}),
                        media_type="application/json")

    @app.post("/v1/collections/{name}/documents", response_model=s.AddDocumentsResponse, tags=["collections"])
    async def add_documents(body: s.AddDocumentsRequest, name: str = name_path) -> Response:
        """Upsert texts (with optional ids and metadata); the server embeds them. Creates the
        collection on first use."""
        ids, count = await server.collections.upsert(name, body.documents, body.ids, body.metadatas)
        tokens = sum(await server.count_tokens(body.documents))
        return _json(
            s.AddDocumentsResponse(
                collection=name, ids=ids, count=count, usage=s.UsageModel(prompt_tokens=tokens, total_tokens=tokens)
            )
        )

    @app.post("/v1/collections/{name}/documents/delete", tags=["collections"])
    async def delete_documents(body: s.DeleteDocumentsRequest, name: str = name_path) -> Response:
        """Delete records by id (unknown ids are ignored)."""
        collection = server.collections.get(name)
        deleted = await collection.index.adelete(body.ids)
        return Response(
            json.dumps({"object": "collection.documents.deleted", "collection": name, "deleted": deleted,
                        "count": collection.index.count}),
            media_type="application/json",
        )

    @app.post("/v1/collections/{name}/query", response_model=s.QueryResponse, tags=["collections"])
    async def query(body: s.QueryRequest, name: str = name_path) -> Response:
        """Similarity search with an optional metadata filter (batched with concurrent searches)."""
        from gpuprompt.index.filters import validate_filter

        collection = server.collections.get(name)
        if body.filter is not None:
            validate_filter(body.filter)  # a bad filter fails before any model work
        vector = await server.embedder.aembed_tensor([body.query])
        hits = (await collection.index.asearch(vector, body.k, filter=body.filter))[0]
        return _json(s.QueryResponse(collection=name, hits=[_hit(h) for h in hits]))

    @app.post("/v1/collections/{name}/chat", response_model=s.CollectionChatResponse, tags=["collections"])
    async def collection_chat(body: s.CollectionChatRequest, request: Request, name: str = name_path) -> Response:
        """One RAG turn: retrieve from the collection, add the session's history, generate, remember."""
        from gpuprompt.index.filters import validate_filter

        collection = server.collections.get(name)
        if body.filter is not None:
            validate_filter(body.filter)
        try:
            outcome = await _until_disconnect(
                request,
                collection.rag.aanswer(
                    collection.session_key(body.session_id),
                    body.question,
                    k=body.k,
                    filter=body.filter,
                    max_tokens=body.max_tokens,
                ),
            )
        except ContextLengthError as exc:  # the field at fault here is the question, not 'messages'
            raise ApiError(400, str(exc), param="question", code="context_length_exceeded") from exc
        if isinstance(outcome, Response):
            return outcome
        answer = outcome
        t = answer.timings
        for stage, seconds in (("embed", t.embed_s), ("retrieve", t.retrieve_s), ("context", t.context_s),
                               ("generate", t.generate_s), ("total", t.total_s)):
            metrics.stage_latency.labels(stage).observe(seconds)
        usage = answer.usage
        return _json(
            s.CollectionChatResponse(
                id=f"ragchat-{uuid.uuid4().hex}",
                created=int(time.time()),
                model=server.llm.model_name,
                collection=name,
                session_id=body.session_id,
                answer=answer.answer,
                sources=[_hit(h) for h in answer.sources],
                history_turns=len(answer.history),
                finish_reason=answer.finish_reason,
                usage=s.UsageModel(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                                   total_tokens=usage.total_tokens),
                timings=s.StageTimingsModel(embed_s=t.embed_s, retrieve_s=t.retrieve_s, context_s=t.context_s,
                                            generate_s=t.generate_s, total_s=t.total_s),
            )
        )

    @app.delete("/v1/collections/{name}/sessions/{session_id}", tags=["collections"])
    async def clear_session(session_id: str = session_path, name: str = name_path) -> Response:
        """Forget one conversation's history in a collection."""
        collection = server.collections.get(name)
        server.memory.clear(collection.session_key(session_id))
        return Response(json.dumps({"object": "session.deleted", "collection": name, "session_id": session_id,
                                    "deleted": True}), media_type="application/json")


def _hit(hit: Any) -> s.HitModel:
    return s.HitModel(id=hit.id, score=float(hit.score), document=hit.document, metadata=dict(hit.metadata))


async def _stream_chat(
    server: _Server,
    http_request: Request,
    body: s.ChatCompletionRequest,
    request: GenerationRequest,
    completion_id: str,
) -> Response:
    """Start the stream and wait for its first delta before answering, so a request the engine
    refuses (too long, queue full, ...) still gets its proper HTTP status."""
    metrics = server.metrics
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    started = time.perf_counter()
    stream = server.llm.astream(request)
    try:
        first = await _until_disconnect(http_request, stream.__anext__())
    except StopAsyncIteration:  # pragma: no cover - the engine always ends with a final delta
        raise InvalidInputError("the engine produced no output for this request.") from None
    except BaseException:
        await stream.aclose()
        raise
    if isinstance(first, Response):  # the client left before the first token
        await stream.aclose()
        return first
    metrics.ttft.labels("chat_stream").observe(time.perf_counter() - started)
    created = int(time.time())
    model = server.llm.model_name

    def chunk(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }
        if include_usage:
            payload["usage"] = None
        return payload

    async def events() -> AsyncIterator[str]:
        # Closing the engine stream (normal end, error, or the client going away, which cancels
        # this generator) aborts the request inside the engine if it is still running.
        async with contextlib.aclosing(stream):
            try:
                yield _sse(chunk({"role": "assistant", "content": ""}, None))
                delta = first
                while True:
                    if delta.text:
                        yield _sse(chunk({"content": delta.text}, None))
                    if delta.finish_reason is not None:
                        yield _sse(chunk({}, delta.finish_reason))
                        if include_usage and delta.usage is not None:
                            u = delta.usage
                            yield _sse({
                                "id": completion_id, "object": "chat.completion.chunk", "created": created,
                                "model": model, "choices": [],
                                "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                                          "total_tokens": u.total_tokens},
                            })
                        break
                    delta = await stream.__anext__()
            except Exception as exc:  # noqa: BLE001 - headers are sent: report it in-band, as OpenAI does
                yield _sse(error_event(exc, server.config.retry_after_s))
                return
            finally:
                metrics.generation_latency.labels("chat_stream").observe(time.perf_counter() - started)
            yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=_SSE_HEADERS)

