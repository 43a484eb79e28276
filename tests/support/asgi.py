"""A ``gpuprompt serve`` app in this process, reached through httpx's ASGI transport (no socket).

The app's lifespan (start-up checks, preloads, the data dir) runs on a loop thread of its own for
as long as the server is up; requests run on whichever loop sends them (a remote class's client
loop, a test's loop), which the app never depends on.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import httpx

from gpuprompt.bridge import LoopThread

_COUNT = itertools.count(1)


class InProcessServer:
    """``create_app(...)`` with its lifespan entered, served by :attr:`transport`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.url = f"http://gpuprompt-test-{next(_COUNT)}.invalid"
        """Where remote classes reach this app (mounted: the transport answers it, nothing listens)."""
        self.transport = httpx.ASGITransport(app=app)
        self._loop = LoopThread("test-asgi-lifespan")
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None

    def start(self) -> InProcessServer:
        from gpuprompt.remote import mount

        self._lifespan = self.app.router.lifespan_context(self.app)
        self._loop.run(self._lifespan.__aenter__(), timeout=300)
        mount(self.url, self.transport)
        return self

    def stop(self) -> None:
        from gpuprompt.remote import unmount

        unmount(self.url)
        if self._lifespan is not None:
            self._loop.run(self._lifespan.__aexit__(None, None, None), timeout=120)
            self._lifespan = None
        self._loop.stop()

    @property
    def state(self) -> Any:
        """The app's :class:`~gpuprompt.server.state.ServerState`."""
        return self.app.state.gpuprompt

    def client(self) -> httpx.AsyncClient:
        """An async httpx client of the app (use it on the test's loop)."""
        return httpx.AsyncClient(transport=self.transport, base_url=self.url, timeout=120)

    def connect(self, **options: Any) -> Any:
        """``gpuprompt.connect`` to this app: a RemoteRuntime over the mounted transport."""
        from gpuprompt import connect

        return connect(self.url, **options)


def start_in_process(**options: Any) -> InProcessServer:
    """``create_app(**options)`` started in process."""
    from gpuprompt.server import create_app

    return InProcessServer(create_app(**options)).start()
