"""One HTTP contract: every path the remote clients send (named in gpuprompt.wire) is a route the
server's app serves, with the method the client uses; the server's route table is written from the
same constants, so a renamed path moves both sides or fails here."""

from __future__ import annotations

import pytest

from gpuprompt import wire

_SENT = [  # (method, path) as the remote clients send them, below the /v1 root unless absolute
    ("GET", wire.MODELS), ("POST", wire.EMBEDDINGS), ("POST", wire.CHAT_COMPLETIONS), ("POST", wire.COMPLETIONS),
    ("POST", wire.RERANK), ("POST", wire.SCORE), ("GET", wire.SESSIONS), ("DELETE", wire.SESSIONS),
    ("POST", wire.SESSIONS + "/{session_id:path}/turns"), ("GET", wire.SESSIONS + "/{session_id:path}/turns"),
    ("POST", wire.SESSIONS + "/{session_id:path}/window"), ("DELETE", wire.SESSIONS + "/{session_id:path}"),
    ("GET", wire.CACHE), ("DELETE", wire.CACHE), ("POST", wire.CACHE_LOOKUP), ("POST", wire.CACHE_UPDATE),
    ("POST", wire.CACHE_CLEAR), ("GET", wire.COLLECTIONS),
    *[(method, wire.collection_path("{name}", *parts)) for method, parts in [
        ("POST", ("records",)), ("DELETE", ("records",)), ("GET", ("records", "info")), ("POST", ("records", "get")),
        ("POST", ("records", "delete")), ("POST", ("records", "ids")), ("POST", ("records", "search")),
        ("POST", ("documents",)), ("POST", ("query",)), ("POST", ("chat",)),
    ]],
]


@pytest.fixture(scope="module")
def routes() -> set[tuple[str, str]]:
    from gpuprompt.server import create_app

    app = create_app()  # routes only: the lifespan (which loads the models) is never entered
    return {(method, route.path) for route in app.routes for method in getattr(route, "methods", ()) or ()}


@pytest.mark.parametrize(("method", "path"), _SENT, ids=[f"{m} {p}" for m, p in _SENT])
def test_every_client_path_is_served(routes: set[tuple[str, str]], method: str, path: str) -> None:
    assert (method, wire.V1 + path) in routes


def test_health_and_metrics_sit_beside_the_api_root(routes: set[tuple[str, str]]) -> None:
    assert ("GET", wire.HEALTH) in routes
    assert ("GET", wire.METRICS) in routes
    assert wire.api_root("http://h:1") == "http://h:1" + wire.V1
