"""ServerState: what the routes of one app serve (the config, the models, the memory, the
collections, the answer cache, the metrics), kept as ``app.state.gpuprompt`` and handed to each
route by the :data:`State` dependency."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, Request

from gpuprompt.answer_cache import DEFAULT_MAX_ENTRIES, DEFAULT_TTL_SECONDS
from gpuprompt.errors import ConfigurationError
from gpuprompt.server._collections import Collections
from gpuprompt.server._config import SERVED_NAMES, ServerConfig
from gpuprompt.server._metrics import Metrics
from gpuprompt.server.errors import ApiError

if TYPE_CHECKING:
    from gpuprompt.answer_cache import AnswerCache
    from gpuprompt.context import ContextCache
    from gpuprompt.embed import Embedder
    from gpuprompt.llm import LLMEngine
    from gpuprompt.rerank import Reranker

__all__ = ["State", "ServerState", "server_state"]



class ServerState:
    """The state behind the routes of one app.

    Args:
        config: the server's settings.
        embedder: the embedder to serve (default: the runtime's shared one for the config).
        llm: the engine to serve (default: the runtime's shared one for the config; none when the
            config's ``chat_model`` is ``"none"``).
        memory: the conversation memory of collection chat and the sessions routes (default: a
            new ContextCache, in Redis with ``config.redis_url``).
        reranker: the reranker of ``/v1/rerank`` (default: the runtime's for ``config.rerank_model``,
            or none).
    """

    def __init__(
        self,
        config: ServerConfig,
        embedder: Embedder | None = None,
        llm: LLMEngine | None = None,
        memory: ContextCache | None = None,
        reranker: Reranker | None = None,
    ) -> None:
        from gpuprompt.runtime import get_runtime

        self.config = config
        runtime = get_runtime()
        if embedder is None:
            embedder = runtime.embedder(config.embedding_model, **config.embed_options())
        if not config.serves_chat and llm is not None:
            raise ConfigurationError(
                f"chat_model={config.chat_model!r} serves no chat model, but an engine was passed as 'llm' "
                f"({llm!r}); pass no llm, or leave chat_model unset."
            )
        if llm is None and config.serves_chat:
            llm = runtime.llm(config.chat_model, **config.llm_options())
        if reranker is None and config.rerank_model is not None:
            reranker = runtime.reranker(config.rerank_model, **config.rerank_options())
        if memory is None:
            from gpuprompt.context import ContextCache

            store = None
            if config.redis_url is not None:
                from gpuprompt.context.stores import RedisStore

                store = RedisStore(config.redis_url, ttl_s=config.session_ttl_s)
            memory = ContextCache(embedder, store=store)  # this app's own sessions
        self.embedder = embedder
        self.llm: LLMEngine | None = llm
        """The chat engine, or None for ``--chat-model none`` (see :meth:`require_llm`)."""
        self.memory = memory
        self.reranker = reranker
        self.collections = Collections(
            embedder=embedder,
            llm=llm,
            memory=memory,
            device=config.device,
            rag_k=config.rag_k,
            reranker=reranker,
            rag_fetch_k=config.rag_fetch_k,
            max_tokens=config.default_max_tokens,
            max_collections=config.max_collections,
            max_records=config.max_collection_records,
            vector_uri=config.vector_uri,
            data_dir=config.data_dir,
            checkpoint_every=config.checkpoint_every,
        )
        self.answers: AnswerCache[Any] = runtime.answer_cache(
            embedder, max_entries=DEFAULT_MAX_ENTRIES, ttl_seconds=DEFAULT_TTL_SECONDS)
        self.metrics = Metrics(
            embedder=lambda: self.embedder,
            llm=lambda: self.llm,
            memory=lambda: self.memory,
            collections=self.collections.indexes,
        )
        self.started = time.time()
        self.loaded = False

    def require_llm(self) -> LLMEngine:
        """The chat engine; a 404 naming ``--chat-model`` when the server serves none."""
        if self.llm is None:
            raise ApiError(
                404,
                f"this server serves no chat model (started with --chat-model {self.config.chat_model}): it answers "
                "embeddings, rerank, collection search and sessions only; restart it without --chat-model none "
                "(the bundled SmolLM2-135M-Instruct) or with --chat-model NAME to serve chat, completions and "
                "collection chat.",
                param="model",
                code="model_not_found",
            )
        return self.llm

    def served_name(self, kind: Literal["chat", "embedding", "rerank"]) -> str:
        """The public id of the served ``kind`` model: its ``--served-...-name``, else its id (the
        chat model's needs the engine: see :meth:`require_llm`; the rerank model's a reranker)."""
        given = getattr(self.config, SERVED_NAMES[kind])
        if given is not None:
            return given
        if kind == "chat":
            return self.require_llm().model_name
        if kind == "embedding":
            return self.embedder.model_id
        assert self.reranker is not None
        return self.reranker.model_id

    def names(self, requested: str, kind: Literal["chat", "embedding", "rerank"]) -> bool:
        """Whether ``requested`` names the served ``kind`` model: its served name when one is set,
        else its full id or the id's last path segment."""
        served = self.served_name(kind)
        if requested == served:
            return True
        return getattr(self.config, SERVED_NAMES[kind]) is None and requested == served.rstrip("/").rsplit("/", 1)[-1]

    def served_kinds(self) -> list[Literal["chat", "embedding", "rerank"]]:
        """The kinds of the served models, in ``/v1/models``' order: chat (none with ``--chat-model
        none``), embedding, then rerank (when one is loaded)."""
        kinds: list[Literal["chat", "embedding", "rerank"]] = [] if self.llm is None else ["chat"]
        kinds.append("embedding")
        if self.reranker is not None:
            kinds.append("rerank")
        return kinds

    def check_model(self, requested: str | None, kind: Literal["chat", "embedding", "rerank"]) -> str:
        """The public id of the served ``kind`` model, after refusing a ``model`` that does not name
        it (unless the config allows any name): its served name when one is set, else its full id
        or the id's last path segment.

        Raises:
            ApiError: 404 ``model_not_found``.
        """
        served = self.served_name(kind)
        if requested is None or not self.config.strict_model_names or self.names(requested, kind):
            return served
        raise ApiError(
            404,
            f"'model' must name the served {kind} model {served!r} (got {requested!r}); GET /v1/models lists "
            "the served models.",
            param="model",
            code="model_not_found",
        )

    async def count_tokens(self, texts: list[str]) -> list[int]:
        """Token counts of texts under the embedder's tokenizer (capped at its max length), off the
        loop unless quick."""
        return await self.embedder.acount_tokens(texts)


def server_state(request: Request) -> ServerState:
    """The :class:`ServerState` of the app serving ``request``."""
    return request.app.state.gpuprompt


State = Annotated[ServerState, Depends(server_state)]
"""A route's parameter type for the app's state (``async def route(server: State, ...)``)."""
