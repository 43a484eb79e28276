"""The unit tier's promise, enforced: a test under ``tests/unit`` loads no model, opens no network
connection and starts no subprocess. Each attempt fails the test with a message saying which tier
the test belongs in instead (``tests/integration`` or ``tests/system``)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

_WHERE = "a unit test must not {what}: move it to tests/integration (models) or tests/system (servers, subprocesses)"


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(_WHERE.format(what=what))

    return refuse


@pytest.fixture(autouse=True)
def unit_tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Refuse the shared fixtures of the other tiers (they load models and start servers before
    any test-scoped guard could act), then model loads, network connections and subprocesses for
    the test's duration."""
    manager = request._fixturemanager  # noqa: SLF001 - where each requested fixture is defined
    for name in request.fixturenames:
        for definition in manager.getfixturedefs(name, request.node) or ():
            where = definition.baseid
            if where and not where.replace("\\", "/").startswith("tests/unit"):
                raise AssertionError(_WHERE.format(what=f"use the fixture {name!r} of {where}"))
    original_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family == getattr(socket, "AF_UNIX", None):
            return original_connect(self, address)
        raise AssertionError(_WHERE.format(what=f"connect to {address!r}"))

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("open a network connection"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("start a subprocess"))
    from gpuprompt import models

    for name in ("resolve_embedding_model", "resolve_chat_model", "resolve_rerank_model", "convert_gguf",
                 "random_cross_encoder"):
        monkeypatch.setattr(models, name, _refuse(f"load a model ({name})"))
    yield
