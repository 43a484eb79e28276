"""LangChain chat model over gpuprompt's batched LLMEngine (vLLM or transformers behind one interface).

The adapter converts LangChain messages to engine requests and engine results to LangChain
messages; batching, streaming, stop strings, cancellation and guided decoding live in the core.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.output_parsers import JsonOutputKeyToolsParser, JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import PydanticToolsParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from gpuprompt._bridge import run_sync
from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, describe
from gpuprompt.llm._policy import check_call_policy
from gpuprompt.models import BUNDLED_CHAT_MODEL

if TYPE_CHECKING:
    from gpuprompt.llm import GenerationRequest, GenerationResult, LLMEngine, StreamDelta, Usage

__all__ = ["ChatGPUPrompt"]

_ANSWER_TOOL = "__answer__"
"""The pseudo-tool a model under ``tool_choice="auto"`` picks to reply in prose instead."""

_CALL_OPTIONS = frozenset(
    {"model", "max_tokens", "temperature", "top_p", "seed", "priority", "truncate", "timeout", "response_format",
     "tools", "tool_choice", "stream", "ls_structured_output_format"}
)


class ChatGPUPrompt(BaseChatModel):
    """Drop-in LangChain chat model backed by gpuprompt's batched :class:`~gpuprompt.LLMEngine`.

    vLLM (GPU, or its CPU build) with continuous batching and prefix caching when available,
    transformers' padded batches otherwise; the same loaded engine is shared by every instance
    with the same engine settings in the process. ``batch``/``abatch`` submit all inputs to the
    engine at once, and concurrent ``invoke`` calls from threads or tasks are batched together.
    Constructing the class loads nothing; the engine starts on the first call.

    Setup:
        .. code-block:: bash

            pip install "gpuprompt[langchain]"      # plus "gpuprompt[gpu]" on a GPU machine

    Instantiate:
        .. code-block:: python

            from langchain_gpuprompt import ChatGPUPrompt

            llm = ChatGPUPrompt(max_tokens=64)       # bundled SmolLM2-135M-Instruct, best backend

    Invoke:
        .. code-block:: python

            msg = llm.invoke([("system", "You are a shop assistant."), ("human", "Hi!")])
            msg.content
            # 'Hello there! How can I assist you today?'
            msg.usage_metadata
            # {'input_tokens': 22, 'output_tokens': 11, 'total_tokens': 33}
            msg.response_metadata
            # {'model_name': 'HuggingFaceTB/SmolLM2-135M-Instruct', 'finish_reason': 'stop'}

    Stream:
        .. code-block:: python

            for chunk in llm.stream("Name three colours."):
                print(chunk.content, end="")
            # 1. Red: This is the most obvious colour, ...

    Async and batch (one engine batch for all inputs):
        .. code-block:: python

            await llm.ainvoke("Hello")
            llm.batch(["Hello", "What is a return policy?"])

    Structured output (JSON-schema guided decoding; needs a backend that supports it, i.e. vLLM):
        .. code-block:: python

            from pydantic import BaseModel

            class Product(BaseModel):
                name: str
                price: float

            llm.with_structured_output(Product).invoke("A red dress that costs 40 euros.")
            # Product(name='Ava', price=40.0)          (the schema always holds; the 135M model's
            #                                           reading of the text is another matter)

    Tool calling (guided decoding of ``{"name": ..., "arguments": {...}}``; vLLM backend):
        .. code-block:: python

            llm.bind_tools([get_order_status], tool_choice="any").invoke("Where is order 42?").tool_calls
            # [{'name': 'get_order_status', 'args': {'order_id': 42}, 'id': 'call_a8b0...', 'type': 'tool_call'}]
    """

    model: str | None = None
    """Local model folder, .gguf file or hub id; None for the bundled SmolLM2-135M-Instruct."""
    backend: Literal["auto", "vllm", "transformers"] = "auto"
    """Engine backend: 'vllm', 'transformers', or 'auto' (vLLM when it starts, else transformers)."""
    device: str = "auto"
    """Torch device for the engine: 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'."""
    max_model_len: int = 2048
    """Context window in tokens (capped by the model's own limit)."""
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Further LLMEngine options (dtype, max_num_seqs, quantization, gpu_memory_utilization, ...)."""
    temperature: float = 0.0
    """Sampling temperature; 0 decodes greedily."""
    max_tokens: int = 256
    """Most new tokens per reply."""
    top_p: float = 1.0
    """Nucleus sampling mass (used when temperature > 0)."""
    stop: list[str] | None = None
    """Strings that end a reply (not included in it)."""
    seed: int | None = None
    """Sampling seed for reproducible sampled replies."""
    timeout: float | None = None
    """Seconds a request may take before it is aborted in the engine and TimeoutError raised."""
    max_retries: int = 2
    """Retries after a transient engine failure (a full queue or a failed batch), not bad input."""
    streaming: bool = False
    """Serve invoke() through the streaming path (callbacks then see each token)."""
    priority: int = 0
    """Engine priority of this model's requests; lower is served first under load."""
    truncate: Literal["error", "left"] = "error"
    """'error' raises ContextLengthError on a too-long prompt; 'left' drops the oldest turns."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    _engine_cache: LLMEngine | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        # Pure-Python checks (nothing loads): bad settings fail here with the core's typed error,
        # not inside a pydantic validator that would rewrap them.
        self._config()
        self._request([{"role": "user", "content": ""}], None, {})
        check_call_policy(self.timeout, self.max_retries)

    # ------------------------------------------------------------------ engine
    def _config(self, model: str | None | Literal["__self__"] = "__self__") -> Any:
        from gpuprompt.llm import LLMConfig

        valid = set(LLMConfig.option_names()) - {"backend", "device", "max_model_len"}
        unknown = sorted(set(self.engine_kwargs) - valid)
        if unknown:
            raise ConfigurationError(
                f"unknown 'engine_kwargs' key(s) {unknown}; valid: {sorted(valid)} "
                "(model, backend, device and max_model_len are fields of ChatGPUPrompt)."
            )
        return LLMConfig(
            model=self.model if model == "__self__" else model,
            backend=self.backend,
            device=self.device,
            max_model_len=self.max_model_len,
            **self.engine_kwargs,
        )

    def _shared_engine(self, model: str | None | Literal["__self__"]) -> LLMEngine:
        """The runtime's engine for these settings (looked up, not started)."""
        from gpuprompt.runtime import get_runtime

        config = self._config(model)
        options = {name: getattr(config, name) for name in config.option_names()}
        return get_runtime().llm(config.model, **options)

    def _get_engine(self, model: str | None | Literal["__self__"] = "__self__") -> LLMEngine:
        if model == "__self__" and self._engine_cache is not None:
            return self._engine_cache
        engine = self._shared_engine(model).load()
        if model == "__self__":
            self._engine_cache = engine
        return engine

    @property
    def engine(self) -> LLMEngine:
        """The shared core engine for these settings (started on first access)."""
        return self._get_engine()

    async def _aget_engine(self, model: str | None | Literal["__self__"]) -> LLMEngine:
        if model == "__self__" and self._engine_cache is not None:
            return self._engine_cache
        # Starting an engine loads a model (and may spawn vLLM): never on the event loop.
        engine = await self._shared_engine(model).aload()
        if model == "__self__":
            self._engine_cache = engine
        return engine

    # ------------------------------------------------------------------ LangChain plumbing
    @property
    def _llm_type(self) -> str:
        return "gpuprompt-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model or BUNDLED_CHAT_MODEL,
            "backend": self.backend,
            "max_model_len": self.max_model_len,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "top_p": self.top_p,
            "stop": self.stop,
            "seed": self.seed,
            "truncate": self.truncate,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="gpuprompt",
            ls_model_name=kwargs.get("model") or self.model or BUNDLED_CHAT_MODEL,
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        stops = stop or kwargs.get("stop") or self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params

    def get_num_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the model's own tokenizer (starts the engine)."""
        return self.engine.count_tokens(text)

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence | None = None) -> int:
        """Tokens of ``messages`` with the chat template applied, as the engine will see them."""
        return self.engine.count_tokens(_to_core_messages(messages))

    # ------------------------------------------------------------------ request building
    def _request(
        self, messages: list[dict[str, str]], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> GenerationRequest:
        from gpuprompt.llm import GenerationRequest

        unknown = sorted(set(kwargs) - _CALL_OPTIONS)
        if unknown:
            valid = sorted(_CALL_OPTIONS - {"ls_structured_output_format", "stream"})
            raise InvalidInputError(f"ChatGPUPrompt got unexpected call option(s) {unknown}; valid: {valid}.")
        response_format = kwargs.get("response_format")
        tools = kwargs.get("tools")
        if tools:
            if response_format is not None:
                raise InvalidInputError("pass either tools (bind_tools) or response_format, not both.")
            messages, response_format = _tool_prompt(messages, tools, kwargs.get("tool_choice"))
        stops = stop if stop is not None else self.stop
        return GenerationRequest(
            messages=messages,
            max_tokens=kwargs.get("max_tokens", self.max_tokens),
            temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p),
            seed=kwargs.get("seed", self.seed),
            stop=tuple(stops or ()),
            priority=kwargs.get("priority", self.priority),
            response_format=response_format,
            truncate=kwargs.get("truncate", self.truncate),
        )

    def _prepare(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[GenerationRequest, Any, float | None, bool]:
        request = self._request(_to_core_messages(messages), stop, kwargs)
        model = kwargs.get("model", "__self__")
        timeout = kwargs.get("timeout", self.timeout)
        tool_mode = bool(kwargs.get("tools")) and request.response_format is not None
        return request, model, timeout, tool_mode

    def _check_backend(self, engine: LLMEngine, request: GenerationRequest) -> None:
        if request.response_format is not None and not engine.supports_structured_output:
            raise ConfigurationError(
                f"structured output and tool calling need JSON-schema guided decoding, which the "
                f"{engine.backend_name!r} backend does not support; use ChatGPUPrompt(backend='vllm')."
            )

    # ------------------------------------------------------------------ generation
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request, model, timeout, tool_mode = self._prepare(messages, stop, kwargs)
        engine = self._get_engine(model)
        self._check_backend(engine, request)
        [result] = engine.generate([request], timeout=timeout, max_retries=self.max_retries)
        return _chat_result(result, tool_mode)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request, model, timeout, tool_mode = self._prepare(messages, stop, kwargs)
        engine = await self._aget_engine(model)
        self._check_backend(engine, request)
        result = await engine.agenerate(request, timeout=timeout, max_retries=self.max_retries)
        return _chat_result(result, tool_mode)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        request, model, timeout, tool_mode = self._prepare(messages, stop, kwargs)
        engine = self._get_engine(model)
        self._check_backend(engine, request)
        deltas = engine.stream(request, timeout=timeout)
        try:
            pieces: list[str] = []
            for delta in deltas:
                chunk = _delta_chunk(delta, engine.model_name, tool_mode, pieces)
                if chunk is not None:
                    yield chunk  # BaseChatModel reports each chunk to the callbacks
        finally:
            close = getattr(deltas, "close", None)
            if close is not None:
                close()  # aborts the request in the engine when the consumer stops early

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        request, model, timeout, tool_mode = self._prepare(messages, stop, kwargs)
        engine = await self._aget_engine(model)
        self._check_backend(engine, request)
        deltas = engine.astream(request, timeout=timeout).__aiter__()
        try:
            pieces: list[str] = []
            while True:
                try:
                    delta = await deltas.__anext__()
                except StopAsyncIteration:
                    break
                chunk = _delta_chunk(delta, engine.model_name, tool_mode, pieces)
                if chunk is not None:
                    yield chunk  # BaseChatModel reports each chunk to the callbacks
        finally:
            aclose = getattr(deltas, "aclose", None)
            if aclose is not None:
                await aclose()

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[BaseMessage]:
        """Reply to every input, submitting all of them to the engine at once.

        LangChain's default ``batch`` runs ``invoke`` in a small thread pool, so the engine would
        see a few requests at a time; here every input is in flight together (through
        :meth:`abatch` on a private event loop, so the caller's loop, if any, is not needed).
        """
        if not inputs:
            return []
        return run_sync(self.abatch(inputs, config, return_exceptions=return_exceptions, **kwargs))

    # ------------------------------------------------------------------ tools and structured output
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; the model then replies with a tool call decoded under a JSON schema.

        The engine's guided decoding constrains the reply to ``{"name": <tool>, "arguments":
        {...}}`` with the tool's own argument schema, so a call is always well-formed.

        Args:
            tools: LangChain tools, pydantic models, functions or OpenAI tool dicts.
            tool_choice: ``"any"``/``"required"``/``True`` force some tool call; a tool name (or
                ``{"type": "function", "function": {"name": ...}}``) forces that tool;
                ``"auto"``/None let the model call a tool or answer in prose; ``"none"`` disables
                the tools for this binding.
            **kwargs: further call options bound with the tools.

        Raises:
            InvalidInputError: ``tool_choice`` names no bound tool, or has the wrong type.
        """
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        names = [tool["function"]["name"] for tool in formatted]
        choice = _normalize_tool_choice(tool_choice, names)
        if choice == "none":
            return self.bind(**kwargs)
        return self.bind(tools=formatted, tool_choice=choice, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """A runnable whose output follows ``schema``, produced by JSON-schema guided decoding.

        Args:
            schema: a pydantic class (v2 or v1), a TypedDict, or a JSON schema / OpenAI tool dict.
            method: ``"json_schema"`` (decode the schema itself), ``"function_calling"`` (as a
                forced tool call), or ``"json_mode"`` (any JSON object; parsed into ``schema``).
            include_raw: also return the raw message and any parsing error.
            strict: accepted for API compatibility; guided decoding always follows the schema.

        Returns:
            A runnable returning a ``schema`` instance (pydantic) or a dict.
        """
        if kwargs:
            raise InvalidInputError(f"with_structured_output() got unexpected argument(s) {sorted(kwargs)}.")
        if method not in ("json_schema", "function_calling", "json_mode"):
            raise InvalidInputError(
                f"'method' must be 'json_schema', 'function_calling' or 'json_mode' (got {describe(method)})."
            )
        pydantic_schema = isinstance(schema, type) and is_basemodel_subclass(schema)
        trace = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
        if method == "function_calling":
            name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools([schema], tool_choice=name, ls_structured_output_format=trace)
            parser: Runnable = (
                PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
                if pydantic_schema
                else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
            )
        else:
            response_format: dict[str, Any] = (
                {"type": "json_object"} if method == "json_mode" else _json_schema(schema)
            )
            llm = self.bind(response_format=response_format, ls_structured_output_format=trace)
            parser = (
                PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
                if pydantic_schema
                else JsonOutputParser()
            )
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        failed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")


# ---------------------------------------------------------------------- message conversion
def _message_text(message: BaseMessage, position: int) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, Mapping) and block.get("type") in ("tool_use", "tool_call", "reasoning", "thinking"):
            continue  # carried by tool_calls / not part of the visible text
        else:
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise InvalidInputError(
                f"'messages[{position}]' holds a {kind!r} content block; this chat model takes text only "
                "(send the text, or describe the image/file in words)."
            )
    return "".join(parts)


def _to_core_messages(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    core: list[dict[str, str]] = []
    for position, message in enumerate(messages):
        if not isinstance(message, BaseMessage):
            raise InputTypeError(f"'messages[{position}]' must be a BaseMessage (got {describe(message)}).")
        text = _message_text(message, position)
        if isinstance(message, SystemMessage):
            core.append({"role": "system", "content": text})
        elif isinstance(message, HumanMessage):
            core.append({"role": "user", "content": text})
        elif isinstance(message, AIMessage):
            if message.tool_calls:
                calls = [{"name": call["name"], "arguments": call["args"]} for call in message.tool_calls]
                text = (text + "\n" if text else "") + json.dumps(calls[0] if len(calls) == 1 else calls)
            core.append({"role": "assistant", "content": text})
        elif isinstance(message, ToolMessage):
            # The bundled chat templates know no tool role: the result goes back as a user turn.
            status = " (error)" if message.status == "error" else ""
            name = f" {message.name}" if message.name else ""
            result = f"Result of tool{name} call {message.tool_call_id}{status}: {text}"
            core.append({"role": "user", "content": result})
        elif isinstance(message, ChatMessage) and message.role in ("system", "user", "assistant"):
            core.append({"role": message.role, "content": text})
        else:
            raise InvalidInputError(
                f"'messages[{position}]' must be a system, human, AI or tool message (got a {type(message).__name__})."
            )
    return core


def _usage(usage: Usage | None) -> UsageMetadata | None:
    if usage is None:
        return None
    return UsageMetadata(
        input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens
    )


def _chat_result(result: GenerationResult, tool_mode: bool) -> ChatResult:
    metadata = {"model_name": result.model, "finish_reason": result.finish_reason}
    if tool_mode:
        message = _tool_message(result.text, _usage(result.usage), metadata)
    else:
        message = AIMessage(content=result.text, usage_metadata=_usage(result.usage), response_metadata=metadata)
    return ChatResult(generations=[ChatGeneration(message=message, generation_info=dict(metadata))])


def _delta_chunk(delta: StreamDelta, model_name: str, tool_mode: bool, pieces: list[str]) -> ChatGenerationChunk | None:
    last = delta.finish_reason is not None
    if tool_mode:
        # A tool call is only meaningful once its JSON is complete: hold the text until the end.
        pieces.append(delta.text)
        if not last:
            return None
        metadata = {"model_name": model_name, "finish_reason": delta.finish_reason}
        parsed = _tool_message("".join(pieces), _usage(delta.usage), metadata)
        chunks = [
            {"name": call["name"], "args": json.dumps(call["args"]), "id": call["id"], "index": i}
            for i, call in enumerate(parsed.tool_calls)
        ]
        message = AIMessageChunk(
            content=parsed.content,
            tool_call_chunks=chunks,
            usage_metadata=parsed.usage_metadata,
            response_metadata=metadata,
            chunk_position="last",
        )
        if parsed.invalid_tool_calls:
            message = AIMessageChunk(
                content="".join(pieces), usage_metadata=parsed.usage_metadata, response_metadata=metadata,
                chunk_position="last",
            )
        return ChatGenerationChunk(message=message, generation_info=dict(metadata))
    if not last:
        return ChatGenerationChunk(message=AIMessageChunk(content=delta.text))
    metadata = {"model_name": model_name, "finish_reason": delta.finish_reason}
    return ChatGenerationChunk(
        message=AIMessageChunk(
            content=delta.text, usage_metadata=_usage(delta.usage), response_metadata=metadata, chunk_position="last"
        ),
        generation_info=dict(metadata),
    )


# ---------------------------------------------------------------------- tool calling
def _normalize_tool_choice(tool_choice: Any, names: list[str]) -> str:
    if tool_choice is None or tool_choice == "auto":
        return "auto"
    if tool_choice is True or tool_choice in ("any", "required"):
        return "any"
    if tool_choice is False or tool_choice == "none":
        return "none"
    if isinstance(tool_choice, Mapping):
        tool_choice = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    if isinstance(tool_choice, str) and tool_choice in names:
        return tool_choice
    raise InvalidInputError(
        f"'tool_choice' must be 'auto', 'any', 'required', 'none', True, or the name of a bound tool {names} "
        f"(got {describe(tool_choice)})."
    )


def _call_schema(name: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [name]}, "arguments": dict(parameters)},
        "required": ["name", "arguments"],
    }


def _tool_prompt(
    messages: list[dict[str, str]], tools: list[dict[str, Any]], choice: str
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    functions = [tool["function"] for tool in tools]
    if choice not in ("auto", "any"):
        functions = [f for f in functions if f["name"] == choice]
    options = [_call_schema(f["name"], f.get("parameters") or {"type": "object", "properties": {}}) for f in functions]
    listing = "\n".join(
        json.dumps({"name": f["name"], "description": f.get("description", ""), "parameters": f.get("parameters", {})})
        for f in functions
    )
    instruction = (
        "You can call these tools:\n" + listing + '\nReply with one JSON object {"name": <tool name>, "arguments": '
        "{<argument>: <value>}} to call a tool."
    )
    if choice == "auto":
        options.append(_call_schema(_ANSWER_TOOL, {"type": "object", "properties": {"content": {"type": "string"}},
                                                   "required": ["content"]}))
        instruction += (
            f' To answer the user directly instead, reply {{"name": "{_ANSWER_TOOL}", "arguments": '
            '{"content": <your answer>}}.'
        )
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if messages and messages[0]["role"] == "system":
        merged = {"role": "system", "content": messages[0]["content"] + "\n\n" + instruction}
        return [merged, *messages[1:]], schema
    return [{"role": "system", "content": instruction}, *messages], schema


def _tool_message(text: str, usage: UsageMetadata | None, metadata: dict[str, Any]) -> AIMessage:
    try:
        payload = json.loads(text)
        calls = payload if isinstance(payload, list) else [payload]
        parsed = [(call["name"], call.get("arguments") or {}) for call in calls]
        if not all(isinstance(name, str) and isinstance(args, dict) for name, args in parsed):
            raise TypeError("a tool call needs a str name and a dict of arguments")
    except (ValueError, TypeError, KeyError) as exc:
        return AIMessage(
            content=text,
            invalid_tool_calls=[
                {"name": None, "args": text, "id": None, "error": str(exc), "type": "invalid_tool_call"}
            ],
            usage_metadata=usage,
            response_metadata=metadata,
        )
    answers = [str(args.get("content", "")) for name, args in parsed if name == _ANSWER_TOOL]
    tool_calls = [
        {"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "tool_call"}
        for name, args in parsed
        if name != _ANSWER_TOOL
    ]
    return AIMessage(
        content="\n".join(answers), tool_calls=tool_calls, usage_metadata=usage, response_metadata=metadata
    )


def _json_schema(schema: dict[str, Any] | type) -> dict[str, Any]:
    if isinstance(schema, Mapping) and "function" in schema and schema.get("type") == "function":
        return dict(schema["function"].get("parameters") or {})
    converted = convert_to_json_schema(schema)
    if "parameters" in converted and "properties" not in converted:
        return dict(converted["parameters"])  # an OpenAI function dict
    return converted
