"""The FastAPI app of ``gpuprompt serve``: its state, its lifespan, its middleware and its routers.

Handlers only translate HTTP <-> core calls (``routes/``); batching, caching and scheduling happen in
the core's async methods (``aembed``, ``asearch``, ``agenerate``, ``astream``, ``aanswer``), which
coalesce concurrent requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from gpuprompt._version import __version__
from gpuprompt.errors import ConfigurationError, GPUPromptError
from gpuprompt.server._config import ServerConfig
from gpuprompt.server._gate import Gate
from gpuprompt.server.errors import CatchAll, install_error_handlers
from gpuprompt.server.routes import ROUTERS
from gpuprompt.server.state import ServerState

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache
    from gpuprompt.embed import Embedder
    from gpuprompt.llm import LLMEngine
    from gpuprompt.rerank import Reranker

__all__ = ["create_app"]

logger = logging.getLogger("gpuprompt.server")


def create_app(
    config: ServerConfig | None = None,
    *,
    embedder: Embedder | None = None,
    llm: LLMEngine | None = None,
    memory: ContextCache | None = None,
    reranker: Reranker | None = None,
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
        llm: the engine to serve (default: the runtime's shared one for the config; none with
            ``chat_model="none"``).
        memory: the conversation memory of collection chat (default: a new ContextCache).
        reranker: the reranker of ``/v1/rerank`` and collection chat (default: the runtime's for
            ``rerank_model``, or none).
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
    server = ServerState(config, embedder, llm, memory, reranker)

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
                    if server.llm is not None:  # --chat-model none: no engine at all
                        await server.llm.aload()
                    if server.reranker is not None:
                        await server.reranker.aload()
                    server.loaded = True
                if config.data_dir is not None:
                    # Snapshots loaded, logs replayed and checkpointed before the port opens.
                    found = await asyncio.to_thread(collections.restore)
                    logger.info("collections in %s: %s", config.data_dir, found or "none yet")
                logger.info(
                    "serving chat model %s and embedding model %s",
                    server.llm.model_name if server.llm is not None else "none", server.embedder.model_id,
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
        version=__version__,
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
    for router in ROUTERS:
        app.include_router(router)
    return app
