"""ServerConfig: the frozen settings of one ``gpuprompt serve`` app (limits, auth, models)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal

from gpuprompt.errors import ConfigurationError, describe

__all__ = ["API_KEY_ENV", "ServerConfig"]

API_KEY_ENV = "GPUPROMPT_API_KEY"
"""The environment variable read for the API key when none is passed."""


def _int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"'{name}' must be an int >= {minimum} (got {describe(value)}).")


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Everything that shapes one server app.

    Attributes:
        api_key: the key clients must send (``Authorization: Bearer KEY``, or an ``api-key`` /
            ``x-api-key`` header); None (and no ``$GPUPROMPT_API_KEY``) serves without auth.
        max_body_bytes: the largest request body accepted; larger gets 413.
        max_in_flight: most model requests (``POST /v1/...``) served at once; more get 429 with
            ``Retry-After`` (the core's own bounded queues also answer 429 when full).
        retry_after_s: the ``Retry-After`` seconds sent with 429.
        embedding_model: the embedder to load (None: the bundled all-MiniLM-L6-v2).
        chat_model: the chat model to load (None: the bundled SmolLM2-135M-Instruct).
        llm_backend: ``"auto"``, ``"vllm"`` or ``"transformers"`` (see :class:`~gpuprompt.llm.LLMConfig`).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` for both models.
        default_max_tokens: tokens generated when a request names no ``max_tokens`` (the engine
            also caps it by the room left in the context window).
        rag_k: documents retrieved per question by the collection chat endpoint.
        strict_model_names: refuse (404) a ``model`` field that does not name the endpoint's own
            served model (its full id or last path segment); False serves any name with the
            loaded models (for tools with a fixed model name).
        preload: load both models at start-up, before the port opens, so the first request is
            not slow.
        max_collections: most collections held at once; creating one more is refused (409,
            ``collection_limit_reached``) until one is deleted. Each collection holds an index
            (and, once searched, one search thread).
        max_collection_records: most records in one collection; an upsert that would pass it is
            refused (409, ``collection_full``) and stores nothing.
    """

    api_key: str | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    max_in_flight: int = 1024
    retry_after_s: int = 1
    embedding_model: str | None = None
    chat_model: str | None = None
    llm_backend: Literal["auto", "vllm", "transformers"] = "auto"
    device: str = "auto"
    default_max_tokens: int = 512
    rag_k: int = 4
    strict_model_names: bool = True
    preload: bool = True
    max_collections: int = 64
    max_collection_records: int = 1_000_000

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ConfigurationError(f"'api_key' must be None or a non-empty str (got {describe(self.api_key)}).")
        _int("max_body_bytes", self.max_body_bytes, 1)
        _int("max_in_flight", self.max_in_flight, 1)
        _int("retry_after_s", self.retry_after_s, 0)
        _int("default_max_tokens", self.default_max_tokens, 1)
        _int("rag_k", self.rag_k, 1)
        _int("max_collections", self.max_collections, 0)
        _int("max_collection_records", self.max_collection_records, 1)
        if self.llm_backend not in ("auto", "vllm", "transformers"):
            raise ConfigurationError(
                f"'llm_backend' must be 'auto', 'vllm' or 'transformers' (got {describe(self.llm_backend)})."
            )
        for name in ("embedding_model", "chat_model"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(f"'{name}' must be None or a non-empty str (got {describe(value)}).")
        if not isinstance(self.device, str):
            raise ConfigurationError(f"'device' must be a str like 'auto', 'cpu' or 'cuda:0' (got {describe(self.device)}).")
        for name in ("strict_model_names", "preload"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"'{name}' must be a bool (got {describe(getattr(self, name))}).")

    def replace(self, **changes: Any) -> ServerConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def resolved_api_key(self) -> str | None:
        """The key in force: ``api_key``, else ``$GPUPROMPT_API_KEY``, else None (no auth)."""
        return self.api_key or os.environ.get(API_KEY_ENV) or None
