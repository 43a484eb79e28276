"""The server package's surface: pinned exports, a light import, validated options."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gpuprompt.server as server
from gpuprompt.errors import ConfigurationError
from gpuprompt.server import ServerConfig, create_app


def test_all_is_pinned() -> None:
    assert server.__all__ == ["ServerConfig", "create_app", "serve"]


def test_import_loads_no_model_library() -> None:
    code = (
        "import sys, gpuprompt.server\n"
        "print(','.join(m for m in ('torch', 'faiss', 'vllm', 'transformers', 'sentence_transformers', 'locust')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"max_body_bytes": 0}, "'max_body_bytes' must be an int >= 1 (got 0 that is a int)"),
        ({"max_in_flight": "8"}, "'max_in_flight' must be an int >= 1"),
        ({"llm_backend": "llama.cpp"}, "'llm_backend' must be 'auto', 'vllm', 'transformers' or 'remote'"),
        ({"api_key": ""}, "'api_key' must be None or a non-empty str"),
        ({"strict_model_names": "yes"}, "'strict_model_names' must be a bool"),
    ],
)
def test_bad_options_are_configuration_errors(options, fragment) -> None:
    with pytest.raises(ConfigurationError) as info:
        ServerConfig(**options)
    assert fragment in str(info.value)


def test_create_app_rejects_unknown_or_doubled_options() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown server option\(s\) \['max_body'\]"):
        create_app(max_body=10)
    with pytest.raises(ConfigurationError, match="not both"):
        create_app(ServerConfig(), api_key="k")


def test_api_key_falls_back_to_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("GPUPROMPT_API_KEY", "from-env")
    assert ServerConfig().resolved_api_key() == "from-env"
    assert ServerConfig(api_key="explicit").resolved_api_key() == "explicit"
    monkeypatch.delenv("GPUPROMPT_API_KEY")
    assert ServerConfig().resolved_api_key() is None


def test_env_key_guards_an_app(monkeypatch, embedder, server_llm) -> None:
    from server_helpers import start_server

    monkeypatch.setenv("GPUPROMPT_API_KEY", "from-env")
    live = start_server(embedder=embedder, llm=server_llm)
    try:
        with live.client() as http:
            assert http.get("/v1/models").status_code == 401
            assert http.get("/v1/models", headers={"Authorization": "Bearer from-env"}).status_code == 200
    finally:
        live.stop()
