"""GPUPromptLLM: a LlamaIndex ``LLM`` over gpuprompt's batched ``LLMEngine`` (vLLM or transformers).

Every call, sync or async, streaming or not, becomes one request in the engine, so concurrent
``aquery``/``achat`` calls are generated together; async methods await the engine directly.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
)
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.llm import LLM

from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, describe
from gpuprompt.llm._policy import check_call_policy
from llamaindex_gpuprompt._common import check_options

if TYPE_CHECKING:
    from llama_index.core.prompts import PromptTemplate
    from pydantic import BaseModel

    from gpuprompt.llm import GenerationRequest, GenerationResult, LLMEngine, Usage

__all__ = ["GPUPromptLLM"]

dispatcher = get_dispatcher(__name__)

# The engine's chat templates know three roles; LlamaIndex has aliases of them.
_ROLE_MAP = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "user",
    MessageRole.FUNCTION: "user",
}

_CALL_OPTIONS = ("max_tokens", "temperature", "top_p", "seed", "stop", "priority", "response_format", "truncate")


def _usage_dict(usage: Usage | None) -> dict[str, int]:
    if usage is None:
        return {}
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _raw(result: GenerationResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "request_id": result.request_id,
        "finish_reason": result.finish_reason,
        "usage": _usage_dict(result.usage),
        "timings": {
            "queued_s": result.timings.queued_s,
            "ttft_s": result.timings.ttft_s,
            "total_s": result.timings.total_s,
        },
    }


def _check_messages(messages: Any) -> None:
    if isinstance(messages, (str, ChatMessage)) or not isinstance(messages, Sequence):
        raise InputTypeError(f"'messages' must be a list of ChatMessage (got {describe(messages)}).")
    for i, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise InputTypeError(f"'messages[{i}]' must be a ChatMessage (got {describe(message)}).")


def _check_prompt(prompt: Any) -> None:
    if not isinstance(prompt, str):
        raise InputTypeError(f"'prompt' must be a str (got {describe(prompt)}).")


def _validated(check: Callable[[Any], None]) -> Callable[[Callable], Callable]:
    """Check the first argument before LlamaIndex's callback decorator sees it, so bad input
    gets gpuprompt's typed error rather than a pydantic error from an instrumentation event."""

    def wrap(f: Callable) -> Callable:
        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def async_wrapper(self: Any, first: Any, *args: Any, **kwargs: Any) -> Any:
                check(first)
                return await f(self, first, *args, **kwargs)

            return async_wrapper

        @functools.wraps(f)
        def wrapper(self: Any, first: Any, *args: Any, **kwargs: Any) -> Any:
            check(first)
            return f(self, first, *args, **kwargs)

        return wrapper

    return wrap


class GPUPromptLLM(LLM):
    """LlamaIndex LLM backed by gpuprompt's batched LLMEngine.

    Unlike the stock ``Vllm``/``HuggingFaceLLM`` classes, concurrent calls are generated in one
    batch (vLLM continuous batching, or padded transformers batches), async methods never block
    the event loop, streaming works sync and async, a cancelled stream aborts its request, and
    ``structured_predict`` uses JSON-schema guided decoding when the backend has it (vLLM).

    Example:
        >>> from llama_index.core import Settings
        >>> from llama_index.core.llms import ChatMessage
        >>> from llamaindex_gpuprompt import GPUPromptLLM
        >>> llm = GPUPromptLLM(max_tokens=32)                  # bundled SmolLM2-135M-Instruct
        >>> print(llm.chat([ChatMessage(role="user", content="Name a colour.")]))
        assistant: Blue.
        >>> async for chunk in await llm.astream_complete("Count to three:"):   # in an async function
        ...     print(chunk.delta, end="")
        >>> Settings.llm = llm                                 # use it in every query engine

    Args:
        model: a local model folder, a ``.gguf`` file, a hub id available offline, or None for
            the bundled SmolLM2-135M-Instruct.
        engine: an already built :class:`gpuprompt.LLMEngine` to use instead of the runtime's
            shared one (then ``backend``, ``device``, ``max_model_len`` and ``engine_options``
            are ignored).
        **kwargs: the fields below and those of ``LLM`` (``system_prompt``, ``callback_manager``, ...).
    """

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, description="Model folder, .gguf file or hub id; None: bundled SmolLM2.")
    backend: Literal["auto", "vllm", "transformers"] = Field(default="auto", description="Engine backend.")
    device: str = Field(default="auto", description="'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'.")
    max_model_len: int = Field(default=2048, ge=16, description="Context window in tokens (capped by the model's).")
    engine_options: dict[str, Any] = Field(
        default_factory=dict, description="Other gpuprompt.LLMConfig fields (max_num_seqs, dtype, quantization, ...)."
    )
    max_tokens: int = Field(default=256, ge=1, description="Most new tokens per call (LlamaIndex's num_output).")
    temperature: float = Field(default=0.0, ge=0.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int | None = Field(default=None, description="Sampling seed, for reproducible sampled output.")
    stop: list[str] = Field(default_factory=list, description="Strings that end generation (not included).")
    priority: int = Field(default=0, description="Scheduling priority; lower runs first under load.")
    truncate: Literal["error", "left"] = Field(
        default="error", description="Too-long chats: 'error' raises, 'left' drops the oldest turns."
    )
    timeout: float | None = Field(
        default=None, description="Seconds a request may take before it is aborted (RequestTimeoutError)."
    )
    max_retries: int = Field(
        default=2, ge=0, description="Retries after a transient engine failure (a full queue), not bad input."
    )

    _engine: LLMEngine | None = PrivateAttr(default=None)

    def __init__(self, model: str | None = None, *, engine: LLMEngine | None = None, **kwargs: Any) -> None:
        if engine is not None:
            from gpuprompt.llm import LLMEngine

            if not isinstance(engine, LLMEngine):
                raise ConfigurationError(f"'engine' must be a gpuprompt.LLMEngine or None (got {describe(engine)}).")
            model = engine.config.model
        check_options("engine_options", kwargs.get("engine_options"), ("model", "backend", "device", "max_model_len"))
        super().__init__(model=model, **kwargs)
        check_call_policy(self.timeout, self.max_retries)
        self._engine = engine

    @classmethod
    def class_name(cls) -> str:
        return "GPUPromptLLM"

    def __repr__(self) -> str:
        return f"GPUPromptLLM(model={self.model!r}, backend={self.backend!r}, max_tokens={self.max_tokens})"

    # ------------------------------------------------------------------ the core object
    @property
    def engine(self) -> LLMEngine:
        """The core LLMEngine (the runtime's shared engine for this config, obtained on first use)."""
        if self._engine is None:
            from gpuprompt import get_runtime

            self._engine = get_runtime().llm(
                self.model,
                backend=self.backend,
                device=self.device,
                max_model_len=self.max_model_len,
                **self.engine_options,
            )
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        """Context window (from the engine's tokenizer config), num_output, model name; a chat model."""
        engine = self.engine
        return LLMMetadata(
            context_window=engine.context_window,
            num_output=self.max_tokens,
            is_chat_model=True,
            is_function_calling_model=False,
            model_name=engine.model_name,
        )

    # ------------------------------------------------------------------ requests
    def _request(self, *, messages: Sequence[ChatMessage] | None = None, prompt: str | None = None, **kwargs: Any) -> GenerationRequest:
        from gpuprompt.llm import GenerationRequest

        unknown = sorted(set(kwargs) - set(_CALL_OPTIONS))
        if unknown:
            raise InvalidInputError(
                f"unknown GPUPromptLLM call option(s) {unknown}; valid options: {sorted(_CALL_OPTIONS)}."
            )
        options: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": tuple(self.stop),
            "priority": self.priority,
            "truncate": self.truncate,
        }
        options.update(kwargs)
        if isinstance(options.get("stop"), list):
            options["stop"] = tuple(options["stop"])
        if messages is not None:
            return GenerationRequest(messages=self._messages(messages), **options)
        return GenerationRequest(prompt=prompt, **options)

    @staticmethod
    def _messages(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        _check_messages(messages)
        converted = []
        for i, message in enumerate(messages):
            if any(not isinstance(block, TextBlock) for block in message.blocks):
                kinds = sorted({type(block).__name__ for block in message.blocks if not isinstance(block, TextBlock)})
                raise InvalidInputError(
                    f"'messages[{i}]' must hold text only (got {kinds}); this model reads text, so pass the "
                    "other content as text or drop it."
                )
            role = _ROLE_MAP.get(MessageRole(message.role), "user")
            converted.append({"role": role, "content": "".join(block.text for block in message.blocks)})
        return converted

    def _complete_request(self, prompt: Any, formatted: bool, kwargs: dict[str, Any]) -> GenerationRequest:
        _check_prompt(prompt)
        if formatted:
            # Already formatted for the model (a template applied upstream): send it raw.
            return self._request(prompt=prompt, **kwargs)
        messages = [ChatMessage(role=MessageRole.USER, content=prompt)]
        if self.system_prompt:
            messages.insert(0, ChatMessage(role=MessageRole.SYSTEM, content=self.system_prompt))
        return self._request(messages=messages, **kwargs)

    @staticmethod
    def _chat_response(result: GenerationResult) -> ChatResponse:
        raw = _raw(result)
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=result.text),
            raw=raw,
            additional_kwargs=dict(raw["usage"]),
        )

    @staticmethod
    def _completion_response(result: GenerationResult) -> CompletionResponse:
        raw = _raw(result)
        return CompletionResponse(text=result.text, raw=raw, additional_kwargs=dict(raw["usage"]))

    # ------------------------------------------------------------------ chat
    @_validated(_check_messages)
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Generate the assistant's reply to ``messages`` (blocks this thread; needs no event loop).

        Args:
            messages: the conversation.
            **kwargs: per-call overrides: max_tokens, temperature, top_p, seed, stop, priority,
                response_format (a JSON schema; needs the vLLM backend), truncate.

        Raises:
            InvalidInputError: an unknown option, non-text content, or a bad option value.
            ContextLengthError: the chat does not fit the context window (with truncate="error").
        """
        request = self._request(messages=messages, **kwargs)
        [result] = self.engine.generate([request], timeout=self.timeout, max_retries=self.max_retries)
        return self._chat_response(result)

    @_validated(_check_messages)
    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async :meth:`chat`: awaits the engine; concurrent calls are generated in one batch."""
        request = self._request(messages=messages, **kwargs)
        result = await self.engine.agenerate(request, timeout=self.timeout, max_retries=self.max_retries)
        return self._chat_response(result)

    @_validated(_check_messages)
    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Stream the reply; each response holds the text so far and the new ``delta``."""
        request = self._request(messages=messages, **kwargs)
        stream = self.engine.stream(request, timeout=self.timeout)

        def gen() -> ChatResponseGen:
            text = ""
            with contextlib.closing(stream):
                for delta in stream:
                    text += delta.text
                    yield _chat_chunk(text, delta)

        return gen()

    @_validated(_check_messages)
    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        """Async :meth:`stream_chat`; closing the generator early aborts the request in the engine."""
        request = self._request(messages=messages, **kwargs)
        engine, timeout = self.engine, self.timeout

        async def gen() -> ChatResponseAsyncGen:
            text = ""
            async with contextlib.aclosing(engine.astream(request, timeout=timeout)) as stream:
                async for delta in stream:
                    text += delta.text
                    yield _chat_chunk(text, delta)

        return gen()

    # ------------------------------------------------------------------ completion
    @_validated(_check_prompt)
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Complete ``prompt``: as a user message through the chat template, or raw when ``formatted``."""
        request = self._complete_request(prompt, formatted, kwargs)
        [result] = self.engine.generate([request], timeout=self.timeout, max_retries=self.max_retries)
        return self._completion_response(result)

    @_validated(_check_prompt)
    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Async :meth:`complete`: awaits the engine; concurrent calls are generated in one batch."""
        request = self._complete_request(prompt, formatted, kwargs)
        result = await self.engine.agenerate(request, timeout=self.timeout, max_retries=self.max_retries)
        return self._completion_response(result)

    @_validated(_check_prompt)
    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        """Stream a completion; each response holds the text so far and the new ``delta``."""
        request = self._complete_request(prompt, formatted, kwargs)
        stream = self.engine.stream(request, timeout=self.timeout)

        def gen() -> CompletionResponseGen:
            text = ""
            with contextlib.closing(stream):
                for delta in stream:
                    text += delta.text
                    extra = _usage_dict(delta.usage)
                    raw = {"finish_reason": delta.finish_reason, "usage": extra} if delta.finish_reason else None
                    yield CompletionResponse(text=text, delta=delta.text, raw=raw, additional_kwargs=extra)

        return gen()

    @_validated(_check_prompt)
    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        """Async :meth:`stream_complete`; closing the generator early aborts the request."""
        request = self._complete_request(prompt, formatted, kwargs)
        engine, timeout = self.engine, self.timeout

        async def gen() -> CompletionResponseAsyncGen:
            text = ""
            async with contextlib.aclosing(engine.astream(request, timeout=timeout)) as stream:
                async for delta in stream:
                    text += delta.text
                    extra = _usage_dict(delta.usage)
                    raw = {"finish_reason": delta.finish_reason, "usage": extra} if delta.finish_reason else None
                    yield CompletionResponse(text=text, delta=delta.text, raw=raw, additional_kwargs=extra)

        return gen()

    # ------------------------------------------------------------------ structured output
    def _guided(self) -> bool:
        return bool(self.engine.supports_structured_output)

    def _structured_messages(self, prompt: PromptTemplate, prompt_args: dict[str, Any]) -> list[ChatMessage]:
        return self._extend_messages(prompt.format_messages(llm=self, **prompt_args))

    @staticmethod
    def _parse(output_cls: type[BaseModel], text: str) -> BaseModel:
        from pydantic import ValidationError

        try:
            return output_cls.model_validate_json(text)
        except ValidationError as exc:
            raise InvalidInputError(
                f"the model's guided JSON does not validate as {output_cls.__name__} ({exc.error_count()} error(s); "
                f"got {text[:200]!r}); raise max_tokens (the output may be cut off) or simplify the schema."
            ) from exc

    @dispatcher.span
    def structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        """Predict an ``output_cls`` instance; the engine's JSON-schema decoding guarantees valid
        JSON when the backend supports it (vLLM), else LlamaIndex's prompt-and-parse program runs.

        Raises:
            InvalidInputError: the output does not validate (for example cut off by max_tokens).
        """
        if not self._guided():
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args))
        messages = self._structured_messages(prompt, prompt_args)
        response = self.chat(messages, response_format=output_cls.model_json_schema(), **(llm_kwargs or {}))
        result = self._parse(output_cls, response.message.content or "")
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    async def astructured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        """Async :meth:`structured_predict`."""
        await self.engine.aload()  # starting the engine loads a model: never on the event loop
        if not self._guided():
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args))
        messages = self._structured_messages(prompt, prompt_args)
        response = await self.achat(messages, response_format=output_cls.model_json_schema(), **(llm_kwargs or {}))
        result = self._parse(output_cls, response.message.content or "")
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result


def _chat_chunk(text: str, delta: Any) -> ChatResponse:
    """One streamed ChatResponse: the text so far, this delta, and usage on the last one."""
    extra = _usage_dict(delta.usage)
    raw = {"finish_reason": delta.finish_reason, "usage": extra} if delta.finish_reason else None
    return ChatResponse(
        message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
        delta=delta.text,
        raw=raw,
        additional_kwargs=extra,
    )
