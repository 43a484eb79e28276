"""The FastAPI app: OpenAI-compatible routes plus collections, health and metrics.

Handlers only translate HTTP <-> core calls; batching, caching and scheduling happen in the core's
async methods (``aembed``, ``asearch``, ``agenerate``, ``astream``, ``aanswer``), which coalesce
concurrent requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Path, Request
from fastapi.responses import Response

from gpuprompt.errors import ConfigurationError, ContextLengthError, GPUPromptError
from gpuprompt.server import _schemas as s
from gpuprompt.server._cache_api import add_cache_routes
from gpuprompt.server._chat import add_generation_routes
from gpuprompt.server._collections import COLLECTION_NAME_PATTERN, Collections
from gpuprompt.server._config import ServerConfig
from gpuprompt.server._errors import ApiError, CatchAll, install_error_handlers
from gpuprompt.server._gate import Gate
from gpuprompt.server._http import json_response, until_disconnect
from gpuprompt.server._metrics import CONTENT_TYPE_LATEST, Metrics
from gpuprompt.server._records import add_record_routes
from gpuprompt.server._sessions_api import add_session_routes
from gpuprompt.server._token_ids import decode_token_ids
from gpuprompt.wire import encode_vectors

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache
    from gpuprompt.embed import Embedder
    from gpuprompt.llm import LLMEngine

__all__ = ["create_app"]

logger = logging.getLogger("gpuprompt.server")

_INLINE_TOKEN_COUNT = 64  # count tokens on the loop thread only for this many texts


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
            options = {} if config.embed_quantize is None else {"quantize": config.embed_quantize}
            embedder = runtime.embedder(config.embedding_model, device=config.device, **options)
        if llm is None:
            llm = runtime.llm(config.chat_model, **config.llm_options())
        if memory is None:
            from gpuprompt.context import ContextCache

            store = None
            if config.redis_url is not None:
                from gpuprompt.context.stores import RedisStore

                store = RedisStore(config.redis_url, ttl_s=config.session_ttl_s)
            memory = ContextCache(embedder, store=store)
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
            vector_uri=config.vector_uri,
            data_dir=config.data_dir,
            checkpoint_every=config.checkpoint_every,
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
        collections = server.collections
        app.state.startup_error = None
        try:
            try:
                # First: a data dir another server holds fails the start before any model loads.
                await asyncio.to_thread(collections.open_data_dir)
                store = server.memory.session_store
                if hasattr(store, "ping"):  # a session store on a server: unreachable fails the start, not turn 1
                    await asyncio.to_thread(store.ping)
                if config.accept_token_ids:  # load the vocabulary now: never a download inside a request
                    from gpuprompt.server._token_ids import load_encoding

                    await asyncio.wait_for(asyncio.to_thread(load_encoding), timeout=120)
                if config.vector_uri is not None:
                    found = await asyncio.to_thread(collections.restore)
                    logger.info("collections in %s: %s", config.vector_uri, found or "none yet")
                if config.preload:
                    await server.embedder.aload()
                    await server.llm.aload()
                    server.loaded = True
                if config.data_dir is not None:
                    # Snapshots loaded, logs replayed and checkpointed before the port opens.
                    found = await asyncio.to_thread(collections.restore)
                    logger.info("collections in %s: %s", config.data_dir, found or "none yet")
                logger.info(
                    "serving chat model %s and embedding model %s", server.llm.model_name, server.embedder.model_id
                )
            except GPUPromptError as exc:  # a typed refusal to start: `gpuprompt serve` says it in one line
                app.state.startup_error = exc
                raise
            yield
        finally:
            # Under a data dir: a last checkpoint of every collection, then its lock is released.
            await asyncio.to_thread(collections.close)

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
    from gpuprompt._version import __version__

    return __version__


def _routes(app: FastAPI, server: _Server) -> None:
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
        return json_response(
            s.HealthResponse(
                chat_model=server.llm.model_name,
                embedding_model=server.embedder.model_id,
                embedder_identity=server.embedder.identity if server.loaded else None,
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
        return Response(await asyncio.to_thread(metrics.render), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=s.ModelList, tags=["openai"])
    async def models() -> Response:
        """The served chat and embedding models."""
        created = int(server.started)
        return json_response(
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
                return json_response(s.ModelCard(id=served, created=int(server.started)))
        raise ApiError(404, f"model {model_id!r} is not served here; GET /v1/models lists the served models.",
                       param="model", code="model_not_found")

    # ------------------------------------------------------------------ embeddings
    @app.post("/v1/embeddings", response_model=s.EmbeddingResponse, tags=["openai"])
    async def embeddings(body: s.EmbeddingRequest) -> Response:
        """Embed a text or a list of texts (batched with every concurrent request)."""
        server.check_model(body.model, server.embedder.model_id, "embedding")
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
        vectors = await server.embedder.aembed(texts)
        metrics.embedding_latency.observe(time.perf_counter() - started)
        metrics.embedding_inputs.observe(len(texts))
        tokens = sum(await server.count_tokens(texts))
        if body.encoding_format == "base64":
            items = [s.EmbeddingItem(index=i, embedding=encode_vectors(row)) for i, row in enumerate(vectors)]
        else:
            items = [s.EmbeddingItem(index=i, embedding=row) for i, row in enumerate(vectors.tolist())]
        return json_response(
            s.EmbeddingResponse(
                data=items,
                model=server.embedder.model_id,
                usage=s.UsageModel(prompt_tokens=tokens, total_tokens=tokens),
            )
        )

    add_generation_routes(app, server)
    add_record_routes(app, server)
    add_session_routes(app, server)
    add_cache_routes(app, server)

    # ------------------------------------------------------------------ collections
    @app.get("/v1/collections", response_model=s.CollectionList, tags=["collections"])
    async def list_collections() -> Response:
        """Every collection with its record count."""
        counts = await asyncio.to_thread(server.collections.counts)  # a Milvus count is a query: off the loop
        return json_response(s.CollectionList(data=[s.CollectionInfo(name=n, count=c) for n, c in counts]))

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
        return json_response(
            s.AddDocumentsResponse(
                collection=name, ids=ids, count=count, usage=s.UsageModel(prompt_tokens=tokens, total_tokens=tokens)
            )
        )

    @app.post("/v1/collections/{name}/documents/delete", tags=["collections"])
    async def delete_documents(body: s.DeleteDocumentsRequest, name: str = name_path) -> Response:
        """Delete records by id (unknown ids are ignored)."""
        deleted, count = await server.collections.delete(name, body.ids)
        return Response(
            json.dumps({"object": "collection.documents.deleted", "collection": name, "deleted": deleted,
                        "count": count}),
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
        return json_response(s.QueryResponse(collection=name, hits=[_hit(h) for h in hits]))

    @app.post("/v1/collections/{name}/chat", response_model=s.CollectionChatResponse, tags=["collections"])
    async def collection_chat(body: s.CollectionChatRequest, request: Request, name: str = name_path) -> Response:
        """One RAG turn: retrieve from the collection, add the session's history, generate, remember."""
        from gpuprompt.index.filters import validate_filter

        collection = server.collections.get(name)
        if body.filter is not None:
            validate_filter(body.filter)
        try:
            outcome = await until_disconnect(
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
        return json_response(
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
