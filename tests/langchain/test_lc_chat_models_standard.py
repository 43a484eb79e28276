"""langchain-tests standard suites for ChatGPUPrompt on the bundled SmolLM2-135M-Instruct.

Unit suite: construction only (nothing loads). Integration suites: the transformers backend for the
plain chat behaviour, and vLLM (its CPU build here) for tool calling and structured output, which
need the engine's JSON-schema guided decoding. Each engine starts once per test session (the
Runtime shares it across the ``model`` fixtures the suites build per test).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_gpuprompt import ChatGPUPrompt

_HAS_VLLM = importlib.util.find_spec("vllm") is not None


class TestChatGPUPromptUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatGPUPrompt]:
        return ChatGPUPrompt

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"backend": "transformers"}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        # A local model takes no API key; the rest of the standard parameters apply as they are.
        params = dict(super().standard_chat_model_params)
        params.pop("api_key", None)
        return params


class TestChatGPUPromptIntegration(ChatModelIntegrationTests):
    """The transformers backend: no guided decoding, so no tools or structured output."""

    @property
    def chat_model_class(self) -> type[ChatGPUPrompt]:
        return ChatGPUPrompt

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"backend": "transformers", "max_tokens": 16}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False


@pytest.mark.vllm
@pytest.mark.skipif(not _HAS_VLLM, reason="needs the vLLM package (CUDA or CPU build)")
class TestChatGPUPromptVLLMIntegration(ChatModelIntegrationTests):
    """vLLM: tool calling, tool_choice, structured output and JSON mode by guided decoding."""

    @property
    def chat_model_class(self) -> type[ChatGPUPrompt]:
        return ChatGPUPrompt

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Guided JSON (a tool call, a joke with two fields) needs more room than a plain reply.
        return {"backend": "vllm", "max_tokens": 96}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @pytest.mark.xfail(
        reason="JSON mode constrains the reply to *a* JSON object only; SmolLM2-135M does not keep the key "
        "names asked for in the prompt (it nests or renames them). Schema-guided output, which names the "
        "keys in the grammar, passes (test_structured_output*, the default method 'json_schema')."
    )
    def test_json_mode(self, model: BaseChatModel) -> None:
        super().test_json_mode(model)

    @pytest.mark.xfail(
        reason="SmolLM2-135M repeats itself inside the free-text 'description' argument until max_tokens, so "
        "the guided tool-call JSON is cut off and correctly reported in invalid_tool_calls; the Unicode "
        "customer_name itself comes through unescaped."
    )
    def test_unicode_tool_call_integration(self, model: BaseChatModel, **kwargs: Any) -> None:
        super().test_unicode_tool_call_integration(model, **kwargs)
