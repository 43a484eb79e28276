"""The one vLLM engine of a test session, as each surface names it.

vLLM takes 30-60 s to start on 2 cores, so every in-process vLLM test (core, LangChain, LlamaIndex,
the remote suites' server) asks the Runtime for the same settings and gets the same engine: at most
4 requests at a time (a few requests fill it, which the cancellation and priority tests need) and
float32 weights (greedy outputs then do not depend on how requests were batched). The files that
use it run on one xdist worker, so it starts once per run: a new such file goes into
``_VLLM_ENGINE_FILES`` in ``tests/conftest.py`` (left out, it would start a second engine elsewhere).
"""

from __future__ import annotations

from typing import Any

ENGINE_OPTIONS: dict[str, Any] = {"device": "cpu", "max_num_seqs": 4, "dtype": "float32", "max_model_len": 2048,
                                  "kv_cache_space_gb": 1.0}
"""``LLMEngine`` / ``Runtime.llm`` keyword arguments of the session's engines (either backend).

1 GiB of KV cache (46k fp32 tokens of SmolLM2: 4 sequences of 2,048 need 8k) instead of the 2 GiB
default: each xdist worker holds one such engine, and a full run peaked at 22.8 of 24 GiB with the
default (the vLLM pair of the fleet tests and the Ray cluster running at once)."""

_EXTRA = {k: v for k, v in ENGINE_OPTIONS.items() if k not in ("device", "max_model_len")}

LC_VLLM: dict[str, Any] = {"backend": "vllm", "device": "cpu", "max_model_len": 2048, "engine_kwargs": _EXTRA}
"""``ChatGPUPrompt(**LC_VLLM)``: the session's vLLM engine."""

LI_VLLM: dict[str, Any] = {"backend": "vllm", "device": "cpu", "max_model_len": 2048, "engine_options": _EXTRA}
"""``GPUPromptLLM(**LI_VLLM)``: the session's vLLM engine."""


def vllm_engine() -> Any:
    """The session's vLLM engine (the Runtime's, for :data:`ENGINE_OPTIONS`), loaded."""
    from gpuprompt import get_runtime

    return get_runtime().llm(backend="vllm", **ENGINE_OPTIONS).load()
