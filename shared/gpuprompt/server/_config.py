"""ServerConfig: the frozen settings of one ``gpuprompt serve`` app (limits, auth, models)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuprompt.errors import ConfigurationError, describe

__all__ = ["API_KEY_ENV", "LLM_API_KEY_ENV", "NO_MODEL", "ServerConfig"]

API_KEY_ENV = "GPUPROMPT_API_KEY"
"""The environment variable read for the API key when none is passed."""
LLM_API_KEY_ENV = "GPUPROMPT_LLM_API_KEY"
"""The environment variable read for ``llm_url``'s key when none is passed."""
NO_MODEL = "none"
"""The ``chat_model`` (``--chat-model none``) of a server that loads no chat model."""


def _int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"'{name}' must be an int >= {minimum} (got {describe(value)}).")


SERVED_NAMES = {"chat": "served_model_name", "embedding": "served_embedding_model_name",
                "rerank": "served_rerank_model_name"}
"""Each served model's kind -> the :class:`ServerConfig` field naming it publicly."""


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Everything that shapes one server app.

    Attributes:
        api_key: the key clients must send (``Authorization: Bearer KEY``, or an ``api-key`` /
            ``x-api-key`` header); None (and no ``$GPUPROMPT_API_KEY``) serves without auth.
        max_body_bytes: the largest request body accepted; larger gets 413.
        max_in_flight: most model requests (every ``POST``) served at once; more get 429 with
            ``Retry-After`` (the core's own bounded queues also answer 429 when full).
        retry_after_s: the ``Retry-After`` seconds sent with 429.
        embedding_model: the embedder to load (None: the bundled all-MiniLM-L6-v2).
        chat_model: the chat model to load (None: the bundled SmolLM2-135M-Instruct); ``"none"``
            loads no chat model and starts no LLM engine (an embeddings / rerank server): the chat,
            completion and collection chat routes then answer 404 naming ``--chat-model``.
        llm_backend: ``"auto"``, ``"vllm"`` or ``"transformers"`` (see :class:`~gpuprompt.llm.LLMConfig`).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` for both models.
        embed_quantize: None (full precision), ``"int8"`` (int8 embedder forward pass on CPU) or
            ``"auto"`` (int8 on CPU, full precision elsewhere); see
            :class:`~gpuprompt.embed.EmbedderConfig` ``quantize``.
        embed_dtype: the embedder's compute dtype (``"float16"``, ``"bfloat16"``, ``"float32"``;
            None: fp16 on CUDA, fp32 elsewhere). ``"bfloat16"`` on a CPU with AMX or AVX512-BF16
            runs prepacked bf16 layers (see :class:`~gpuprompt.embed.EmbedderConfig` ``dtype``).
        embed_backend: ``"torch"`` or ``"onnx"`` (the fp32 model exported to ONNX and run by
            onnxruntime on CPU; see :class:`~gpuprompt.embed.EmbedderConfig` ``backend``).
        default_max_tokens: tokens generated when a request names no ``max_tokens`` (the engine
            also caps it by the room left in the context window).
        rag_k: documents retrieved per question by the collection chat endpoint.
        rerank_model: a cross-encoder to serve ``POST /v1/rerank`` (``/rerank``, ``/v2/rerank``,
            ``/score``) with (a local folder or hub id); None serves no reranking (those routes
            answer 404 naming ``--rerank-model``). Collection chat then reranks its candidates.
        rerank_quantize: None, ``"int8"`` or ``"auto"`` for the reranker (see
            :class:`~gpuprompt.rerank.RerankerConfig` ``quantize``).
        rerank_dtype: the reranker's compute dtype (as ``embed_dtype``).
        rerank_backend: ``"torch"`` or ``"onnx"`` for the reranker (as ``embed_backend``).
        rag_fetch_k: candidates a collection chat retrieves before reranking down to ``rag_k``
            (with a ``rerank_model``; None: ``4 * rag_k``, at least 20).
        strict_model_names: refuse (404) a ``model`` field that does not name the endpoint's own
            served model (its served name, else its full id or last path segment); False serves any
            name with the loaded models (for tools with a fixed model name).
        served_model_name: the chat model's public id in ``/v1/models``, ``/health``, every
            response's ``model`` and the ``model`` a request must name (vLLM's
            ``--served-model-name``); None: its id (``chat_model``, a hub id or a folder path).
        served_embedding_model_name: the same for the embedding model.
        served_rerank_model_name: the same for the rerank model (infinity's and TEI's
            ``--served-model-name``): a reranker loaded from a local folder is otherwise listed
            under the folder's path.
        preload: load both models at start-up, before the port opens, so the first request is
            not slow.
        max_collections: most collections held at once; creating one more is refused (409,
            ``collection_limit_reached``) until one is deleted. Each collection holds an index
            (and, once searched, one search thread).
        max_collection_records: most records in one collection; an upsert that would pass it is
            refused (409, ``collection_full``) and stores nothing.
        llm_url: the API root of an OpenAI-compatible LLM server to front (a vLLM server, a fleet
            behind vllm-router, another ``gpuprompt serve``): the chat model then runs there
            (``LLMConfig(backend="remote")``) while templates, truncation and tool/grammar
            constraints stay here; ``chat_model`` names the served model's tokenizer. None: the
            model runs in this process.
        llm_api_key: the key sent to ``llm_url`` (None: ``$GPUPROMPT_LLM_API_KEY``, else none).
        redis_url: a Redis URL (``redis://host:6379/0``) where collection-chat sessions live, so
            replicas sharing it continue each other's conversations; None keeps them in memory.
        session_ttl_s: seconds a Redis session lives after its last turn (None: for ever).
        max_model_len: the chat model's context window in tokens (None: the engine's default,
            2,048); with ``llm_url`` set it to the fleet's (a longer one than the fleet serves is
            refused at start).
        accept_token_ids: read embedding input given as token ids (tiktoken ``cl100k_base``, what
            langchain-openai and Langflow send by default) back to text; off, such input gets a 400
            naming the client setting to change. Ids of another vocabulary usually read back to
            garbage text that cannot be told apart, so turn it on only for clients known to send
            cl100k ids. The vocabulary loads at start (``TIKTOKEN_CACHE_DIR`` offline).
        vector_uri: a Milvus URI (a Milvus Lite ``.db`` file, or ``http://host:19530``) holding the
            collections, which then outlive the server; None keeps them in memory.
        data_dir: a folder where the in-memory collections are kept (snapshots plus a write-ahead
            log fsynced before each write is acknowledged), so they survive restarts and crashes;
            one server per folder (a second one is refused). Not with ``vector_uri``. None: in
            memory only.
        checkpoint_every: acknowledged writes of one collection between two snapshots under
            ``data_dir`` (the log between them is replayed at the next start).
    """

    api_key: str | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    max_in_flight: int = 1024
    retry_after_s: int = 1
    embedding_model: str | None = None
    chat_model: str | None = None
    llm_backend: Literal["auto", "vllm", "transformers", "remote"] = "auto"
    device: str = "auto"
    embed_quantize: Literal["int8", "auto"] | None = None
    embed_dtype: Literal["float16", "bfloat16", "float32"] | None = None
    embed_backend: Literal["torch", "onnx"] = "torch"
    default_max_tokens: int = 512
    rag_k: int = 4
    rerank_model: str | None = None
    rerank_quantize: Literal["int8", "auto"] | None = None
    rerank_dtype: Literal["float16", "bfloat16", "float32"] | None = None
    rerank_backend: Literal["torch", "onnx"] = "torch"
    rag_fetch_k: int | None = None
    strict_model_names: bool = True
    served_model_name: str | None = None
    served_embedding_model_name: str | None = None
    served_rerank_model_name: str | None = None
    preload: bool = True
    max_collections: int = 64
    max_collection_records: int = 1_000_000
    llm_url: str | None = None
    llm_api_key: str | None = field(default=None, repr=False)
    redis_url: str | None = None
    session_ttl_s: float | None = 86_400.0
    vector_uri: str | None = None
    accept_token_ids: bool = False
    max_model_len: int | None = None
    data_dir: str | None = None
    checkpoint_every: int = 1000

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ConfigurationError(f"'api_key' must be None or a non-empty str (got {describe(self.api_key)}).")
        _int("max_body_bytes", self.max_body_bytes, 1)
        _int("max_in_flight", self.max_in_flight, 1)
        _int("retry_after_s", self.retry_after_s, 0)
        _int("default_max_tokens", self.default_max_tokens, 1)
        _int("rag_k", self.rag_k, 1)
        if self.rag_fetch_k is not None:
            _int("rag_fetch_k", self.rag_fetch_k, 1)
            if self.rag_fetch_k < self.rag_k:
                raise ConfigurationError(
                    f"'rag_fetch_k' ({self.rag_fetch_k}) must be at least 'rag_k' ({self.rag_k}): it is how many "
                    "candidates are reranked down to rag_k."
                )
        if self.rerank_model is not None and (not isinstance(self.rerank_model, str) or not self.rerank_model.strip()):
            raise ConfigurationError(f"'rerank_model' must be None or a non-empty str (got {describe(self.rerank_model)}).")
        for part in ("embed", "rerank"):
            dtype, quantize = getattr(self, f"{part}_dtype"), getattr(self, f"{part}_quantize")
            if dtype not in (None, "float16", "bfloat16", "float32"):
                raise ConfigurationError(f"'{part}_dtype' must be None, 'float16', 'bfloat16' or 'float32' (got "
                                         f"{describe(dtype)}).")
            if quantize is not None and dtype not in (None, "float32"):
                raise ConfigurationError(
                    f"'{part}_quantize' ({quantize!r}) and '{part}_dtype' ({dtype!r}) exclude each other "
                    f"(--{part}-quantize, --{part}-dtype): the int8 forward replaces the compute dtype. Set one."
                )
            backend = getattr(self, f"{part}_backend")
            if backend not in ("torch", "onnx"):
                raise ConfigurationError(f"'{part}_backend' must be 'torch' or 'onnx' (got {describe(backend)}).")
            if backend == "onnx" and dtype not in (None, "float32"):
                raise ConfigurationError(
                    f"'{part}_backend' ('onnx') and '{part}_dtype' ({dtype!r}) exclude each other (--{part}-backend, "
                    f"--{part}-dtype): the ONNX export runs in fp32. Set one."
                )
            if backend == "onnx" and isinstance(self.device, str) and self.device not in ("auto", "cpu"):
                raise ConfigurationError(
                    f"'{part}_backend' ('onnx') runs on the CPU only, and 'device' is {self.device!r} (--{part}-backend, "
                    "--device): drop --{part}-backend onnx (fp16 on the accelerator is faster) or use --device cpu."
                    .replace("{part}", part)
                )
        if self.rerank_quantize not in (None, "int8", "auto"):
            raise ConfigurationError(f"'rerank_quantize' must be None, 'int8' or 'auto' (got {describe(self.rerank_quantize)}).")
        if self.max_model_len is not None:
            _int("max_model_len", self.max_model_len, 16)
        _int("max_collections", self.max_collections, 0)
        _int("max_collection_records", self.max_collection_records, 1)
        _int("checkpoint_every", self.checkpoint_every, 1)
        if self.llm_backend not in ("auto", "vllm", "transformers", "remote"):
            raise ConfigurationError(
                f"'llm_backend' must be 'auto', 'vllm', 'transformers' or 'remote' (got {describe(self.llm_backend)})."
            )
        if not self.serves_chat and (self.llm_url is not None or self.llm_backend == "remote"):
            raise ConfigurationError(
                f"chat_model={self.chat_model!r} serves no chat model, but llm_url={self.llm_url!r} / "
                f"llm_backend={self.llm_backend!r} front one: drop --llm-url and --llm-backend remote, or name the "
                "fleet's chat model (its tokenizer) with --chat-model."
            )
        if self.llm_url is not None and self.llm_backend not in ("auto", "remote"):
            raise ConfigurationError(
                f"'llm_url' fronts a remote LLM server, so 'llm_backend' must be 'auto' or 'remote' "
                f"(got {self.llm_backend!r}); drop one of the two."
            )
        for name in ("llm_url", "redis_url", "vector_uri", "data_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigurationError(f"'{name}' must be None or a non-empty str (got {describe(value)}).")
        if self.data_dir is not None and self.vector_uri is not None:
            raise ConfigurationError(
                f"'data_dir' ({self.data_dir!r}) and 'vector_uri' ({self.vector_uri!r}) must not both be set: "
                "collections live either in Milvus (--vector-uri) or in memory backed by a data dir "
                "(--data-dir); drop one of the two."
            )
        if self.llm_url is not None and not self.llm_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"'llm_url' must be an http:// or https:// URL (got {self.llm_url!r}).")
        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(
                f"'redis_url' must be a redis://, rediss:// or unix:// URL (got {self.redis_url!r})."
            )
        ttl = self.session_ttl_s
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0
                                or ttl == float("inf")):
            raise ConfigurationError(f"'session_ttl_s' must be None or a finite number > 0 (got {describe(ttl)}).")
        for name in SERVED_NAMES.values():
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or not value.isprintable()
                                      or value != value.strip() or len(value) > 256):
                raise ConfigurationError(
                    f"'{name}' must be None or a printable str of 1 to 256 characters without surrounding spaces "
                    f"(got {describe(value)})."
                )
        names = [getattr(self, name) for name in SERVED_NAMES.values() if getattr(self, name) is not None]
        if len(names) != len(set(names)):
            raise ConfigurationError(f"the served model names must differ from each other (got {names}): a "
                                     "request's 'model' picks the model by its name.")
        for name in ("embedding_model", "chat_model"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(f"'{name}' must be None or a non-empty str (got {describe(value)}).")
        if self.embed_quantize not in (None, "int8", "auto"):
            raise ConfigurationError(
                f"'embed_quantize' must be None, 'int8' or 'auto' (got {describe(self.embed_quantize)})."
            )
        if not isinstance(self.device, str):
            raise ConfigurationError(f"'device' must be a str like 'auto', 'cpu' or 'cuda:0' (got {describe(self.device)}).")
        for name in ("strict_model_names", "preload", "accept_token_ids"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"'{name}' must be a bool (got {describe(getattr(self, name))}).")

    @property
    def serves_chat(self) -> bool:
        """False for ``chat_model="none"``: no chat model, no LLM engine."""
        return not (isinstance(self.chat_model, str) and self.chat_model.strip().lower() == NO_MODEL)

    def replace(self, **changes: Any) -> ServerConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def resolved_api_key(self) -> str | None:
        """The key in force: ``api_key``, else ``$GPUPROMPT_API_KEY``, else None (no auth)."""
        return self.api_key or os.environ.get(API_KEY_ENV) or None

    def rerank_options(self) -> dict[str, Any]:
        """The :class:`~gpuprompt.rerank.RerankerConfig` options of the served reranker."""
        return self._model_options(self.rerank_quantize, self.rerank_dtype, self.rerank_backend)

    def embed_options(self) -> dict[str, Any]:
        """The :class:`~gpuprompt.embed.EmbedderConfig` options of the served embedder."""
        return self._model_options(self.embed_quantize, self.embed_dtype, self.embed_backend)

    def _model_options(self, quantize: str | None, dtype: str | None, backend: str) -> dict[str, Any]:
        options: dict[str, Any] = {"device": self.device}
        if quantize is not None:
            options["quantize"] = quantize
        if dtype is not None:
            options["dtype"] = dtype
        if backend != "torch":
            options["backend"] = backend
        return options

    def llm_options(self) -> dict[str, Any]:
        """The :class:`~gpuprompt.llm.LLMConfig` options (besides the model) this config asks for."""
        window = {} if self.max_model_len is None else {"max_model_len": self.max_model_len}
        if self.llm_url is None and self.llm_backend != "remote":
            return {"backend": self.llm_backend, "device": self.device, **window}
        api_key = self.llm_api_key or os.environ.get(LLM_API_KEY_ENV) or None
        # An empty key (not None) keeps the remote backend from sending the server's own API key.
        return {"backend": "remote", "base_url": self.llm_url, "api_key": api_key or "", "device": "cpu", **window}
