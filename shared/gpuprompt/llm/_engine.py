"""LLMEngine: batched generation behind one interface, over vLLM or transformers.

Sync methods work from any thread and need no event loop of the caller's; async methods never
block the caller's loop; cancelling an awaiting task (or closing a stream) aborts the request
inside the backend.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from gpuprompt.device import resolve_device
from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    GPUPromptError,
    InputTypeError,
    ModelLoadError,
    RequestTimeoutError,
    UnsupportedFeatureError,
    describe,
)
from gpuprompt.llm._backend import Backend
from gpuprompt.llm._chat import ChatFormatter, Prepared
from gpuprompt.llm._config import LLMConfig
from gpuprompt.llm._job import End, Failure, Job, Text
from gpuprompt.llm._policy import CallPolicy
from gpuprompt.llm._types import EngineStats, GenerationRequest, GenerationResult, StreamDelta
from gpuprompt.models import BUNDLED_CHAT_MODEL, resolve_chat_model
from gpuprompt.wire import EXTRA_SAMPLING, GUIDED_FIELDS

__all__ = ["LLMEngine"]

logger = logging.getLogger(__name__)

# Async callers prepare (template + tokenize) on the loop thread only for prompts this small.
_ASYNC_INLINE_CHARS = 8192


class LLMEngine:
    """Batched text generation with one interface over several backends.

    Nothing is loaded until the first call (or :meth:`load`). Concurrent calls from threads and
    tasks are batched together by the backend: vLLM's continuous batching, or padded
    ``generate`` batches formed by the MicroBatcher. Use :meth:`gpuprompt.Runtime.llm` to share
    one engine per configuration in a process.

    Example:
        >>> from gpuprompt import GenerationRequest, LLMEngine
        >>> engine = LLMEngine(backend="transformers")        # bundled SmolLM2-135M-Instruct
        >>> request = GenerationRequest(messages=[{"role": "user", "content": "Name a color."}],
        ...                             max_tokens=8)
        >>> [result] = engine.generate([request])
        >>> result.text, result.finish_reason, result.usage.completion_tokens
        ("The color I'm referring to is a", 'length', 8)
        >>> for delta in engine.stream(request):                # or: async for ... in astream()
        ...     print(delta.text, end="|")
        The| color| I|'m| referring| to| is| a||
        >>> engine.close()

    Share one engine per configuration with ``get_runtime().llm(backend="vllm")``; on vLLM, the
    script that starts it must be a file guarded by ``if __name__ == "__main__":`` (vLLM spawns
    its engine core).

    Args:
        model: a local folder, a ``.gguf`` file, a hub id, or None for the bundled
            SmolLM2-135M-Instruct.
        config: a full :class:`LLMConfig` (then pass no other option).
        **options: the other :class:`LLMConfig` fields: ``backend`` (``"auto"``, ``"vllm"``,
            ``"transformers"``, ``"remote"`` with ``base_url`` / ``api_key`` / ``session_header``), ``device``, ``max_model_len``, ``dtype``, ``max_num_seqs``,
            ``max_num_batched_tokens``, ``quantization``, ``gpu_memory_utilization``,
            ``tensor_parallel_size``, ...

    Raises:
        ConfigurationError: an unknown or invalid option (the message lists the valid ones).
    """

    def __init__(self, model: str | None = None, *, config: LLMConfig | None = None, **options: Any) -> None:
        if config is not None and (model is not None or options):
            raise ConfigurationError("pass either 'config' or individual options to LLMEngine, not both.")
        if config is None:
            valid = LLMConfig.option_names()
            unknown = sorted(set(options) - set(valid))
            if unknown:
                raise ConfigurationError(f"unknown LLMEngine option(s) {unknown}; valid options: {valid}.")
            config = LLMConfig(model=model, **options)
        elif not isinstance(config, LLMConfig):
            raise ConfigurationError(f"'config' must be an LLMConfig (got {describe(config)}).")
        self.config = config
        self._model_name = config.model or BUNDLED_CHAT_MODEL
        self._load_lock = threading.Lock()
        self._formatter: ChatFormatter | None = None
        self._model_path: str | None = None
        self._device: str | None = None
        self._backend: Backend | None = None
        self._closed = False
        self._stats_lock = threading.Lock()
        self._requests = self._completed = self._aborted = self._failed = self._in_flight = 0
        self._prompt_tokens = self._completion_tokens = 0

    def __repr__(self) -> str:
        backend = self._backend.name if self._backend is not None else f"{self.config.backend} (not loaded)"
        state = "closed" if self._closed else "open"
        return f"<LLMEngine {self._model_name!r} backend={backend} {state}>"

    # ------------------------------------------------------------------ properties
    @property
    def model_name(self) -> str:
        """The model's name as configured (the bundled model's hub id when None)."""
        return self._model_name

    @property
    def backend_name(self) -> str:
        """``"vllm"`` or ``"transformers"`` (loads the engine, which resolves ``"auto"``)."""
        return self.load()._backend_or_raise().name

    @property
    def context_window(self) -> int:
        """Most prompt + generated tokens per request (loads the tokenizer and config only)."""
        return self._ensure_formatter().context_window

    @property
    def supports_structured_output(self) -> bool:
        """Whether ``response_format`` works on this engine's backend (loads the engine)."""
        return self.load()._backend_or_raise().supports_structured_output

    @property
    def supports_tools(self) -> bool:
        """Whether ``tools`` work on this engine's backend (constrained tool calls; loads the engine)."""
        return bool(self.load()._backend_or_raise().capabilities["tools"])

    @property
    def capabilities(self) -> dict[str, Any]:
        """What the backend honours: ``sampling`` fields, ``guided`` kinds (``json``,
        ``json_object``, ``regex``, ``choice``), ``tools``, ``structured_output``, ``prefix_cache``
        (whether ``Usage.cached_tokens`` can be non-zero), ``native_tool_template`` (the model's
        chat template renders tools itself) and ``context_window`` (loads the engine)."""
        capabilities = dict(self.load()._backend_or_raise().capabilities)
        formatter = self._ensure_formatter()
        capabilities["native_tool_template"] = formatter.native_tools
        capabilities["context_window"] = formatter.context_window
        return capabilities

    @property
    def device(self) -> str:
        """The resolved device string (``"remote"`` for ``backend="remote"``)."""
        if self._device is None and self.config.backend == "remote":
            self._device = "remote"
        if self._device is None:
            self._device = resolve_device(self.config.device)
        return self._device

    # ------------------------------------------------------------------ loading
    def _ensure_formatter(self) -> ChatFormatter:
        if self._formatter is not None:
            return self._formatter
        with self._load_lock:
            self._check_open()
            if self._formatter is None:
                self._formatter = self._make_formatter()
        return self._formatter

    def _make_formatter(self) -> ChatFormatter:
        try:
            from transformers import AutoConfig, AutoTokenizer
        except ImportError as exc:
            from gpuprompt.errors import DependencyError

            raise DependencyError("LLMEngine needs transformers: pip install transformers") from exc
        path = resolve_chat_model(self.config.model)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model_config = AutoConfig.from_pretrained(path)
        except Exception as exc:
            raise ModelLoadError(
                f"could not load the tokenizer/config of {self._model_name!r} from {path!r}: {exc}. Pass a local "
                "model folder, a .gguf file, or a hub id available offline."
            ) from exc
        limit = getattr(model_config, "max_position_embeddings", None) or self.config.max_model_len
        window = min(self.config.max_model_len, int(limit))
        if window < self.config.max_model_len:
            logger.info("max_model_len %d capped to the model's %d positions", self.config.max_model_len, window)
        self._model_path = path
        return ChatFormatter(tokenizer, window, self._model_name)

    def load(self) -> LLMEngine:
        """Load the model and start the backend now (otherwise the first call does).

        With ``backend="auto"``, vLLM is tried first when importable; if it is missing or does not
        start, the transformers backend is used and the reason is logged (once).

        Raises:
            ClosedError: the engine was closed.
            DependencyError: ``backend="vllm"`` and vLLM is not installed.
            ModelLoadError: the model or the backend could not be loaded.
        """
        if self._backend is not None:
            return self
        formatter = self._ensure_formatter()
        with self._load_lock:
            self._check_open()
            if self._backend is None:
                self._backend = self._start_backend(formatter.context_window)
        return self

    async def aload(self) -> LLMEngine:
        """Async :meth:`load`: loads on a worker thread, never on the caller's event loop."""
        if self._backend is None:
            await asyncio.to_thread(self.load)
        return self

    def _start_backend(self, window: int) -> Backend:
        from gpuprompt.llm.backends._transformers import TransformersBackend
        from gpuprompt.llm.backends._vllm import VLLMBackend, vllm_available

        assert self._model_path is not None
        choice = self.config.backend
        if choice == "remote":  # the model runs on the server: no local device, no torch
            from gpuprompt.llm.backends._openai_http import RemoteBackend

            remote = RemoteBackend(self.config, self._model_path, window, "remote")
            remote.start()
            return remote
        args = (self.config, self._model_path, window, self.device)
        if choice == "transformers":
            backend: Backend = TransformersBackend(*args)
            backend.start()
            return backend
        if choice == "vllm":
            backend = VLLMBackend(*args)
            backend.start()
            return backend
        reason: str
        if not vllm_available():
            reason = "vLLM is not installed (pip install 'gpuprompt[gpu]' or 'gpuprompt[cpu]')"
        elif not (self.device == "cpu" or self.device.startswith("cuda")):
            reason = f"vLLM does not run on device {self.device!r}"
        else:
            backend = VLLMBackend(*args)
            try:
                backend.start()
                return backend
            except GPUPromptError as exc:
                reason = f"vLLM did not start: {exc}"
        logger.warning("LLMEngine(backend='auto') for %s uses transformers: %s", self._model_name, reason)
        backend = TransformersBackend(*args)
        backend.start()
        return backend

    def _backend_or_raise(self) -> Backend:
        backend = self._backend
        if backend is None or self._closed:
            raise ClosedError("this LLMEngine was closed; create a new one (or ask get_runtime().llm()).")
        return backend

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this LLMEngine was closed; create a new one (or ask get_runtime().llm()).")

    # ------------------------------------------------------------------ tokens
    def count_tokens(
        self, messages_or_prompt: str | Sequence[Mapping[str, Any]] | GenerationRequest, *, tools: Any = None
    ) -> int:
        """Count tokens as the engine will: a raw prompt as is, chat messages with the model's chat
        template and the generation prompt applied (with ``tools`` rendered in, as a request with
        those tools would be), or a whole GenerationRequest. Loads only the tokenizer.

        Raises:
            InputTypeError: neither a str nor a list of message dicts.
            InvalidInputError: a message or tool is malformed.
        """
        return self._ensure_formatter().count(messages_or_prompt, tools=tools)

    def tokenize(
        self, messages_or_prompt: str | Sequence[Mapping[str, Any]] | GenerationRequest, *, tools: Any = None
    ) -> list[int]:
        """The token ids :meth:`count_tokens` counts (a raw prompt with the tokenizer's special tokens;
        chat messages with the chat template, the generation prompt and ``tools`` applied). Loads
        only the tokenizer.

        Raises:
            InputTypeError: neither a str nor a list of message dicts.
            InvalidInputError: a message or tool is malformed.
        """
        return self._ensure_formatter().tokenize(messages_or_prompt, tools=tools)

    def template_variables(self) -> frozenset[str]:
        """The names the chat template reads from its context (``messages``, ``tools``, and options
        such as ``enable_thinking``); ``{"*"}`` when its source cannot be read. A name it does not
        read changes no prompt. Loads only the tokenizer."""
        return self._ensure_formatter().template_variables

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids, as the model's tokenizer decodes them. Loads only the tokenizer.

        Raises:
            InputTypeError: ``ids`` is not a list.
            InvalidInputError: an item that is not a token id of the vocabulary.
        """
        return self._ensure_formatter().detokenize(ids)

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        """Each token id as the tokenizer's vocabulary spells it (``convert_ids_to_tokens``, as vLLM's
        ``/tokenize`` returns ``token_strs``). Loads only the tokenizer.

        Raises:
            InputTypeError: ``ids`` is not a list.
            InvalidInputError: an item that is not a token id of the vocabulary.
        """
        return self._ensure_formatter().token_strs(ids)

    def _prepare(self, request: Any) -> Prepared:
        if not isinstance(request, GenerationRequest):
            raise InputTypeError(
                f"'request' must be a GenerationRequest (got {describe(request)}); build one with "
                "GenerationRequest(messages=[{'role': 'user', 'content': text}])."
            )
        self.load()
        backend = self._backend_or_raise()
        _check_supported(request, backend)
        prepared = self._ensure_formatter().prepare(request)
        backend.check(prepared)
        return prepared

    async def _aprepare(self, request: Any) -> Prepared:
        await self.aload()
        if isinstance(request, GenerationRequest) and _size(request) > _ASYNC_INLINE_CHARS:
            return await asyncio.to_thread(self._prepare, request)
        return self._prepare(request)

    # ------------------------------------------------------------------ job plumbing
    def _new_job(self, prepared: Prepared) -> Job:
        return Job(prepared, self._model_name, self._on_end)

    def _submit(self, jobs: list[Job], *, from_coroutine: bool = False) -> None:
        backend = self._backend_or_raise()
        with self._stats_lock:
            self._requests += len(jobs)
            self._in_flight += len(jobs)
        try:
            backend.submit_many(jobs, coalesce=from_coroutine)
        except BaseException:
            # Rejected before any ran: undo the counts for jobs the backend never took.
            for job in jobs:
                job.cancel()
            untaken = [job for job in jobs if job.discard()]
            with self._stats_lock:
                self._requests -= len(untaken)
                self._in_flight -= len(untaken)
            raise

    def _on_end(self, job: Job, event: End | Failure) -> None:
        with self._stats_lock:
            self._in_flight -= 1
            if isinstance(event, Failure):
                self._failed += 1
                return
            result = event.result
            if result.finish_reason == "abort":
                self._aborted += 1
            else:
                self._completed += 1
            self._prompt_tokens += result.usage.prompt_tokens
            self._completion_tokens += result.usage.completion_tokens

    @staticmethod
    def _collect(job: Job) -> GenerationResult:
        while True:
            event = job.next_event()
            if isinstance(event, End):
                return event.result
            if isinstance(event, Failure):
                raise event.error

    @staticmethod
    async def _acollect(job: Job) -> GenerationResult:
        while True:
            event = await job.anext_event()
            if isinstance(event, End):
                return event.result
            if isinstance(event, Failure):
                raise event.error

    # ------------------------------------------------------------------ public API
    def generate(
        self, requests: Sequence[GenerationRequest], *, timeout: float | None = None, max_retries: int = 0
    ) -> list[GenerationResult]:
        """Generate for several requests at once (they are batched together); blocks the calling
        thread, which needs no event loop.

        Every request is validated and fitted before any is queued: a bad one fails the call and
        nothing runs.

        Args:
            requests: a list of :class:`GenerationRequest`.
            timeout: most seconds per request (None: no limit); a late request is aborted and
                raises ``RequestTimeoutError``.
            max_retries: further attempts after ``QueueFullError`` or a transient engine error
                (see :class:`~gpuprompt.llm.CallPolicy`).

        Returns:
            One :class:`GenerationResult` per request, in order.

        Raises:
            InputTypeError: ``requests`` is not a list of GenerationRequest.
            ContextLengthError: a prompt does not fit the context window (and ``truncate="error"``).
            UnsupportedFeatureError: a field the backend cannot honour (named in ``.field``).
            EngineError: the backend failed (the other requests are cancelled).
            RequestTimeoutError: a request took longer than ``timeout``.
        """
        policy = CallPolicy(timeout=timeout, max_retries=max_retries)
        if isinstance(requests, GenerationRequest):
            raise InputTypeError(
                "'requests' must be a list of GenerationRequest, got a bare GenerationRequest; wrap it in a "
                "list: generate([request])."
            )
        if not isinstance(requests, Sequence) or isinstance(requests, (str, bytes)):
            raise InputTypeError(f"'requests' must be a list of GenerationRequest (got {describe(requests)}).")
        for index, request in enumerate(requests):
            if not isinstance(request, GenerationRequest):
                raise InputTypeError(f"'requests[{index}]' must be a GenerationRequest (got {describe(request)}).")
        if not requests:
            return []
        if policy.timeout is not None:
            from gpuprompt.bridge import run_sync

            return run_sync(self._agenerate_all(list(requests), policy))
        if policy.max_retries:
            return policy.run_blocking(lambda: self._generate_once(list(requests)))
        return self._generate_once(list(requests))

    def _generate_once(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        prepared = [self._prepare(request) for request in requests]
        jobs = [self._new_job(p) for p in prepared]
        self._submit(jobs)
        try:
            return [self._collect(job) for job in jobs]
        finally:
            for job in jobs:
                job.cancel()

    async def _agenerate_all(self, requests: list[GenerationRequest], policy: CallPolicy) -> list[GenerationResult]:
        for request in requests:  # validate and fit every request before any is queued
            self._prepare(request)
        tasks = [asyncio.ensure_future(policy.run(lambda r=r: self._agenerate_once(r))) for r in requests]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def agenerate(
        self, request: GenerationRequest, *, timeout: float | None = None, max_retries: int = 0
    ) -> GenerationResult:
        """Generate for one request without blocking the event loop; concurrent calls are batched.

        Cancelling the awaiting task aborts the request inside the backend.

        Args:
            request: the request.
            timeout: most seconds (None: no limit); a late request is aborted and raises
                ``RequestTimeoutError``.
            max_retries: further attempts after ``QueueFullError`` or a transient engine error.

        Raises:
            InputTypeError: ``request`` is not a GenerationRequest.
            ContextLengthError: the prompt does not fit the context window.
            UnsupportedFeatureError: a field the backend cannot honour (named in ``.field``).
            EngineError: the backend failed.
            RequestTimeoutError: the request took longer than ``timeout``.
        """
        policy = CallPolicy(timeout=timeout, max_retries=max_retries)
        if policy.trivial:
            return await self._agenerate_once(request)
        return await policy.run(lambda: self._agenerate_once(request))

    async def _agenerate_once(self, request: GenerationRequest) -> GenerationResult:
        prepared = await self._aprepare(request)
        job = self._new_job(prepared)
        self._submit([job], from_coroutine=True)
        try:
            return await self._acollect(job)
        finally:
            job.cancel()

    async def astream(self, request: GenerationRequest, *, timeout: float | None = None) -> AsyncIterator[StreamDelta]:
        """Stream one request's text as it is generated, without blocking the event loop.

        The last delta carries ``finish_reason`` and ``usage``. Closing the iterator early (or
        cancelling the consuming task) aborts the request inside the backend; use
        ``contextlib.aclosing`` to close it promptly when breaking out of the loop.

        Args:
            request: the request.
            timeout: most seconds for the whole reply; then the request is aborted and
                ``RequestTimeoutError`` raised (streams are not retried: text was already sent).

        Raises:
            The same errors as :meth:`agenerate`.
        """
        deadline = _deadline(timeout)
        prepared = await self._aprepare(request)
        job = self._new_job(prepared)
        self._submit([job], from_coroutine=True)
        try:
            while True:
                if deadline is None:
                    event = await job.anext_event()
                else:
                    try:
                        event = await asyncio.wait_for(job.anext_event(), max(0.0, deadline - _now()))
                    except asyncio.TimeoutError:
                        raise _timed_out(timeout) from None
                delta = _to_delta(event)
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            job.cancel()

    def stream(self, request: GenerationRequest, *, timeout: float | None = None) -> Iterator[StreamDelta]:
        """Sync :meth:`astream`: works on any thread, needs no event loop. Closing the iterator
        early aborts the request.

        Args:
            request: the request.
            timeout: most seconds for the whole reply (see :meth:`astream`).

        Raises:
            The same errors as :meth:`generate`.
        """
        deadline = _deadline(timeout)
        prepared = self._prepare(request)
        job = self._new_job(prepared)
        self._submit([job])
        return self._iterate(job, deadline, timeout)

    @staticmethod
    def _iterate(job: Job, deadline: float | None, timeout: float | None) -> Iterator[StreamDelta]:
        try:
            while True:
                remaining = None if deadline is None else deadline - _now()
                try:
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError
                    event = job.next_event(remaining)
                except TimeoutError:
                    raise _timed_out(timeout) from None
                delta = _to_delta(event)
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            job.cancel()

    def reset_prefix_cache(self) -> bool:
        """Forget the backend's cached prompt prefixes (vLLM); False when it keeps none."""
        return self.load()._backend_or_raise().reset_prefix_cache()

    def stats(self) -> EngineStats:
        """A snapshot of the request and token counters."""
        with self._stats_lock:
            return EngineStats(
                requests=self._requests,
                completed=self._completed,
                aborted=self._aborted,
                failed=self._failed,
                in_flight=self._in_flight,
                prompt_tokens=self._prompt_tokens,
                completion_tokens=self._completion_tokens,
            )

    def close(self) -> None:
        """Fail pending requests with ``ClosedError``, stop the backend, release the model.
        Safe to call twice."""
        with self._load_lock:
            if self._closed:
                return
            self._closed = True
            backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_supported(request: GenerationRequest, backend: Backend) -> None:
    """Refuse a non-default field the backend cannot honour (never ignore it silently)."""
    for name, default in EXTRA_SAMPLING.items():
        if getattr(request, name) != default and name not in backend.sampling_fields:
            raise UnsupportedFeatureError(
                f"'{name}' is not supported by the {backend.name!r} backend (got {describe(getattr(request, name))}); "
                f"leave it at its default ({default!r}) or use a backend that honours it.",
                field=name,
                backend=backend.name,
            )
    kinds = []
    if request.guided is not None:
        kinds.append((next(iter(request.guided)), GUIDED_FIELDS[next(iter(request.guided))]))
    if request.tools and request.tool_choice != "none":
        kinds.append(("json", "tools"))
    for kind, name in kinds:
        if kind not in backend.guided_kinds:
            raise UnsupportedFeatureError(
                f"'{name}' needs guided decoding ({kind}), which the {backend.name!r} backend does not do; "
                f"drop '{name}' or use a backend that honours it.",
                field=name,
                backend=backend.name,
            )


def _to_delta(event: Text | End | Failure) -> StreamDelta:
    """One stream event as a delta: text, or the last delta (finish reason and usage); a failure raises."""
    if isinstance(event, Text):
        return StreamDelta(event.text, tool_calls=event.tool_calls)
    if isinstance(event, End):
        return StreamDelta.closing(event.result)
    raise event.error


def _now() -> float:
    import time

    return time.monotonic()


def _deadline(timeout: float | None) -> float | None:
    policy = CallPolicy(timeout=timeout)
    return None if policy.timeout is None else _now() + policy.timeout


def _timed_out(timeout: float | None) -> RequestTimeoutError:
    return RequestTimeoutError(
        f"the reply took longer than timeout={timeout:g} s and was aborted; raise the timeout or lower max_tokens."
    )


def _size(request: GenerationRequest) -> int:
    if request.prompt is not None:
        return len(request.prompt)
    return sum(len(m["content"]) for m in request.messages or ()) + 512 * len(request.tools)

