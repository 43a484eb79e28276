"""The inference backends of :class:`~gpuprompt.LLMEngine`, each behind the contract of
:mod:`gpuprompt.llm._backend` and chosen once, when the engine loads:

    _transformers   padded batches coalesced by the MicroBatcher (CPU fallback, any transformers model)
    _vllm           one in-process vLLM ``AsyncLLM`` (continuous batching, prefix caching; CUDA or CPU build)
    _openai_http    an OpenAI-compatible server or fleet (vLLM servers behind vllm-router, ``gpuprompt serve``)

``_guided`` holds the transformers backend's grammar constraints, ``_spawn`` the start of vLLM's
engine subprocesses without re-running the user's script.
"""
