"""Batched LLM generation: one :class:`LLMEngine` interface over vLLM and transformers.

Importing this package loads no torch, transformers or vLLM; the engine loads on first use.
"""

from __future__ import annotations

from gpuprompt.llm._config import LLMConfig
from gpuprompt.llm._engine import LLMEngine
from gpuprompt.llm._policy import CallPolicy
from gpuprompt.llm._tools import ToolCall, ToolCallDelta, ToolChoice, ToolSpec
from gpuprompt.llm._types import EngineStats, GenerationRequest, GenerationResult, StreamDelta, Timings, Usage

__all__ = [
    "CallPolicy",
    "EngineStats",
    "GenerationRequest",
    "GenerationResult",
    "LLMConfig",
    "LLMEngine",
    "StreamDelta",
    "Timings",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "ToolSpec",
    "Usage",
]
