"""``serve``: run the app under uvicorn; SIGTERM (or Ctrl+C) drains in-flight requests, then exits 0."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any, Literal

from gpuprompt.server._config import ServerConfig

__all__ = ["serve"]

logger = logging.getLogger("gpuprompt.server")


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    *,
    llm_backend: Literal["auto", "vllm", "transformers", "remote"] = "auto",
    embedding_model: str | None = None,
    chat_model: str | None = None,
    device: str = "auto",
    embed_quantize: Literal["int8", "auto"] | None = None,
    embed_dtype: Literal["float16", "bfloat16", "float32"] | None = None,
    embed_backend: Literal["torch", "onnx"] = "torch",
    max_body_bytes: int = ServerConfig.max_body_bytes,
    max_in_flight: int = ServerConfig.max_in_flight,
    retry_after_s: int = ServerConfig.retry_after_s,
    default_max_tokens: int = ServerConfig.default_max_tokens,
    rag_k: int = ServerConfig.rag_k,
    rerank_model: str | None = None,
    rerank_quantize: Literal["int8", "auto"] | None = None,
    rerank_dtype: Literal["float16", "bfloat16", "float32"] | None = None,
    rerank_backend: Literal["torch", "onnx"] = "torch",
    rag_fetch_k: int | None = None,
    strict_model_names: bool = True,
    served_model_name: str | None = None,
    served_embedding_model_name: str | None = None,
    served_rerank_model_name: str | None = None,
    max_collections: int = ServerConfig.max_collections,
    max_collection_records: int = ServerConfig.max_collection_records,
    llm_url: str | None = None,
    llm_api_key: str | None = None,
    redis_url: str | None = None,
    session_ttl_s: float | None = ServerConfig.session_ttl_s,
    vector_uri: str | None = None,
    data_dir: str | None = None,
    accept_token_ids: bool = False,
    max_model_len: int | None = None,
    graceful_timeout_s: float | None = 60.0,
    log_level: str = "info",
) -> int:
    """Serve the OpenAI-compatible API until SIGTERM / SIGINT.

    The models load before the port opens (no chat model with ``chat_model="none"``). On SIGTERM
    the server stops accepting connections, lets in-flight requests (streams included) finish for
    up to ``graceful_timeout_s``, closes the models and returns 0.

    Args:
        host: the address to bind (``0.0.0.0`` for every interface).
        port: the TCP port.
        api_key: the key clients must send as ``Authorization: Bearer KEY``; None reads
            ``$GPUPROMPT_API_KEY``, and without it the server needs no key.
        llm_backend: ``"auto"`` (vLLM when available, else transformers), ``"vllm"`` or
            ``"transformers"``.
        embedding_model: the embedder (None: the bundled all-MiniLM-L6-v2).
        chat_model: the chat model (None: the bundled SmolLM2-135M-Instruct); ``"none"`` loads no
            chat model and starts no LLM engine (embeddings / rerank only; chat routes answer 404).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        embed_quantize: None, ``"int8"`` or ``"auto"``: the embedder's ``quantize``.
        embed_dtype: the embedder's compute ``dtype`` (None: fp16 on CUDA, fp32 elsewhere).
        embed_backend: ``"torch"`` or ``"onnx"``: the embedder's ``backend``.
        rerank_dtype: the reranker's compute ``dtype``.
        rerank_backend: ``"torch"`` or ``"onnx"``: the reranker's ``backend``.
        max_body_bytes: the largest request body (413 beyond).
        max_in_flight: most concurrent model requests (429 with ``Retry-After`` beyond).
        retry_after_s: the ``Retry-After`` seconds sent with 429.
        default_max_tokens: tokens generated when a request names no ``max_tokens``.
        rag_k: documents retrieved per collection chat turn.
        strict_model_names: 404 for a ``model`` that does not name the endpoint's served model.
        served_model_name, served_embedding_model_name, served_rerank_model_name: the models'
            public ids (None: their ids); see :class:`ServerConfig`.
        max_collections: most collections held at once (409 beyond).
        max_collection_records: most records per collection (409 beyond).
        llm_url: front the OpenAI-compatible LLM server (or fleet) at this URL instead of loading
            the chat model here (``chat_model`` then names its tokenizer).
        llm_api_key: the key sent to ``llm_url`` (None: ``$GPUPROMPT_LLM_API_KEY``, else none).
        redis_url: keep collection-chat sessions in this Redis (shared by replicas).
        session_ttl_s: seconds a Redis session lives after its last turn (None: for ever).
        vector_uri: keep collections in this Milvus deployment (a Milvus Lite file or a server).
        data_dir: keep collections in this folder (snapshots plus a write-ahead log), so they survive
            restarts and kill -9; a folder another live server holds fails the start (exit 1).
        accept_token_ids: read token-id embedding input (tiktoken ``cl100k_base``) back to text.
        max_model_len: the chat model's context window (None: the engine's default); with
            ``llm_url``, the fleet's.
        graceful_timeout_s: how long SIGTERM waits for in-flight requests; None waits for ever.
        log_level: uvicorn's log level; ``"debug"`` (or ``"trace"``) also sets gpuprompt's own
            loggers to debug (for example a reply with tools that held neither prose nor a call is
            logged with the model's raw text).

    Returns:
        The exit status: 0 after a clean shutdown, 1 when the server could not start.

    Raises:
        ConfigurationError: an invalid option, or options that contradict each other
            (``data_dir`` with ``vector_uri``).
    """
    import uvicorn

    from gpuprompt.runtime import get_runtime
    from gpuprompt.server.app import create_app

    config = ServerConfig(
        api_key=api_key,
        llm_backend=llm_backend,
        embedding_model=embedding_model,
        chat_model=chat_model,
        device=device,
        embed_quantize=embed_quantize,
        embed_dtype=embed_dtype,
        embed_backend=embed_backend,
        max_body_bytes=max_body_bytes,
        max_in_flight=max_in_flight,
        retry_after_s=retry_after_s,
        default_max_tokens=default_max_tokens,
        rag_k=rag_k,
        rerank_model=rerank_model,
        rerank_quantize=rerank_quantize,
        rerank_dtype=rerank_dtype,
        rerank_backend=rerank_backend,
        rag_fetch_k=rag_fetch_k,
        strict_model_names=strict_model_names,
        served_model_name=served_model_name,
        served_embedding_model_name=served_embedding_model_name,
        served_rerank_model_name=served_rerank_model_name,
        max_collections=max_collections,
        max_collection_records=max_collection_records,
        llm_url=llm_url,
        llm_api_key=llm_api_key,
        redis_url=redis_url,
        session_ttl_s=session_ttl_s,
        vector_uri=vector_uri,
        accept_token_ids=accept_token_ids,
        max_model_len=max_model_len,
        data_dir=data_dir,
    )
    if log_level in ("debug", "trace"):
        logging.getLogger("gpuprompt").setLevel(logging.DEBUG)
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            lifespan="on",
            timeout_graceful_shutdown=graceful_timeout_s,
            access_log=log_level == "debug",
        )
    )
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal under the handlers that were in
    # place before it started; no-op handlers make that re-raise a normal return (exit status 0).
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _drained)
    # A typed refusal to start (a held data dir, an unreachable Redis, ...) is said in one line, not
    # as the traceback uvicorn logs for a failed lifespan.
    quiet = _StartupRefusal(app)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(quiet)
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits 1 when it cannot bind or start the app
        return _refused(app) or int(exc.code or 1)
    finally:
        uvicorn_log.removeFilter(quiet)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        get_runtime().shutdown()
    return 0 if server.started else (_refused(app) or 1)


class _StartupRefusal(logging.Filter):
    """Drops uvicorn's traceback of a lifespan that failed with a typed gpuprompt error."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app

    def filter(self, record: logging.LogRecord) -> bool:
        refused = getattr(self.app.state, "startup_error", None) is not None
        return not (refused and str(record.msg).startswith("Traceback"))


def _refused(app: Any) -> int:
    """2 after printing ``gpuprompt serve: <why>`` when the app refused to start; else 0."""
    error = getattr(app.state, "startup_error", None)
    if error is None:
        return 0
    print(f"gpuprompt serve: {error}", file=sys.stderr)
    return 2


def _drained(signum: int, frame: Any) -> None:
    logger.info("signal %d after draining: exiting", signum)
