"""Batched LLM generation: one :class:`LLMEngine` interface over vLLM and transformers.

Importing this package loads no torch, transformers or vLLM; the engine loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprompt._lazy import lazy_exports

if TYPE_CHECKING:
    from gpuprompt.llm._config import LLMConfig
    from gpuprompt.llm._engine import LLMEngine
    from gpuprompt.llm._policy import CallPolicy, check_call_policy
    from gpuprompt.llm._tools import ToolCall, ToolCallDelta, ToolChoice, ToolSpec, check_tool_choice
    from gpuprompt.llm._types import EngineStats, GenerationRequest, GenerationResult, StreamDelta, Timings, Usage

_EXPORTS = {
    "CallPolicy": "gpuprompt.llm._policy",
    "EngineStats": "gpuprompt.llm._types",
    "GenerationRequest": "gpuprompt.llm._types",
    "GenerationResult": "gpuprompt.llm._types",
    "LLMConfig": "gpuprompt.llm._config",
    "LLMEngine": "gpuprompt.llm._engine",
    "StreamDelta": "gpuprompt.llm._types",
    "Timings": "gpuprompt.llm._types",
    "ToolCall": "gpuprompt.llm._tools",
    "ToolCallDelta": "gpuprompt.llm._tools",
    "ToolChoice": "gpuprompt.llm._tools",
    "ToolSpec": "gpuprompt.llm._tools",
    "Usage": "gpuprompt.llm._types",
    "check_call_policy": "gpuprompt.llm._policy",
    "check_tool_choice": "gpuprompt.llm._tools",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
