"""LangChain chat model over gpuprompt's batched LLMEngine (vLLM or transformers behind one interface).

The adapter converts LangChain messages, tools and tool choices to engine requests and engine
results to LangChain messages (:mod:`langchain_gpuprompt._chat_convert`); batching, streaming,
stop strings, cancellation, the tool prompt format, the tool-call parser and guided decoding all
live in the core. The class gets its runtime once (:func:`gpuprompt.connect`): with ``base_url``
(or ``GPUPROMPT_URL``) the engine is a running ``gpuprompt serve``'s (a ``RemoteLLM``), else the
process's shared one; nothing else changes here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Literal

from gpuprompt.bridge import run_sync
from gpuprompt.errors import ConfigurationError, InvalidInputError, describe
from gpuprompt.llm import check_call_policy
from gpuprompt.models import BUNDLED_CHAT_MODEL
from gpuprompt.remote import ENV_API_KEY
from gpuprompt.runtime import connect
from gpuprompt.validation import configuration_error, read_aliases
from gpuprompt.wire import EXTRA_SAMPLING, redact
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput, ModelProfile
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import JsonOutputKeyToolsParser, JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import PydanticToolsParser
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError

from langchain_gpuprompt._chat_convert import (
    PROVIDER,
    chat_result,
    core_messages,
    core_tool_choice,
    delta_chunk,
    json_schema,
)

if TYPE_CHECKING:
    from gpuprompt.llm import GenerationRequest
    from gpuprompt.protocols import EngineLike
    from gpuprompt.remote import RemoteRuntime
    from gpuprompt.runtime import Runtime

__all__ = ["ChatGPUPrompt"]

_ALIASES = {"model_name": "model", "max_completion_tokens": "max_tokens", "max_new_tokens": "max_tokens",
            "stop_sequences": "stop"}
"""Other chat models' names for the same settings (ChatOpenAI's ``model_name``,
``max_completion_tokens`` and ``stop_sequences``, Hugging Face's ``max_new_tokens``), read as ours."""

_CALL_OPTIONS = frozenset(
    {"model", "max_tokens", "temperature", "top_p", "seed", "priority", "truncate", "timeout", "response_format",
     "tools", "tool_choice", "parallel_tool_calls", "stream", "ls_structured_output_format", *EXTRA_SAMPLING}
)
"""The keyword options of a call (``stop`` comes as LangChain's own argument); ``EXTRA_SAMPLING``
holds the core's other sampling fields (top_k, min_p, the penalties, logit_bias, vLLM's
end-of-reply fields)."""


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
            msg.usage_metadata        # cache_read: prompt tokens the prefix cache served (vLLM)
            # {'input_tokens': 22, 'output_tokens': 11, 'total_tokens': 33}
            msg.response_metadata
            # {'model_provider': 'gpuprompt', 'model_name': 'HuggingFaceTB/SmolLM2-135M-Instruct',
            #  'finish_reason': 'stop'}

    Stream:
        .. code-block:: python

            for chunk in llm.stream("Name three colours."):
                print(chunk.content, end="")
            # 1. Red: This is the most obvious colour, ...

    Async and batch (one engine batch for all inputs):
        .. code-block:: python

            await llm.ainvoke("Hello")
            llm.batch(["Hello", "What is a return policy?"])

    Structured output (JSON-schema guided decoding, on both backends):
        .. code-block:: python

            from pydantic import BaseModel

            class Product(BaseModel):
                name: str
                price: float

            llm.with_structured_output(Product).invoke("A red dress that costs 40 euros.")
            # Product(name='Ava', price=40.0)          (the schema always holds; the 135M model's
            #                                           reading of the text is another matter)

    Tool calling (the core renders the tools with the model's chat template and decodes a forced
    call under the tool's schema; both backends):
        .. code-block:: python

            llm.bind_tools([get_order_status], tool_choice="any").invoke("Where is order 42?").tool_calls
            # [{'name': 'get_order_status', 'args': {'order_id': 42}, 'id': 'call_a8b0...', 'type': 'tool_call'}]

    Agents (LangChain v1): ``create_agent(ChatGPUPrompt(), tools, response_format=Schema)``; the
    model's :attr:`profile` tells the agent it supports tool calling, tool choice and native
    structured output.

    Remote mode (many worker processes share one ``gpuprompt serve`` and its batches; the worker
    imports no torch and loads no model):
        .. code-block:: python

            llm = ChatGPUPrompt(base_url="http://127.0.0.1:8000", api_key="...", max_tokens=64)
            # or set GPUPROMPT_URL (and GPUPROMPT_API_KEY) and keep ChatGPUPrompt(max_tokens=64)

        Everything above works the same (streaming, async, batch, tools, structured output) with
        the same typed errors: a busy server raises ``QueueFullError`` (``retry_after`` set), a
        dead engine ``EngineDeadError``. ``backend``, ``device`` and ``engine_kwargs`` configure a
        local engine and are refused with ``base_url``; ``truncate='left'`` travels with each request
        (the server drops the oldest turns, as in process).
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
    frequency_penalty: float = 0.0
    """Penalise tokens by how often they appeared in the reply, in [-2, 2] (OpenAI semantics)."""
    presence_penalty: float = 0.0
    """Penalise tokens that appeared in the reply at all, in [-2, 2] (OpenAI semantics)."""
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Further sampling fields of every call, as ChatOpenAI's ``model_kwargs``: any of
    ``gpuprompt.GenerationRequest``'s ``top_k``, ``min_p``, ``repetition_penalty``, ``logit_bias``,
    ``stop_token_ids``, ``min_tokens``, ``ignore_eos``, ``include_stop_str_in_output``,
    ``skip_special_tokens`` (a call's own keyword wins)."""
    timeout: float | None = None
    """Seconds a request may take before it is aborted in the engine and TimeoutError raised; in
    remote mode also the most seconds any request to the server waits for an answer (the model-list
    probe included; None reads ``GPUPROMPT_TIMEOUT``)."""
    max_retries: int = 2
    """Retries after a transient engine failure (a full queue or a failed batch), not bad input."""
    streaming: bool = False
    """Serve invoke() through the streaming path (callbacks then see each token)."""
    priority: int = 0
    """Engine priority of this model's requests; lower is served first under load."""
    truncate: Literal["error", "left"] = "error"
    """'error' raises ContextLengthError on a too-long prompt; 'left' drops the oldest turns."""
    base_url: str | None = None
    """A running ``gpuprompt serve`` to generate on (remote mode); None reads ``GPUPROMPT_URL``, and
    without it the engine runs in this process."""
    api_key: SecretStr | None = None
    """The server's API key (remote mode); None reads ``GPUPROMPT_API_KEY`` when ``GPUPROMPT_URL`` is used."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    _engine_cache: EngineLike | None = PrivateAttr(default=None)
    _runtime: Runtime | RemoteRuntime | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        data = read_aliases(data, _ALIASES, "ChatGPUPrompt")  # the names a user of ChatOpenAI / HuggingFace types
        try:
            super().__init__(**data)
        except ValidationError as exc:  # a field of the wrong type: our typed error, naming it
            raise configuration_error(exc, "ChatGPUPrompt") from exc
        # Pure-Python checks (nothing loads): bad settings fail here with the core's typed error,
        # not inside a pydantic validator that would rewrap them.
        check_call_policy(self.timeout, self.max_retries)
        self._runtime = connect(
            self.base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            owner="ChatGPUPrompt",
            local_options={"backend": (self.backend, "auto"), "device": (self.device, "auto"),
                           "engine_kwargs": (self.engine_kwargs, {})},
        )
        if self._runtime.remote:
            config = self._runtime.config
            self.base_url = config.base_url
            if config.api_key is not None:
                self.api_key = SecretStr(config.api_key)
        else:
            self._config()
        unknown = sorted(set(self.model_kwargs) - set(EXTRA_SAMPLING))
        if unknown:
            raise ConfigurationError(
                f"unknown 'model_kwargs' key(s) {unknown}; valid: {sorted(EXTRA_SAMPLING)} (the other settings are "
                "fields of ChatGPUPrompt)."
            )
        self._request([{"role": "user", "content": ""}], None, {})  # checks the sampling settings

    @property
    def lc_secrets(self) -> dict[str, str]:
        return {"api_key": ENV_API_KEY}

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

    def _shared_engine(self, model: str | None | Literal["__self__"]) -> EngineLike:
        """The runtime's engine for these settings: the process's shared engine, or in remote mode
        the process's client of the server (looked up, not started)."""
        assert self._runtime is not None
        name = self.model if model == "__self__" else model
        if self._runtime.remote:
            return self._runtime.llm(name, max_model_len=self.max_model_len)
        config = self._config(model)
        options = {option: getattr(config, option) for option in config.option_names()}
        return self._runtime.llm(config.model, **options)

    def _get_engine(self, model: str | None | Literal["__self__"] = "__self__") -> EngineLike:
        if model == "__self__" and self._engine_cache is not None:
            return self._engine_cache
        engine = self._shared_engine(model).load()
        if model == "__self__":
            self._engine_cache = engine
        return engine

    @property
    def engine(self) -> EngineLike:
        """The shared core engine for these settings (started on first access); in remote mode a
        :class:`gpuprompt.remote.RemoteLLM` with the same interface."""
        return self._get_engine()

    async def _aget_engine(self, model: str | None | Literal["__self__"]) -> EngineLike:
        if model == "__self__" and self._engine_cache is not None:
            return self._engine_cache
        # Starting an engine loads a model (and may spawn vLLM): never on the event loop.
        engine = await self._shared_engine(model).aload()
        if model == "__self__":
            self._engine_cache = engine
        return engine

    def _resolve_model_profile(self) -> ModelProfile | None:
        """What the model supports, for agents (``create_agent`` reads ``structured_output``).

        Static (nothing loads): both backends call tools (with ``tool_choice``), stream tool-call
        chunks and decode JSON schemas natively; text in, text out.
        """
        return ModelProfile(
            name=self.model or BUNDLED_CHAT_MODEL,
            open_weights=True,
            max_input_tokens=self.max_model_len,
            text_inputs=True,
            image_inputs=False,
            image_url_inputs=False,
            pdf_inputs=False,
            audio_inputs=False,
            video_inputs=False,
            image_tool_message=False,
            pdf_tool_message=False,
            text_outputs=True,
            image_outputs=False,
            audio_outputs=False,
            video_outputs=False,
            reasoning_output=False,
            tool_calling=True,
            tool_choice=True,
            tool_call_streaming=True,
            structured_output=True,
            temperature=True,
        )

    # ------------------------------------------------------------------ LangChain plumbing
    @property
    def _llm_type(self) -> str:
        return "gpuprompt-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
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
        params.update(self._sampling())  # the other sampling settings change the reply: they part cache keys
        if self._runtime is not None and self._runtime.remote:  # another server is another model instance
            params.update(backend="remote", base_url=redact(self._runtime.config.base_url))
        return params

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider=PROVIDER,
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
        """Tokens of ``messages`` with the chat template applied (and ``tools`` rendered in, as a
        request bound to them would be), as the engine will see them."""
        formatted = [convert_to_openai_tool(tool) for tool in tools] if tools else None
        return self.engine.count_tokens(core_messages(messages), tools=formatted)

    # ------------------------------------------------------------------ request building
    def _sampling(self) -> dict[str, Any]:
        """The core's sampling fields this model sets beyond their defaults: ``model_kwargs``, then
        the ``frequency_penalty`` / ``presence_penalty`` fields over them."""
        sampling = dict(self.model_kwargs)
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) != EXTRA_SAMPLING[name]:
                sampling[name] = getattr(self, name)
        return sampling

    def _request(
        self, messages: list[dict[str, Any]], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> GenerationRequest:
        from gpuprompt.llm import GenerationRequest

        unknown = sorted(set(kwargs) - _CALL_OPTIONS)
        if unknown:
            valid = sorted(_CALL_OPTIONS - {"ls_structured_output_format", "stream"} | {"stop"})
            raise InvalidInputError(f"ChatGPUPrompt got unexpected call option(s) {unknown}; valid: {valid}.")
        response_format = kwargs.get("response_format")
        if isinstance(response_format, type):  # a pydantic class / TypedDict, as ChatOpenAI takes it
            response_format = json_schema(response_format)
        stops = stop if stop is not None else self.stop
        tool_options: dict[str, Any] = {}
        if kwargs.get("tools"):
            tool_options["tools"] = kwargs["tools"]
            tool_options["tool_choice"] = core_tool_choice(kwargs.get("tool_choice"))
            if kwargs.get("parallel_tool_calls") is not None:
                tool_options["parallel_tool_calls"] = kwargs["parallel_tool_calls"]
        elif kwargs.get("tool_choice") not in (None, "auto", "none", False):
            raise InvalidInputError(
                f"'tool_choice' {describe(kwargs['tool_choice'])} needs tools; bind them with bind_tools(tools, ...)."
            )
        sampling = self._sampling()
        sampling.update((name, kwargs[name]) for name in EXTRA_SAMPLING if name in kwargs)  # a call's own win
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
            **sampling,
            **tool_options,
        )

    def _prepare(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[GenerationRequest, Any, float | None]:
        request = self._request(core_messages(messages), stop, kwargs)
        return request, kwargs.get("model", "__self__"), kwargs.get("timeout", self.timeout)

    # ------------------------------------------------------------------ generation
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request, model, timeout = self._prepare(messages, stop, kwargs)
        engine = self._get_engine(model)
        [result] = engine.generate([request], timeout=timeout, max_retries=self.max_retries)
        return chat_result(result)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request, model, timeout = self._prepare(messages, stop, kwargs)
        engine = await self._aget_engine(model)
        result = await engine.agenerate(request, timeout=timeout, max_retries=self.max_retries)
        return chat_result(result)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        request, model, timeout = self._prepare(messages, stop, kwargs)
        engine = self._get_engine(model)
        deltas = engine.stream(request, timeout=timeout)
        try:
            for delta in deltas:
                yield delta_chunk(delta, engine.model_name)  # BaseChatModel reports it to the callbacks
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
        request, model, timeout = self._prepare(messages, stop, kwargs)
        engine = await self._aget_engine(model)
        deltas = engine.astream(request, timeout=timeout).__aiter__()
        try:
            while True:
                try:
                    delta = await deltas.__anext__()
                except StopAsyncIteration:
                    break
                yield delta_chunk(delta, engine.model_name)  # BaseChatModel reports it to the callbacks
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
        tools: Sequence[Mapping[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | Mapping[str, Any] | bool | None = None,
        strict: bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools: the engine shows them to the model and returns typed tool calls.

        The core renders the tools with the model's own chat template (or its fallback format),
        constrains a forced call by guided decoding to a well-formed call of a bound tool with
        arguments valid under the tool's schema, and parses the reply into ``tool_calls``.

        Args:
            tools: LangChain tools, pydantic models, functions or OpenAI tool dicts.
            tool_choice: ``"any"``/``"required"``/``True`` force some tool call; a tool name (or
                ``{"type": "function", "function": {"name": ...}}``) forces that tool;
                ``"auto"``/None let the model call a tool or answer in prose; ``"none"``/False
                describe the tools but produce no call.
            strict: mark the tools strict (OpenAI's flag; forced calls are always decoded under
                the schema here).
            parallel_tool_calls: False allows at most one call per reply (default: several).
            **kwargs: further call options bound with the tools.

        Raises:
            InvalidInputError: a bad tool, or ``tool_choice`` names no bound tool / has the wrong type.
        """
        from gpuprompt.llm import ToolSpec, check_tool_choice

        formatted = [convert_to_openai_tool(tool, strict=strict) for tool in tools]
        choice = core_tool_choice(tool_choice)
        # Each tool and the choice fail here, not at invoke (the whole request, e.g. two tools of one
        # name, is checked when it is built: binding alone is allowed, as in other chat models).
        check_tool_choice(choice, [ToolSpec.from_openai(tool, f"tools[{i}]") for i, tool in enumerate(formatted)])
        bound: dict[str, Any] = {"tools": formatted, "tool_choice": choice, **kwargs}
        if parallel_tool_calls is not None:
            bound["parallel_tool_calls"] = parallel_tool_calls
        return self.bind(**bound)

    def with_structured_output(
        self,
        schema: Mapping[str, Any] | type,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """A runnable whose output follows ``schema``, produced by guided decoding (both backends).

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
            # One call of the schema's tool, as langchain-openai binds it.
            llm = self.bind_tools([schema], tool_choice=name, strict=strict, parallel_tool_calls=False,
                                  ls_structured_output_format=trace)
            parser: Runnable = (
                PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
                if pydantic_schema
                else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
            )
        else:
            response_format: dict[str, Any] = (
                {"type": "json_object"} if method == "json_mode" else json_schema(schema)
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
