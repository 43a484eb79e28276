"""RemoteClient: the process's HTTP client of one ``gpuprompt serve``, configured by a
:class:`RemoteConfig` (the pooled client itself is :class:`gpuprompt._http.HttpClient`)."""

from __future__ import annotations

import threading
from typing import Any

from gpuprompt._http import HttpClient
from gpuprompt.errors import ConfigurationError
from gpuprompt.remote._config import RemoteConfig, resolve_remote
from gpuprompt.validation import fail

__all__ = ["SERVICE", "RemoteClient", "client_for", "shared_client"]

SERVICE = "gpuprompt serve"
"""What messages call the server."""


class RemoteClient(HttpClient):
    """Pooled sync and async HTTP access to one ``gpuprompt serve`` (or another OpenAI-compatible server).

    Use :func:`shared_client` to share one per server in a process. Nothing connects until the
    first call. Every request honours ``config``'s timeouts: ``read_timeout`` for one-shot calls
    (the model list, embeddings, records, sessions, the cache), ``generation_timeout`` between
    two pieces of a streamed generation.

    Example:
        >>> client = shared_client(RemoteConfig(base_url="http://127.0.0.1:8000"))
        >>> client.request("GET", "/models")["data"][0]["id"]
        'HuggingFaceTB/SmolLM2-135M-Instruct'

    Args:
        config: the server and the timeouts, retries and pool size.
        transport: an ``httpx`` transport instead of the network, e.g. ``httpx.ASGITransport(app)``
            for a ``gpuprompt serve`` app in this process (tests, embedding the server in an app).
    """

    def __init__(self, config: RemoteConfig, *, transport: Any = None) -> None:
        if not isinstance(config, RemoteConfig):
            raise TypeError(f"'config' must be a RemoteConfig (got {type(config).__name__}).")
        super().__init__(
            config.root,
            api_key=config.api_key,
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            max_retries=config.max_retries,
            backoff=config.backoff,
            max_connections=config.max_connections,
            service=SERVICE,
            transport=transport,
            name="gpuprompt-remote",
        )
        self.config = config

    @property
    def generation_timeout(self) -> float:
        """Most seconds between two pieces of a streamed generation (``config.generation_timeout``)."""
        return self.config.generation_timeout


_shared: dict[tuple[RemoteConfig, Any], RemoteClient] = {}
_shared_lock = threading.Lock()


def shared_client(config: RemoteConfig, *, transport: Any = None) -> RemoteClient:
    """The process's one :class:`RemoteClient` for ``config`` (equal configs share one pool; a
    client over an injected ``transport`` is shared only with callers passing the same transport)."""
    key = (config, transport)
    with _shared_lock:
        client = _shared.get(key)
        if client is None or client.closed:
            client = _shared[key] = RemoteClient(config, transport=transport)
        return client


def client_for(base_url: Any, api_key: Any, client: Any, options: dict[str, Any], *, owner: str) -> RemoteClient:
    """The client a remote class's arguments name: ``client`` itself, the shared client of a
    :class:`RemoteConfig`, or of ``base_url`` / ``api_key`` (else ``GPUPROMPT_URL``) and ``options``
    (further :class:`RemoteConfig` fields).

    Raises:
        ConfigurationError: both a client and a server, no server at all, or malformed settings.
    """
    if client is not None:
        if not isinstance(client, RemoteClient):
            raise fail("client", "a RemoteClient", client, error=ConfigurationError)
        if base_url is not None or api_key is not None or options:
            raise ConfigurationError(f"pass either 'client' or a server (base_url, api_key, options) to {owner}, "
                                     "not both.")
        return client
    if isinstance(base_url, RemoteConfig):
        if api_key is not None or options:
            raise ConfigurationError("a RemoteConfig carries its own api_key and options: pass them in it.")
        return shared_client(base_url)
    if base_url is not None and not isinstance(base_url, str):
        raise fail("base_url", "a URL such as 'http://127.0.0.1:8000', a RemoteConfig or None", base_url,
                   error=ConfigurationError)
    config = resolve_remote(base_url, api_key, owner=owner)
    if config is None:
        raise ConfigurationError(
            f"{owner} needs a server: pass base_url='http://host:port' of a running `gpuprompt serve` (or set "
            "GPUPROMPT_URL), or use the in-process class."
        )
    if options:
        config = RemoteConfig(base_url=config.base_url, api_key=config.api_key, **options)
    return shared_client(config)
