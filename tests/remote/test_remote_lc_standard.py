"""langchain-tests standard suites for ChatGPUPrompt in remote mode, against a live ``gpuprompt serve``
over the session's shared vLLM engine (the one the in-process vLLM suite runs; transformers where
vLLM is not installed).

The integration class is the in-process one (tests/langchain/test_lc_chat_models_standard.py, its
xfails for the 135M model's quality included), pointed at the server with ``base_url`` instead of
``backend``; the unit class checks construction from ``GPUPROMPT_URL`` / ``GPUPROMPT_API_KEY``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from langchain_tests.unit_tests import ChatModelUnitTests
from support.engines import LC_VLLM

from langchain_gpuprompt import ChatGPUPrompt


def _in_process_suite() -> type:
    """The in-process integration settings and xfails (loaded by path: tests/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "langchain" / "test_lc_chat_models_standard.py"
    spec = importlib.util.spec_from_file_location("_lc_chat_models_standard_in_process", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._Integration


_Integration = _in_process_suite()
_HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def standard_live(embedder, live: Any) -> Any:
    """A server over the Runtime's shared vLLM engine (started once per session, shared with the
    in-process vLLM suite), so the suite's generations run at vLLM's speed; else the default server."""
    if not _HAS_VLLM:
        yield live
        return
    from support.live import start_server

    engine = ChatGPUPrompt(**LC_VLLM).engine
    server = start_server(embedder=embedder, llm=engine)
    yield server
    server.stop()


class TestChatGPUPromptRemoteUnit(ChatModelUnitTests):
    """Construction only (nothing connects): the standard parameters, with the key, and the env."""

    @property
    def chat_model_class(self) -> type[ChatGPUPrompt]:
        return ChatGPUPrompt

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"base_url": "http://127.0.0.1:9"}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return (
            {"GPUPROMPT_URL": "http://127.0.0.1:9", "GPUPROMPT_API_KEY": "from-env"},
            {},
            {"base_url": "http://127.0.0.1:9", "api_key": "from-env"},
        )


class TestChatGPUPromptRemoteIntegration(_Integration):  # type: ignore[misc, valid-type]
    """The in-process suite, every call going through ``gpuprompt serve`` (vLLM where installed).

    The tests marked xfail for the 135M model's own reading (``model_limited``) skip here: they pass
    or fail by what the model writes (``GPUPROMPT_TEST_MODEL_QUALITY=1`` runs them in process on this
    same engine and settings); what remote mode adds is the wire, which every other test of the suite crosses (tools,
    tool choice, structured output, streaming, usage, stop sequences, histories).
    """

    url: str = ""
    run_model_limited = False

    @pytest.fixture(autouse=True, scope="class")
    def _server(self, standard_live: Any) -> None:
        type(self).url = standard_live.url

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Guided JSON (a tool call, a joke with two fields) needs more room than a plain reply.
        return {"base_url": type(self).url, "max_tokens": 96}
