"""``gpuprompt serve``: an OpenAI-compatible HTTP API over the batched core (the ``server`` extra).

Routes: ``GET /v1/models``, ``POST /v1/embeddings``, ``POST /v1/chat/completions`` (SSE
streaming), collections (``/v1/collections/{name}/documents | query | chat``), ``GET /health``,
``GET /metrics`` (Prometheus). Needs fastapi, uvicorn and prometheus-client:
``pip install 'gpuprompt[server]'``.
"""

from __future__ import annotations

from gpuprompt.server._app import create_app
from gpuprompt.server._config import ServerConfig
from gpuprompt.server._serve import serve

__all__ = ["ServerConfig", "create_app", "serve"]
