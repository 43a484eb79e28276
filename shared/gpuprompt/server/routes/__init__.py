"""The routes of ``gpuprompt serve``, one ``APIRouter`` per area; each handler reads the app's
:class:`~gpuprompt.server.state.ServerState` through the ``State`` dependency."""

from __future__ import annotations

from gpuprompt.server.routes import cache, collections, embeddings, generation, rerank, service, sessions, tokens

__all__ = ["ROUTERS"]

ROUTERS = (service.router, embeddings.router, generation.router, rerank.router, collections.router,
           sessions.router, cache.router, tokens.router)
"""Every router, in the order the app includes them."""
