"""The settings of ``gpuprompt serve``: one table read from the command line and the environment.

Every option is a ``--flag`` and a ``GPUPROMPT_<FLAG>`` environment variable (``--max-in-flight``
is ``GPUPROMPT_MAX_IN_FLIGHT``); a flag given on the command line wins over the environment, and
the environment over the default. The ``gpuprompt serve`` parser is built from this class, so a
flag cannot exist without its variable.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpuprompt.errors import ConfigurationError
from gpuprompt.server._config import ServerConfig

__all__ = ["ENV_PREFIX", "ServeSettings", "env_name", "flag_name", "load_settings"]

ENV_PREFIX = "GPUPROMPT_"


class ServeSettings(BaseSettings):
    """Everything ``gpuprompt serve`` can be told (each field is a flag and an environment variable)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", min_length=1, description="address to bind; 0.0.0.0 for every interface "
                      "(a builder in a container needs it; then also set an API key)")
    port: int = Field(8000, ge=0, le=65535, description="TCP port")
    api_key: str | None = Field(None, min_length=1, description="require 'Authorization: Bearer KEY' "
                                "(also 'api-key' / 'x-api-key' headers); unset: no key")
    llm_backend: Literal["auto", "vllm", "transformers", "remote"] = Field(
        "auto", description="LLM engine: vLLM when it starts, else transformers; remote with --llm-url")
    llm_url: str | None = Field(None, min_length=1, description="front an OpenAI-compatible LLM server or fleet "
                                "(vLLM, vllm-router) at this URL instead of loading the model here; "
                                "--chat-model names its tokenizer")
    max_model_len: int | None = Field(None, ge=16, description="the chat model's context window in tokens "
                                      "(unset: 2048); with --llm-url, the fleet's")
    llm_api_key: str | None = Field(None, min_length=1, description="key sent to --llm-url (unset: none)")
    chat_model: str | None = Field(None, min_length=1, description="local folder, .gguf file or hub id "
                                   "(default: bundled SmolLM2-135M-Instruct); none: no chat model and no LLM "
                                   "engine (an embeddings / rerank server; chat routes answer 404)")
    embedding_model: str | None = Field(None, min_length=1, description="local folder or hub id "
                                        "(default: bundled all-MiniLM-L6-v2)")
    device: str = Field("auto", min_length=1, description="auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps")
    embed_quantize: Literal["int8", "auto"] | None = Field(
        None, description="int8 embedder forward pass on CPU (auto: int8 on CPU only); unset: full precision")
    embed_dtype: Literal["float16", "bfloat16", "float32"] | None = Field(
        None, description="the embedder's compute dtype (bfloat16: prepacked bf16 layers on a CPU with AMX or "
        "AVX512-BF16); unset: fp16 on CUDA, fp32 elsewhere")
    embed_backend: Literal["torch", "onnx"] = Field(
        "torch", description="onnx: the fp32 embedder exported once to ONNX and run by onnxruntime on CPU "
        "(needs gpuprompt[quant]; same vectors, about 1.15x torch's speed)")
    max_body_bytes: int = Field(ServerConfig.max_body_bytes, ge=1, description="larger request bodies get 413")
    max_in_flight: int = Field(ServerConfig.max_in_flight, ge=1,
                               description="more concurrent model requests get 429 + Retry-After")
    retry_after: int = Field(ServerConfig.retry_after_s, ge=0, description="Retry-After seconds sent with 429")
    default_max_tokens: int = Field(ServerConfig.default_max_tokens, ge=1,
                                    description="tokens generated when a request names no max_tokens")
    rag_k: int = Field(ServerConfig.rag_k, ge=1, description="documents retrieved per collection chat turn")
    rerank_model: str | None = Field(None, min_length=1, description="a cross-encoder (local folder or hub id) "
                                     "serving /v1/rerank and reranking collection chat; unset: no reranking")
    rerank_quantize: Literal["int8", "auto"] | None = Field(
        None, description="int8 reranker forward pass on CPU (auto: int8 on CPU only); unset: full precision")
    rerank_dtype: Literal["float16", "bfloat16", "float32"] | None = Field(
        None, description="the reranker's compute dtype (as --embed-dtype); unset: fp16 on CUDA, fp32 elsewhere")
    rerank_backend: Literal["torch", "onnx"] = Field(
        "torch", description="onnx: the fp32 reranker exported once to ONNX and run by onnxruntime on CPU "
        "(needs gpuprompt[quant]; same scores)")
    rag_fetch_k: int | None = Field(None, ge=1, description="candidates a collection chat retrieves before "
                                    "reranking to --rag-k (with --rerank-model; unset: 4 x rag-k, at least 20)")
    max_collections: int = Field(ServerConfig.max_collections, ge=0,
                                 description="most vector collections; more get 409")
    max_collection_records: int = Field(ServerConfig.max_collection_records, ge=1,
                                        description="most records in one collection; more get 409")
    served_model_name: str | None = Field(None, min_length=1, description="the chat model's public id in "
                                          "/v1/models, responses and the 'model' requests name (vLLM's flag); "
                                          "unset: its id or folder path")
    served_embedding_model_name: str | None = Field(None, min_length=1, description="the same for the "
                                                    "embedding model")
    served_rerank_model_name: str | None = Field(None, min_length=1, description="the same for the rerank "
                                                 "model (a local folder is otherwise listed by its path)")
    any_model_name: bool = Field(False, description="serve any 'model' name instead of answering 404 "
                                 "(for builders that send a fixed name such as gpt-4o)")
    redis_url: str | None = Field(None, min_length=1, description="keep collection-chat sessions in Redis "
                                  "(redis://host:6379/0) so replicas share them; unset: in memory")
    session_ttl: float | None = Field(86_400.0, gt=0, description="seconds a Redis session lives after its "
                                      "last turn")
    vector_uri: str | None = Field(None, min_length=1, description="keep collections in Milvus (a Milvus Lite "
                                   ".db file or http://host:19530) so they outlive the server; unset: in memory")
    data_dir: str | None = Field(None, min_length=1, description="keep collections in this folder (snapshots "
                                 "plus a write-ahead log fsynced before each write is acknowledged), so they "
                                 "survive restarts and crashes; not with --vector-uri; unset: in memory")
    accept_token_ids: bool = Field(False, description="read token-id embedding input (tiktoken cl100k_base ids, "
                                   "langchain-openai's and Langflow's default) back to text; off: a 400 saying "
                                   "to send text")
    graceful_timeout: float = Field(60.0, ge=0, description="seconds SIGTERM waits for in-flight requests")
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = Field(
        "info", description="uvicorn's log level")

    def serve_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`gpuprompt.server.serve`."""
        return {
            "host": self.host,
            "port": self.port,
            "api_key": self.api_key,
            "llm_backend": self.llm_backend,
            "chat_model": self.chat_model,
            "embedding_model": self.embedding_model,
            "device": self.device,
            "embed_quantize": self.embed_quantize,
            "embed_dtype": self.embed_dtype,
            "embed_backend": self.embed_backend,
            "max_body_bytes": self.max_body_bytes,
            "max_in_flight": self.max_in_flight,
            "retry_after_s": self.retry_after,
            "default_max_tokens": self.default_max_tokens,
            "rag_k": self.rag_k,
            "rerank_model": self.rerank_model,
            "rerank_quantize": self.rerank_quantize,
            "rerank_dtype": self.rerank_dtype,
            "rerank_backend": self.rerank_backend,
            "rag_fetch_k": self.rag_fetch_k,
            "max_collections": self.max_collections,
            "max_collection_records": self.max_collection_records,
            "strict_model_names": not self.any_model_name,
            "served_model_name": self.served_model_name,
            "served_embedding_model_name": self.served_embedding_model_name,
            "served_rerank_model_name": self.served_rerank_model_name,
            "llm_url": self.llm_url,
            "llm_api_key": self.llm_api_key,
            "redis_url": self.redis_url,
            "session_ttl_s": self.session_ttl,
            "vector_uri": self.vector_uri,
            "data_dir": self.data_dir,
            "accept_token_ids": self.accept_token_ids,
            "max_model_len": self.max_model_len,
            "graceful_timeout_s": self.graceful_timeout,
            "log_level": self.log_level,
        }


def flag_name(field: str) -> str:
    """``max_in_flight`` -> ``--max-in-flight``."""
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    """``max_in_flight`` -> ``GPUPROMPT_MAX_IN_FLIGHT``."""
    return ENV_PREFIX + field.upper()


def load_settings(**given: Any) -> ServeSettings:
    """The settings in force: ``given`` (command-line flags) over ``GPUPROMPT_*`` variables over defaults.

    Raises:
        ConfigurationError: a value (flag or variable) is invalid; the message names both spellings.
    """
    try:
        return ServeSettings(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error.get("loc") else "?"
            source = flag_name(field) if field in given else env_name(field)
            problems.append(f"{source} ({flag_name(field)} / ${env_name(field)}): {error['msg']} "
                            f"(got {error.get('input')!r})")
        raise ConfigurationError("invalid serve setting: " + "; ".join(problems)) from None
