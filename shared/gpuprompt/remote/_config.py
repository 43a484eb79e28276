"""Where a remote class talks to: :class:`RemoteConfig`, and :func:`resolve_remote`, which turns an
adapter's ``base_url`` / ``api_key`` (or ``GPUPROMPT_URL`` / ``GPUPROMPT_API_KEY``) into one, or
into None for in-process mode, refusing options that only configure a local model."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuprompt.errors import ConfigurationError, describe

__all__ = ["ENV_API_KEY", "ENV_TIMEOUT", "ENV_URL", "RemoteConfig", "resolve_remote"]

ENV_URL = "GPUPROMPT_URL"
"""The environment variable naming the server of remote mode when ``base_url`` is not passed."""
ENV_API_KEY = "GPUPROMPT_API_KEY"
"""The environment variable holding its API key when ``api_key`` is not passed."""
ENV_TIMEOUT = "GPUPROMPT_TIMEOUT"
"""The environment variable holding the timeout (seconds) of remote calls when ``timeout`` is not passed."""
DEFAULT_READ_TIMEOUT_S = 60.0
"""Most seconds between two pieces of an answer outside generation, by default."""
DEFAULT_GENERATION_TIMEOUT_S = 600.0
"""Most seconds between two pieces of a streamed generation, by default (a queued request may wait
this long for its first token)."""

_MAX_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass(frozen=True, kw_only=True)
class RemoteConfig:
    """One server and how to talk to it; equal configs share one pooled client per process.

    Attributes:
        base_url: ``http(s)://host:port`` or its ``/v1`` root (a path prefix before ``/v1`` is kept).
        api_key: sent as ``Authorization: Bearer ...`` (``gpuprompt serve --api-key``); None for none.
        connect_timeout: most seconds to open a connection (a refused one fails at once).
        read_timeout: most seconds between two pieces of an answer outside generation (the model
            list, embeddings, records, sessions, the cache): a server that accepts and never
            answers fails the call with ``RequestTimeoutError`` after this long.
        generation_timeout: most seconds between two pieces of a streamed generation (a queued
            request may wait this long for its first token); None: ``read_timeout`` when that was
            set to other than its default, else 600.
        max_retries: further attempts of an idempotent call (embeddings, GETs) after a refused
            connection, 429, 502, 503 or 504, and of any other call after a 429 (refused before any
            work: a session append or cache update is then applied once); generation is never
            retried here.
        backoff: seconds before the first retry, doubled for each further one (with jitter; a
            ``Retry-After`` header wins).
        max_connections: most open connections of the pool.

    Raises:
        ConfigurationError: a malformed URL, key or number (the message names it).
    """

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    connect_timeout: float = 10.0
    read_timeout: float = DEFAULT_READ_TIMEOUT_S
    generation_timeout: float | None = None
    max_retries: int = 2
    backoff: float = 0.25
    max_connections: int = 256

    def __post_init__(self) -> None:
        url = self.base_url
        if not isinstance(url, str) or not url.strip():
            raise ConfigurationError(f"'base_url' must be a URL such as 'http://127.0.0.1:8000' (got {describe(url)}).")
        url = url.strip()
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in ("http", "https") or not rest.split("/", 1)[0].rsplit("@", 1)[-1]:
            raise ConfigurationError(
                f"'base_url' must be an http:// or https:// URL with a host, such as 'http://127.0.0.1:8000' "
                f"(got {describe(_redacted(url))})."
            )
        if any(c.isspace() for c in url):
            raise ConfigurationError(f"'base_url' must not contain whitespace (got {describe(_redacted(url))}).")
        object.__setattr__(self, "base_url", url)
        key = self.api_key
        if key is not None and (not isinstance(key, str) or not key or not key.isascii() or not key.isprintable()
                                or any(c.isspace() for c in key)):
            raise ConfigurationError(
                "'api_key' must be None or a non-empty str of visible ASCII characters (it travels in an HTTP "
                f"header) (got a {type(key).__name__})."
            )
        if self.generation_timeout is None:
            explicit = self.read_timeout != DEFAULT_READ_TIMEOUT_S
            object.__setattr__(self, "generation_timeout", self.read_timeout if explicit else DEFAULT_GENERATION_TIMEOUT_S)
        for name in ("connect_timeout", "read_timeout", "generation_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or (isinstance(value, float) and not math.isfinite(value)) or not 0 < value <= _MAX_TIMEOUT_S:
                raise ConfigurationError(f"'{name}' must be a number of seconds > 0 and <= {_MAX_TIMEOUT_S:g} "
                                         f"(got {describe(value)}).")
            object.__setattr__(self, name, float(value))
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or not 0 <= self.max_retries <= 100:
            raise ConfigurationError(f"'max_retries' must be an int from 0 to 100 (got {describe(self.max_retries)}).")
        backoff = self.backoff
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not 0 <= backoff <= 60:
            raise ConfigurationError(f"'backoff' must be a number of seconds from 0 to 60 (got {describe(backoff)}).")
        object.__setattr__(self, "backoff", float(backoff))
        connections = self.max_connections
        if isinstance(connections, bool) or not isinstance(connections, int) or not 1 <= connections <= 65536:
            raise ConfigurationError(f"'max_connections' must be an int from 1 to 65536 (got {describe(connections)}).")

    def __repr__(self) -> str:
        return (f"RemoteConfig(base_url={self.shown_url!r}, api_key={'***' if self.api_key else None}, "
                f"connect_timeout={self.connect_timeout:g}, read_timeout={self.read_timeout:g}, "
                f"generation_timeout={self.generation_timeout:g}, "
                f"max_retries={self.max_retries})")

    @property
    def root(self) -> str:
        """The ``/v1`` API root."""
        from gpuprompt.wire import api_root

        return api_root(self.base_url)

    @property
    def shown_url(self) -> str:
        """The URL without credentials, for messages and reprs."""
        return _redacted(self.base_url)


def _redacted(url: str) -> str:
    from gpuprompt.wire import redact

    return redact(url)


def resolve_remote(
    base_url: str | None,
    api_key: Any,
    *,
    owner: str,
    local_options: Mapping[str, tuple[Any, Any]] = {},
    timeout: Any = None,
    environ: Mapping[str, str] | None = None,
) -> RemoteConfig | None:
    """The server an adapter class talks to, or None for in-process mode.

    ``base_url`` wins; without it ``GPUPROMPT_URL`` (and then ``GPUPROMPT_API_KEY``) is read.
    With neither, the class runs in process as before, and an ``api_key`` is refused (it would
    be silently unused).

    Args:
        base_url: the adapter's ``base_url`` argument, or None.
        api_key: its ``api_key`` (a str, a pydantic ``SecretStr``, or None).
        owner: the class's name, for messages.
        local_options: ``name -> (value, default)`` of the options that only configure a local
            model (device, backend, quantize, ...): any not at its default is refused remotely.
        timeout: seconds every request to the server may wait for an answer (the model-list
            probe, embeddings, records, sessions and each piece of a generation alike); None
            reads ``GPUPROMPT_TIMEOUT``, else the defaults of :class:`RemoteConfig` apply.
        environ: the environment to read (default ``os.environ``).

    Raises:
        ConfigurationError: an in-process-only option together with a server, an ``api_key``
            without one, or a malformed URL / key.
    """
    env = os.environ if environ is None else environ
    key = api_key.get_secret_value() if hasattr(api_key, "get_secret_value") else api_key
    source = "base_url"
    if base_url is None:
        url = env.get(ENV_URL, "").strip()
        if not url:
            if key is not None:
                raise ConfigurationError(
                    f"{owner} got 'api_key' but no server: pass base_url='http://host:port' (or set {ENV_URL}) to "
                    "talk to a running `gpuprompt serve`, or drop api_key to run in process."
                )
            return None
        base_url, source = url, f"base_url (from {ENV_URL})"
        if key is None:
            key = env.get(ENV_API_KEY) or None
    set_locally = sorted(name for name, (value, default) in local_options.items() if value != default)
    if set_locally:
        raise ConfigurationError(
            f"{owner} got in-process option(s) {set_locally} together with {source}={_redacted(str(base_url))!r}: "
            "they configure a local model and mean nothing for a server (its own flags choose its device, backend "
            f"and batching). Drop them, or drop base_url{' (unset ' + ENV_URL + ')' if source != 'base_url' else ''} "
            "to run in process."
        )
    if timeout is None and env.get(ENV_TIMEOUT, "").strip():
        raw = env[ENV_TIMEOUT].strip()
        try:
            timeout = float(raw)
        except ValueError:
            raise ConfigurationError(f"{ENV_TIMEOUT} must be a number of seconds (got {raw!r}).") from None
    if timeout is None:
        return RemoteConfig(base_url=base_url, api_key=key)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ConfigurationError(f"'timeout' must be a number of seconds > 0 or None (got {describe(timeout)}).")
    return RemoteConfig(base_url=base_url, api_key=key, read_timeout=timeout, generation_timeout=timeout)
