"""langchain-tests standard suites for ChatGPUPrompt on the bundled SmolLM2-135M-Instruct.

Unit suite: construction only (nothing loads). Integration suites: the same suite on each backend,
tool calling, tool choice and structured output included on both (the core decodes tool calls and
JSON schemas under a grammar on transformers as on vLLM). The feature flags say what the model
supports: text in and out, tools with ``tool_choice``, structured output (json_schema, function
calling, JSON mode), usage metadata (with prefix-cache hits as ``cache_read`` on vLLM, which keeps a
prefix cache); no images, audio, PDF or Anthropic-style inputs. Each engine starts once per test
session (the Runtime shares it across the ``model`` fixtures the suites build per test). The
xfails are the 135M model's own quality, each with its reason.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests
from support.engines import LC_VLLM

from langchain_gpuprompt import ChatGPUPrompt

_HAS_VLLM = importlib.util.find_spec("vllm") is not None
_MODEL_QUALITY = os.environ.get("GPUPROMPT_TEST_MODEL_QUALITY") == "1"
"""The xfails for the 135M model's own quality run only when asked: they report, they cannot fail."""

_JOKE = ("SmolLM2-135M repeats a phrase inside the Joke's 'setup' string until max_tokens (seen: 'sampu, sampu, "
         "...'), so 'punchline' never comes (the 'pydantic' case; its TypedDict / JSON-schema variants pass, XPASS).")


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

    @property
    def supports_json_mode(self) -> bool:
        return True


class _Integration(ChatModelIntegrationTests):
    """The suite's settings shared by both backends."""

    backend = "transformers"
    run_model_limited = _MODEL_QUALITY
    """Run the tests marked xfail for SmolLM2-135M's own limits (rambling inside free-text fields)."""

    def model_limited(self) -> None:
        """Skip a test marked xfail for the model's limits where ``run_model_limited`` is off."""
        if not self.run_model_limited:
            pytest.skip("passes or fails on SmolLM2-135M's reading, not on the code (a non-strict xfail, so it "
                        "cannot fail the run): GPUPROMPT_TEST_MODEL_QUALITY=1 runs it on vLLM in process; the "
                        "protocol it crosses is checked by the rest of this suite, tests/langchain/"
                        "test_lc_chat_models.py and tests/core/test_llm_tools.py")

    @property
    def chat_model_class(self) -> type[ChatGPUPrompt]:
        return ChatGPUPrompt

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Guided JSON (a tool call, a joke with two fields) needs more room than a plain reply.
        return {**(LC_VLLM if self.backend == "vllm" else {"backend": self.backend}), "max_tokens": 96}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @pytest.mark.xfail(
        reason="JSON mode constrains the reply to *a* JSON object only; SmolLM2-135M does not keep the key "
        "names asked for in the prompt (it nests or renames them). Schema-guided output, which names the "
        "keys in the grammar, passes (test_structured_output*, the default method 'json_schema')."
    )
    def test_json_mode(self, model: BaseChatModel) -> None:
        self.model_limited()
        super().test_json_mode(model)

    # The xfails below are SmolLM2-135M's own quality, seen on the transformers backend (observed
    # 2026-12-02; strict=False: greedy decoding on vLLM may differ and pass). In every case the
    # protocol held: a well-formed call of the bound tool or schema-shaped JSON, parsed by the core;
    # what fails is what the model put in it. The repo's own tool tests bound their argument values
    # (tests/langchain/test_lc_chat_models.py, test_lc_agent.py) and pass on both backends.
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    @pytest.mark.xfail(strict=False, reason="SmolLM2-135M makes a well-formed forced call of magic_function but "
                       "reads the question's 3 as another number (seen: {'input': 100}); the test asserts input == 3.")
    def test_tool_calling(self, model: BaseChatModel) -> None:
        self.model_limited()
        super().test_tool_calling(model)

    @pytest.mark.xfail(strict=False, reason="As test_tool_calling: a well-formed call whose 'input' is not the 3 "
                       "asked for (the model's reading).")
    async def test_tool_calling_async(self, model: BaseChatModel) -> None:
        self.model_limited()
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(strict=False, reason="SmolLM2-135M repeats the no-argument call inside the parallel-calls "
                       "list (seen: 5 identical calls); the test expects exactly one.")
    def test_tool_calling_with_no_arguments(self, model: BaseChatModel) -> None:
        self.model_limited()
        super().test_tool_calling_with_no_arguments(model)

    @pytest.mark.xfail(strict=False, reason="SmolLM2-135M rambles inside the free-text 'answer_style' argument until "
                       "max_tokens, so the forced call is cut off and no call is returned.")
    def test_bind_runnables_as_tools(self, model: BaseChatModel) -> None:
        self.model_limited()
        super().test_bind_runnables_as_tools(model)

    @pytest.mark.parametrize("schema_type", ["pydantic", "typeddict", "json_schema"])
    @pytest.mark.xfail(strict=False, reason=_JOKE)  # the suite wants the mark on the method: the other two XPASS
    def test_structured_output(self, model: BaseChatModel, schema_type: str) -> None:
        self.model_limited()
        super().test_structured_output(model, schema_type)

    @pytest.mark.parametrize("schema_type", ["pydantic", "typeddict", "json_schema"])
    @pytest.mark.xfail(strict=False, reason=_JOKE)  # the suite wants the mark on the method: the other two XPASS
    async def test_structured_output_async(self, model: BaseChatModel, schema_type: str) -> None:
        self.model_limited()
        await super().test_structured_output_async(model, schema_type)

    @pytest.mark.xfail(strict=False, reason=_JOKE)
    def test_structured_output_pydantic_2_v1(self, model: BaseChatModel) -> None:
        self.model_limited()
        super().test_structured_output_pydantic_2_v1(model)

    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    @pytest.mark.xfail(strict=False, reason="The test binds get_weather with tool_choice left 'auto'; SmolLM2-135M "
                       "answers in prose instead of calling it (the core constrains 'auto' to prose or a well-formed "
                       "call, so the reply is valid, just not a call). Forced calls pass (test_tool_choice).")
    def test_agent_loop(self, model: BaseChatModel) -> None:
        self.model_limited()
        super().test_agent_loop(model)

    @pytest.mark.xfail(strict=False, reason="SmolLM2-135M repeats itself inside the free-text 'description' argument "
                       "until max_tokens, so the guided call is cut off; the Unicode customer_name itself comes "
                       "through unescaped (seen: '你好啊集团').")
    def test_unicode_tool_call_integration(self, model: BaseChatModel, **kwargs: Any) -> None:
        self.model_limited()
        super().test_unicode_tool_call_integration(model, **kwargs)


class TestChatGPUPromptIntegration(_Integration):
    """The transformers backend (grammar-constrained decoding for tools and structured output). The
    tests the 135M model passes or fails by its own reading (the xfails) run on vLLM only: on this
    backend they decode up to 96 grammar-constrained tokens each, 2 of the suite's 3 minutes here."""

    backend = "transformers"
    run_model_limited = False


@pytest.mark.vllm
@pytest.mark.skipif(not _HAS_VLLM, reason="needs the vLLM package (CUDA or CPU build)")
class TestChatGPUPromptVLLMIntegration(_Integration):
    """vLLM: the same suite, plus prefix-cache hits reported as ``cache_read`` input tokens."""

    backend = "vllm"

    @property
    def supported_usage_metadata_details(self) -> dict[str, list[str]]:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """The same long system prompt twice: the second request reads it from the prefix cache."""
        model = ChatGPUPrompt(**LC_VLLM, max_tokens=4)
        messages = [SystemMessage("You are the support assistant of a clothing shop. " * 20), HumanMessage("Hi!")]
        model.invoke(messages)
        if not stream:
            return model.invoke(messages)
        full = None
        for chunk in model.stream(messages):
            full = chunk if full is None else full + chunk
        assert isinstance(full, AIMessage)
        return full
