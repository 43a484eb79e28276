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
