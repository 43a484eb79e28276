"""GPUPromptLLM: a LlamaIndex ``FunctionCallingLLM`` over gpuprompt's batched ``LLMEngine`` (vLLM or
transformers).

Every call, sync or async, streaming or not, becomes one request in the engine, so concurrent
``aquery``/``achat`` calls are generated together; async methods await the engine directly. Tool
calling and structured output are the core's (one prompt format, one parser, guided decoding on
both backends); this class translates LlamaIndex types (:mod:`llamaindex_gpuprompt._llm_tools`).
The class gets its runtime once (:func:`gpuprompt.connect`): with ``base_url`` (or
``GPUPROMPT_URL``) the engine is a running ``gpuprompt serve``'s (a ``RemoteLLM``), else the
process's shared one, behind the same protocol (:class:`gpuprompt.protocols.EngineLike`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, describe
from gpuprompt.llm import check_call_policy
from gpuprompt.runtime import connect
from gpuprompt.validation import configuration_error, read_aliases
from gpuprompt.wire import EXTRA_SAMPLING
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
)
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr, ValidationError
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection

from llamaindex_gpuprompt._common import check_options
from llamaindex_gpuprompt._llm_structured import StructuredOutputMixin
from llamaindex_gpuprompt._llm_tools import (
    ToolCallAccumulator,
    assistant_message,
    check_messages,
    resolve_tool_choice,
    to_core_messages,
    to_tool_specs,
    tool_selections,
)

if TYPE_CHECKING:

    from gpuprompt.llm import GenerationRequest, GenerationResult, LLMEngine, StreamDelta, Usage
    from gpuprompt.protocols import EngineLike
    from gpuprompt.remote import RemoteRuntime
    from gpuprompt.runtime import Runtime
    from llama_index.core.tools.types import BaseTool

__all__ = ["GPUPromptLLM"]

# Per-call options, passed on to gpuprompt.GenerationRequest (which validates them).
_CALL_OPTIONS = (
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "priority",
    "response_format",
    "truncate",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "strict",
    *EXTRA_SAMPLING,  # top_k, min_p, the penalties, logit_bias and vLLM's end-of-reply fields
    "guided_regex",
    "guided_choice",
)


_STOCK_NAMES = {"model_name": "model", "max_new_tokens": "max_tokens", "context_window": "max_model_len"}
"""``HuggingFaceLLM``'s names for the same settings, accepted so that a swap keeps its arguments."""
_PROMPT_HOOKS = ("messages_to_prompt", "completion_to_prompt", "query_wrapper_prompt")


def _refuse_prompt_hooks(kwargs: dict[str, Any]) -> None:
    """Refuse ``HuggingFaceLLM``'s prompt hooks: this class would never call them."""
    for hook in _PROMPT_HOOKS:
        if kwargs.get(hook) is not None:
            raise ConfigurationError(
                f"GPUPromptLLM formats every prompt with the model's own chat template, so '{hook}' would never be "
                "called; drop it (to change the template, give the model folder a chat_template, or put "
                "instructions in system_prompt)."
            )


def _usage_dict(usage: Usage | None) -> dict[str, int]:
    if usage is None:
        return {}
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "cached_tokens": usage.cached_tokens,
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


def _check_prompt(prompt: Any) -> None:
    if not isinstance(prompt, str):
        raise InputTypeError(f"'prompt' must be a str (got {describe(prompt)}).")


def _validated(check: Callable[[Any], None], name: str) -> Callable[[Callable], Callable]:
    """Check the first argument (``name``, positional or keyword) before LlamaIndex's callback
    decorator sees it, so bad input gets gpuprompt's typed error rather than a pydantic error
    from an instrumentation event."""

    def first(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args[0] if args else kwargs.get(name)

    def wrap(f: Callable) -> Callable:
        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def async_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                check(first(args, kwargs))
                return await f(self, *args, **kwargs)

            return async_wrapper

        @functools.wraps(f)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            check(first(args, kwargs))
            return f(self, *args, **kwargs)

        return wrapper

    return wrap


class GPUPromptLLM(StructuredOutputMixin, FunctionCallingLLM):
    """LlamaIndex function-calling LLM backed by gpuprompt's batched LLMEngine.

    Unlike the stock ``Vllm``/``HuggingFaceLLM`` classes, concurrent calls are generated in one
    batch (vLLM continuous batching, or padded transformers batches), async methods never block
    the event loop, streaming works sync and async, a cancelled stream aborts its request,
    ``chat_with_tools`` (sync, async, streaming) drives ``FunctionAgent`` / ``AgentWorkflow``, and
    ``structured_predict`` uses JSON-schema guided decoding (both backends).

    Tool calls come back where LlamaIndex's own OpenAI LLM puts them: one ``ToolCallBlock`` per
    call in ``response.message.blocks`` and OpenAI-shaped dicts in
    ``response.message.additional_kwargs["tool_calls"]``; :meth:`get_tool_calls_from_response`
    reads either. A forced call (``tool_required=True`` or a named ``tool_choice``) is constrained
    by guided decoding, so its shape is guaranteed even when the model is small; what to call and
    with which values is still the model's judgement (a bigger model chooses better).

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
        >>> from llama_index.core.agent.workflow import FunctionAgent
        >>> agent = FunctionAgent(tools=[...], llm=llm)         # a tool-calling agent
        >>> remote = GPUPromptLLM(base_url="http://127.0.0.1:8000", max_tokens=32)  # a gpuprompt serve

    Remote mode: with ``base_url`` (or ``GPUPROMPT_URL``, and ``GPUPROMPT_API_KEY``) every call goes to
    a running ``gpuprompt serve``, batched there with every other worker's; this process imports no
    torch and loads no model. Everything above works the same, with the same typed errors (a busy
    server raises ``QueueFullError`` with ``retry_after``). ``backend``, ``device``,
    ``engine_options`` and ``engine`` configure a local engine and are refused with it
    (``truncate='left'`` travels with each request: the server drops the oldest turns, as in
    process); ``metadata.context_window`` reports the served model's window (from the server's model
    list), at most ``max_model_len``.

    Args:
        model: a local model folder, a ``.gguf`` file, a hub id available offline, or None for
            the bundled SmolLM2-135M-Instruct.
        engine: an already built :class:`gpuprompt.LLMEngine` to use instead of the runtime's
            shared one (then ``backend``, ``device``, ``max_model_len`` and ``engine_options``
            are ignored).
        base_url: a running ``gpuprompt serve`` (remote mode); None reads ``GPUPROMPT_URL``.
        api_key: that server's API key; None reads ``GPUPROMPT_API_KEY`` with ``GPUPROMPT_URL``.
        **kwargs: the fields below and those of ``LLM`` (``system_prompt``, ``callback_manager``, ...).
            ``HuggingFaceLLM``'s names ``model_name``, ``max_new_tokens`` and ``context_window`` are read
            as ``model``, ``max_tokens`` and ``max_model_len``.

    Raises:
        ConfigurationError: an unknown option, a value of the wrong type or out of range, or one of
            ``HuggingFaceLLM``'s prompt hooks (``messages_to_prompt``, ``completion_to_prompt``,
            ``query_wrapper_prompt``): prompts here always go through the model's chat template.
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
        default=None, description="Seconds a request may take before it is aborted (RequestTimeoutError); in remote "
        "mode also the most seconds any request to the server waits for an answer (None reads GPUPROMPT_TIMEOUT)."
    )
    max_retries: int = Field(
        default=2, ge=0, description="Retries after a transient engine failure (a full queue), not bad input."
    )
    tool_required: bool = Field(
        default=False,
        description="Make every chat_with_tools call call a tool unless the call names a tool_choice (for "
        "agents over small models that answer in prose too early; end such a loop with a return_direct tool).",
    )

    base_url: str | None = Field(
        default=None, description="A running gpuprompt serve to generate on (remote mode); None: GPUPROMPT_URL or "
        "in process."
    )
    api_key: str | None = Field(default=None, exclude=True, repr=False, description="The server's API key (remote mode).")

    _engine: EngineLike | None = PrivateAttr(default=None)
    _template_cache: tuple[str | None, int] | None = PrivateAttr(default=None)
    _runtime: Runtime | RemoteRuntime | None = PrivateAttr(default=None)

    def __init__(self, model: str | None = None, *, engine: LLMEngine | None = None, **kwargs: Any) -> None:
        if engine is not None:
            from gpuprompt.llm import LLMEngine

            if not isinstance(engine, LLMEngine):
                raise ConfigurationError(f"'engine' must be a gpuprompt.LLMEngine or None (got {describe(engine)}).")
            model = engine.config.model
        _refuse_prompt_hooks(kwargs)
        kwargs = read_aliases({"model": model, **kwargs}, _STOCK_NAMES, "GPUPromptLLM")
        model = kwargs.pop("model")
        check_options("engine_options", kwargs.get("engine_options"), ("model", "backend", "device", "max_model_len"))
        try:
            super().__init__(model=model, **kwargs)
        except ValidationError as exc:  # a field of the wrong type or out of range: our typed error, naming it
            raise configuration_error(exc, "GPUPromptLLM") from exc
        check_call_policy(self.timeout, self.max_retries)
        self._runtime = connect(
            self.base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            owner="GPUPromptLLM",
            local_options={"backend": (self.backend, "auto"), "device": (self.device, "auto"),
                           "engine_options": (self.engine_options, {}), "engine": (engine, None)},
        )
        if self._runtime.remote:
            self.base_url, self.api_key = self._runtime.config.base_url, self._runtime.config.api_key
        self._engine = engine

    @classmethod
    def class_name(cls) -> str:
        return "GPUPromptLLM"

    def __repr__(self) -> str:
        if self._runtime is not None and self._runtime.remote:
            return (f"GPUPromptLLM(model={self.model!r}, base_url={self._runtime.config.shown_url!r}, "
                    f"max_tokens={self.max_tokens})")
        return f"GPUPromptLLM(model={self.model!r}, backend={self.backend!r}, max_tokens={self.max_tokens})"

    # ------------------------------------------------------------------ the core object
    @property
    def engine(self) -> EngineLike:
        """The core engine (the runtime's shared engine for this config, obtained on first use); in
        remote mode a :class:`gpuprompt.remote.RemoteLLM` with the same interface."""
        if self._engine is None:
            assert self._runtime is not None
            if self._runtime.remote:
                self._engine = self._runtime.llm(self.model, max_model_len=self.max_model_len)
                return self._engine
            self._engine = self._runtime.llm(
                self.model,
                backend=self.backend,
                device=self.device,
                max_model_len=self.max_model_len,
                **self.engine_options,
            )
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        """Context window, num_output, model name; a chat model.

        ``context_window`` is the room a LlamaIndex prompt has: the engine's window less what the chat
        template adds around it (and the ``system_prompt``), so that LlamaIndex, packing chunks into it,
        never builds a prompt the engine refuses (with ``Settings.tokenizer = llm.tokenize``, see
        :meth:`tokenize`).
        """
        engine = self.engine
        return LLMMetadata(
            context_window=max(engine.context_window - self._template_tokens(), self.max_tokens + 1),
            num_output=self.max_tokens,
            is_chat_model=True,
            is_function_calling_model=bool(engine.supports_tools),
            model_name=engine.model_name,
        )

    def _template_tokens(self) -> int:
        """Tokens the chat template (and the system prompt) add around a user message's text."""
        key = self.system_prompt
        cached = self._template_cache
        engine = self.engine
        if not getattr(engine, "loaded", True):  # a RemoteLLM before its first call
            return 0  # metadata asks a remote server nothing before the first call (a silent one would stall it)
        if cached is None or cached[0] != key:
            messages = [{"role": "user", "content": ""}]
            if key:
                messages.insert(0, {"role": "system", "content": key})
            try:
                overhead = engine.count_tokens(messages)
            except InvalidInputError:  # a model without a chat template: prompts go in as they are
                overhead = 0
            cached = self._template_cache = (key, overhead)
        return cached[1]

    def tokenize(self, text: str) -> list[int]:
        """The model's token ids of ``text`` (a raw prompt), for ``Settings.tokenizer = llm.tokenize``.

        LlamaIndex packs retrieved chunks into ``metadata.context_window`` counting with
        ``Settings.tokenizer``, tiktoken's ``cl100k_base`` unless told otherwise. This model's
        tokenizer counts more tokens for the same text (7% more on English prose, far more on
        numbers and other languages), so summarising modes (``tree_summarize``,
        ``simple_summarize``) can pack a prompt past the window: ``ContextLengthError``. With this
        tokenizer the packing is exact. Remote mode asks the server (``POST /tokenize``), one request
        per call: LlamaIndex's splitters call the global tokenizer for every split, so in remote mode
        set it after ingesting, or use the model's own tokenizer there
        (``AutoTokenizer.from_pretrained(folder).encode``).

        Raises:
            InputTypeError: ``text`` is not a str.
        """
        _check_prompt(text)
        return self.engine.tokenize(text)

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
        strict = options.pop("strict", None)
        if options.get("tools") is not None:
            options["tools"] = tuple(to_tool_specs(options["tools"], strict))
        else:
            options.pop("tools", None)
        if options.get("tool_choice") is None:
            options.pop("tool_choice", None)
        if isinstance(options.get("stop"), list):
            options["stop"] = tuple(options["stop"])
        if messages is not None:
            return GenerationRequest(messages=to_core_messages(messages), **options)
        return GenerationRequest(prompt=prompt, **options)

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
        calls = [(call.id, call.name, call.arguments) for call in result.tool_calls]
        return ChatResponse(
            message=assistant_message(result.text, calls),
            raw=raw,
            additional_kwargs=dict(raw["usage"]),
        )

    @staticmethod
    def _completion_response(result: GenerationResult) -> CompletionResponse:
        raw = _raw(result)
        return CompletionResponse(text=result.text, raw=raw, additional_kwargs=dict(raw["usage"]))

    # ------------------------------------------------------------------ chat
    @_validated(check_messages, "messages")
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Generate the assistant's reply to ``messages`` (blocks this thread; needs no event loop).

        Args:
            messages: the conversation (assistant tool calls and ``role="tool"`` results included).
            **kwargs: per-call overrides: max_tokens, temperature, top_p, seed, stop, priority,
                response_format (a JSON schema), truncate, tools (LlamaIndex tools, OpenAI tool
                dicts or gpuprompt.ToolSpec), tool_choice, parallel_tool_calls, strict, and the
                sampling fields of gpuprompt.GenerationRequest (top_k, min_p, ..., ignore_eos).

        Raises:
            InvalidInputError: an unknown option, non-text content, or a bad option value.
            ContextLengthError: the chat does not fit the context window (with truncate="error").
        """
        request = self._request(messages=messages, **kwargs)
        [result] = self.engine.generate([request], timeout=self.timeout, max_retries=self.max_retries)
        return self._chat_response(result)

    @_validated(check_messages, "messages")
    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async :meth:`chat`: awaits the engine; concurrent calls are generated in one batch."""
        request = self._request(messages=messages, **kwargs)
        result = await self.engine.agenerate(request, timeout=self.timeout, max_retries=self.max_retries)
        return self._chat_response(result)

    @_validated(check_messages, "messages")
    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Stream the reply; each response holds the text (and tool calls) so far and the new ``delta``."""
        request = self._request(messages=messages, **kwargs)
        stream = self.engine.stream(request, timeout=self.timeout)

        def gen() -> ChatResponseGen:
            text, calls = "", ToolCallAccumulator()
            with contextlib.closing(stream):
                for delta in stream:
                    text += delta.text
                    calls.add(delta)
                    yield _chat_chunk(text, delta, calls)

        return gen()

    @_validated(check_messages, "messages")
    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        """Async :meth:`stream_chat`; closing the generator early aborts the request in the engine."""
        request = self._request(messages=messages, **kwargs)
        engine, timeout = self.engine, self.timeout

        async def gen() -> ChatResponseAsyncGen:
            text, calls = "", ToolCallAccumulator()
            async with contextlib.aclosing(engine.astream(request, timeout=timeout)) as stream:
                async for delta in stream:
                    text += delta.text
                    calls.add(delta)
                    yield _chat_chunk(text, delta, calls)

        return gen()

    # ------------------------------------------------------------------ completion
    @_validated(_check_prompt, "prompt")
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Complete ``prompt``: as a user message through the chat template, or raw when ``formatted``."""
        request = self._complete_request(prompt, formatted, kwargs)
        [result] = self.engine.generate([request], timeout=self.timeout, max_retries=self.max_retries)
        return self._completion_response(result)

    @_validated(_check_prompt, "prompt")
    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Async :meth:`complete`: awaits the engine; concurrent calls are generated in one batch."""
        request = self._complete_request(prompt, formatted, kwargs)
        result = await self.engine.agenerate(request, timeout=self.timeout, max_retries=self.max_retries)
        return self._completion_response(result)

    @_validated(_check_prompt, "prompt")
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

    @_validated(_check_prompt, "prompt")
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

    # ------------------------------------------------------------------ tool calling
    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The ``chat``/``achat``/``stream_chat`` arguments of one ``*_chat_with_tools`` call.

        Args:
            tools: LlamaIndex tools (``BaseTool``; OpenAI tool dicts and gpuprompt.ToolSpec work too).
            user_msg: a last user message to append to ``chat_history``.
            chat_history: the conversation so far (not modified).
            verbose: unused (LlamaIndex's signature).
            allow_parallel_tool_calls: let the model make several calls in one reply.
            tool_required: the reply must call a tool (``tool_choice="required"``).
            tool_choice: ``"auto"``, ``"required"``, ``"none"``, a tool's name or OpenAI's
                ``{"type": "function", "function": {"name": ...}}``; wins over ``tool_required``.
            strict: OpenAI's flag, carried on each tool spec (the core decodes every call under its
                tool's schema either way).
            **kwargs: per-call options of :meth:`chat`.

        Raises:
            InputTypeError: ``tools`` is not a list of tools, or a message is not a ChatMessage.
        """
        specs = to_tool_specs(tools, strict)
        if chat_history is not None:
            check_messages(chat_history)
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        prepared: dict[str, Any] = {"messages": messages, **kwargs}
        if specs:
            prepared["tools"] = specs
            prepared["tool_choice"] = resolve_tool_choice(tool_choice, tool_required or self.tool_required)
            prepared["parallel_tool_calls"] = bool(allow_parallel_tool_calls)
        return prepared

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The tool calls of a (possibly streamed) chat response, as ``ToolSelection``s.

        Args:
            response: a response of :meth:`chat_with_tools` and friends (or any assistant message
                holding ``ToolCallBlock``s or OpenAI ``tool_calls``).
            error_on_no_tool_call: raise when the response calls no tool (else return ``[]``).

        Raises:
            InvalidInputError: no tool call and ``error_on_no_tool_call`` (a ``ValueError``, as
                LlamaIndex expects).
        """
        if not isinstance(response, ChatResponse):
            raise InputTypeError(f"'response' must be a ChatResponse (got {describe(response)}).")
        selections = tool_selections(response.message)
        if not selections and error_on_no_tool_call:
            text = (response.message.content or "")[:200]
            raise InvalidInputError(
                f"expected at least one tool call, but the model answered in prose ({text!r}); pass "
                "tool_required=True (or tool_choice='required' / a tool's name) to force a call."
            )
        return selections


def _chat_chunk(text: str, delta: StreamDelta, calls: ToolCallAccumulator) -> ChatResponse:
    """One streamed ChatResponse: the text and tool calls so far, this text delta, and usage on
    the last one."""
    extra = _usage_dict(delta.usage)
    raw = {"finish_reason": delta.finish_reason, "usage": extra} if delta.finish_reason else None
    return ChatResponse(
        message=assistant_message(text, calls.calls),
        delta=delta.text,
        raw=raw,
        additional_kwargs=extra,
    )
