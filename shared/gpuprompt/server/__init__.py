r"""``gpuprompt serve``: an OpenAI-compatible HTTP API over the batched core (the ``server`` extra).

Routes: ``GET /v1/models``, ``POST /v1/embeddings``, ``POST /v1/chat/completions`` (tools, JSON
output, SSE streaming), ``POST /v1/completions``, collections (``/v1/collections/{name}/documents | records | query | chat``), sessions, the
answer cache, ``GET /health``,
``GET /metrics`` (Prometheus). Needs fastapi, uvicorn and prometheus-client:
``pip install 'gpuprompt[server]'``.

Example, against ``gpuprompt serve --port 8000``::

    curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
        -d '{"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 32}'
    curl -s http://127.0.0.1:8000/v1/collections/shop/documents -H 'Content-Type: application/json' \
        -d '{"documents": ["Aurora dress: red cotton, 49 EUR."], "ids": ["P1"]}'
    curl -s http://127.0.0.1:8000/v1/collections/shop/chat -H 'Content-Type: application/json' \
        -d '{"session_id": "c42", "question": "Is the red dress cotton?"}'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprompt._lazy import lazy_exports

if TYPE_CHECKING:
    from gpuprompt.server._config import ServerConfig
    from gpuprompt.server._serve import serve
    from gpuprompt.server.app import create_app

_EXPORTS = {"ServerConfig": "gpuprompt.server._config", "create_app": "gpuprompt.server.app",
            "serve": "gpuprompt.server._serve"}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
