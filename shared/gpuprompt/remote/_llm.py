"""RemoteLLM: the part of :class:`~gpuprompt.LLMEngine`'s interface the adapters use, served by a
running ``gpuprompt serve`` (``POST /v1/chat/completions`` for messages, ``/v1/completions`` for a
raw prompt). The same core request, result and stream types; no torch, no tokenizer, no model.

Every call is streamed from the server and, for ``generate``, aggregated here (one code path), so
a cancelled call closes its stream and the server aborts the generation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    ContextLengthError,
    EngineError,
    GPUPromptError,
    InputTypeError,
    RequestTimeoutError,
    describe,
)
from gpuprompt.llm._policy import CallPolicy
from gpuprompt.llm._tools import ToolCall, ToolCallDelta
from gpuprompt.llm._types import EngineStats, GenerationRequest, GenerationResult, StreamDelta, Timings, Usage
from gpuprompt.remote._client import SERVICE, RemoteClient, client_for
from gpuprompt.remote._config import RemoteConfig
from gpuprompt.remote._embedder import _health, _model_ids, _served_model
from gpuprompt.wire import (
    DETOKENIZE,
    HEALTH,
    MODELS,
    SESSION_HEADER,
    TOKENIZE,
    redact,
    request_body,
    wire_stop_reason,
)

__all__ = ["SESSION_HEADER", "RemoteLLM", "request_body"]

DEFAULT_CONTEXT_WINDOW = 2048
"""What :attr:`RemoteLLM.context_window` reports when neither the server nor the caller says."""


class _Reader:
    """Turns the server's stream chunks into core :class:`StreamDelta` s (the last one carries
    ``finish_reason`` and ``usage``), and collects them into a :class:`GenerationResult`."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first_event: float | None = None
        self.first_token: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None
        self.id: str | None = None
        self.text: list[str] = []
        self.calls: dict[int, list[Any]] = {}

    def feed(self, event: Mapping[str, Any]) -> list[StreamDelta]:
        now = time.monotonic()
        if self.first_event is None:
            self.first_event = now
        if self.model is None and isinstance(event.get("model"), str):
            self.model = event["model"]
        if self.id is None and isinstance(event.get("id"), str):
            self.id = event["id"]
        deltas = []
        for choice in event.get("choices") or ():
            piece = choice.get("delta")
            if isinstance(piece, Mapping):  # a chat chunk
                text = piece.get("content") or ""
                calls = tuple(_call_delta(call) for call in piece.get("tool_calls") or ())
            else:  # a text-completion chunk
                text, calls = choice.get("text") or "", ()
            if not isinstance(text, str):
                raise TypeError(f"a chunk's text is a {type(text).__name__}")
            if text or calls:
                if self.first_token is None:
                    self.first_token = now
                self.text.append(text)
                for call in calls:
                    self.calls.setdefault(call.index, [None, None, []])
                    slot = self.calls[call.index]
                    slot[0] = slot[0] or call.id
                    slot[1] = slot[1] or call.name
                    slot[2].append(call.arguments)
                deltas.append(StreamDelta(text, tool_calls=calls))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
                self.stop_reason = wire_stop_reason(choice.get("stop_reason"))
        usage = event.get("usage")
        if isinstance(usage, Mapping):
            details = usage.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, Mapping) else 0
            prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
            self.usage = Usage(prompt_tokens=prompt, completion_tokens=completion,
                               total_tokens=int(usage.get("total_tokens") or prompt + completion),
                               cached_tokens=int(cached or 0))
        return deltas

    def last(self, where: str) -> StreamDelta:
        if self.finish_reason is None:
            raise EngineError(f"{SERVICE} at {where} ended the stream without a finish_reason: the reply may be cut "
                              "short; retry it.")
        return StreamDelta("", finish_reason=self.finish_reason, usage=self.usage or Usage(0, 0, 0),
                           stop_reason=self.stop_reason)

    def result(self, model: str, request_id: str | None, root: str) -> GenerationResult:
        end = time.monotonic()
        first = self.first_token or end
        try:
            calls = tuple(_call(slot, cut=self.finish_reason == "length") for _, slot in sorted(self.calls.items()))
        except GPUPromptError as exc:  # the server hands out checked calls; kept for a foreign server
            raise EngineError(f"{SERVICE} at {redact(root)} sent a malformed tool call: {exc}") from exc
        return GenerationResult(
            text="".join(self.text),
            finish_reason=self.finish_reason or "stop",
            usage=self.usage or Usage(0, 0, 0),
            timings=Timings(queued_s=(self.first_event or end) - self.started, ttft_s=first - self.started,
                            total_s=end - self.started),
            model=self.model or model,
            request_id=request_id or self.id or "",
            tool_calls=calls,
            stop_reason=self.stop_reason,
        )


def _call(slot: list[Any], *, cut: bool) -> ToolCall:
    """A streamed call folded whole; under ``finish_reason == "length"`` a call whose arguments are
    not a JSON object is the one the limit cut short (OpenAI's shape): kept as an incomplete call."""
    arguments = "".join(slot[2])
    if cut:
        try:
            whole = isinstance(json.loads(arguments), dict)
        except ValueError:
            whole = False
        if not whole:
            return ToolCall(id=slot[0], name=slot[1], arguments=arguments, incomplete=True)
    return ToolCall(id=slot[0], name=slot[1], arguments=arguments or "{}")


def _call_delta(call: Any) -> ToolCallDelta:
    function = call.get("function") or {}
    arguments = function.get("arguments") or ""
    if not isinstance(arguments, str):
        raise TypeError(f"tool-call arguments are a {type(arguments).__name__}")
    return ToolCallDelta(index=int(call.get("index", 0)), id=call.get("id"), name=function.get("name"),
                         arguments=arguments)


class RemoteLLM:
    """Generation by a running ``gpuprompt serve``, behind the engine interface the adapters use.

    Takes the core's :class:`~gpuprompt.GenerationRequest` (messages with tool calls and results,
    tools and ``tool_choice``, sampling fields, ``response_format`` / ``guided_regex`` /
    ``guided_choice``, stop strings, seed, priority; ``session_id`` travels as ``X-Session-ID``)
    and returns its :class:`~gpuprompt.GenerationResult` / :class:`~gpuprompt.StreamDelta`. The
    server batches the requests of every worker together. Errors are the engine's (a 429 is
    ``QueueFullError`` with ``retry_after``, a dead engine ``EngineDeadError``, a refused field
    ``UnsupportedFeatureError`` naming it, ...). Closing a stream or cancelling a call aborts the
    request on the server. Nothing connects until the first call (or :meth:`load`).

    Example:
        >>> llm = RemoteLLM("http://127.0.0.1:8000")
        >>> request = GenerationRequest(messages=[{"role": "user", "content": "Name a color."}], max_tokens=8)
        >>> [result] = llm.generate([request])
        >>> result.text, result.finish_reason
        ("The color I'm referring to is a", 'length')

    Args:
        base_url: the server (``http://host:port``), or a :class:`RemoteConfig`.
        model: the chat model to ask for (checked against the served ones on load); None for the
            server's.
        api_key: the server's API key (with a URL; a config carries its own).
        context_window: the most :attr:`context_window` reports; None: the served model's once
            loaded (the ``max_model_len`` of its card in ``GET /v1/models``, as gpuprompt and vLLM
            serve it), else 2048. The server enforces its own either way.
        client: a :class:`RemoteClient` to use instead of the process's shared one for the config.
        **options: other :class:`RemoteConfig` fields, with a URL.
    """

    def __init__(
        self,
        base_url: str | RemoteConfig | None = None,
        *,
        model: str | None = None,
        api_key: str | None = None,
        context_window: int | None = None,
        client: RemoteClient | None = None,
        **options: Any,
    ) -> None:
        client = client_for(base_url, api_key, client, options, owner="RemoteLLM")
        if model is not None and (not isinstance(model, str) or not model):
            raise ConfigurationError(f"'model' must be None or a non-empty str (got {describe(model)}).")
        if context_window is not None and (isinstance(context_window, bool) or not isinstance(context_window, int)
                                           or context_window < 16):
            raise ConfigurationError(f"'context_window' must be None or an int >= 16 (got {describe(context_window)}).")
        self.client = client
        self.model = model
        self._context_window = context_window
        self._served_window: int | None = None
        self._served: str | None = None
        self._closed = False
        self._stats_lock = threading.Lock()
        self._counts = {"requests": 0, "completed": 0, "aborted": 0, "failed": 0, "in_flight": 0,
                        "prompt_tokens": 0, "completion_tokens": 0}

    def __repr__(self) -> str:
        return f"<RemoteLLM {redact(self.client.root)!r} model={self._served or self.model!r}>"

    # ------------------------------------------------------------------ properties
    @property
    def model_name(self) -> str:
        """The served chat model's id (asks the server once)."""
        self.load()
        assert self._served is not None
        return self._served

    @property
    def backend_name(self) -> str:
        """``"remote"``."""
        return "remote"

    @property
    def device(self) -> str:
        """``"remote"``: the model runs on the server."""
        return "remote"

    @property
    def loaded(self) -> bool:
        """Whether :meth:`load` has asked the server what it serves (reading this asks nothing)."""
        return self._served is not None

    @property
    def context_window(self) -> int:
        """The served model's context window once loaded (:meth:`load`, or any first call), capped by
        the one given at construction; that one, or 2048, before. Reading it asks the server nothing;
        the server refuses longer prompts itself."""
        known = [w for w in (self._context_window, self._served_window) if w is not None]
        return min(known) if known else DEFAULT_CONTEXT_WINDOW

    @property
    def supports_tools(self) -> bool:
        """True: ``gpuprompt serve`` takes tools (its backend's refusal comes back as a typed error)."""
        return True

    @property
    def supports_structured_output(self) -> bool:
        """True: ``gpuprompt serve`` takes ``response_format`` (as ``supports_tools``)."""
        return True

    @property
    def capabilities(self) -> dict[str, Any]:
        """What this client sends; the server decides what its backend honours."""
        return {"backend": "remote", "server": redact(self.client.root), "tools": True, "structured_output": True,
                "context_window": self.context_window}

    # ------------------------------------------------------------------ loading
    def load(self) -> RemoteLLM:
        """Ask the server which chat model it serves (``GET /v1/models``, ``GET /health``); a
        ``model`` it does not serve raises ``ConfigurationError`` naming the served ones."""
        self._check_open()
        if self._served is None:
            models = self.client.request("GET", MODELS)
            try:
                health = self.client.request("GET", HEALTH)
            except GPUPromptError:  # not a gpuprompt server: the model list must do
                health = {}
            self._choose(_health(health), models)
        return self

    async def aload(self) -> RemoteLLM:
        """Async :meth:`load` (never blocks the caller's loop)."""
        self._check_open()
        if self._served is None:
            models = await self.client.arequest("GET", MODELS)
            try:
                health = await self.client.arequest("GET", HEALTH)
            except GPUPromptError:
                health = {}
            self._choose(_health(health), models)
        return self

    def _choose(self, health: dict[str, Any], models: Any) -> None:
        if "chat_model" in health and health["chat_model"] is None:  # gpuprompt serve --chat-model none
            raise ConfigurationError(
                f"the server at {redact(self.client.root)} serves no chat model (it was started with --chat-model "
                "none: embeddings and rerank only); point base_url at a server that serves chat, or restart this "
                "one with --chat-model NAME (or without the flag for the bundled model)."
            )
        self._served = _served_model(self.model, health.get("chat_model"), _model_ids(models, self.client.root),
                                     "chat", self.client.root)
        self._served_window = _card_length(models, self._served)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this RemoteLLM was closed; create a new one.")

    # ------------------------------------------------------------------ requests
    def _prepare(self, request: Any) -> tuple[str, dict[str, Any], dict[str, str]]:
        if not isinstance(request, GenerationRequest):
            raise InputTypeError(
                f"'request' must be a GenerationRequest (got {describe(request)}); build one with "
                "GenerationRequest(messages=[{'role': 'user', 'content': text}])."
            )
        self._check_open()
        path, body = request_body(request, self._served if self.model is not None else None)
        headers = {SESSION_HEADER: request.session_id} if request.session_id else {}
        return path, body, headers

    def _count(self, **changes: int) -> None:
        with self._stats_lock:
            for name, delta in changes.items():
                self._counts[name] += delta

    def _ended(self, result: GenerationResult | None, error: BaseException | None) -> None:
        if error is not None:
            self._count(in_flight=-1, **({"aborted": 1} if isinstance(error, asyncio.CancelledError | GeneratorExit)
                                         else {"failed": 1}))
            return
        assert result is not None
        self._count(in_flight=-1, completed=1, prompt_tokens=result.usage.prompt_tokens,
                    completion_tokens=result.usage.completion_tokens)

    async def _collect(self, path: str, body: dict[str, Any], headers: dict[str, str], request_id: str | None,
                       ) -> GenerationResult:
        """One request, streamed and aggregated (on the client's loop)."""
        reader = _Reader(time.monotonic())
        self._count(requests=1, in_flight=1)
        try:
            async for event in self.client.events(path, body, headers, read_timeout=self.client.generation_timeout):
                _feed(reader, event, self.client.root)
            reader.last(redact(self.client.root))
            result = reader.result(self._served or self.model or "", request_id, self.client.root)
        except BaseException as exc:
            self._ended(None, exc)
            raise
        self._ended(result, None)
        return result

    def generate(
        self, requests: Sequence[GenerationRequest], *, timeout: float | None = None, max_retries: int = 0
    ) -> list[GenerationResult]:
        """Generate for several requests at once (all in flight together); blocks this thread.

        Every request is checked before any is sent: a bad one fails the call and nothing runs.

        Args:
            requests: a list of :class:`GenerationRequest`.
            timeout: most seconds per request (None: no limit); a late request is aborted on the
                server and raises ``RequestTimeoutError``.
            max_retries: further attempts after ``QueueFullError`` or a transient engine error
                (the engine's :class:`~gpuprompt.llm.CallPolicy`, as in process).

        Returns:
            One :class:`GenerationResult` per request, in order.

        Raises:
            The engine's typed errors, from the server's answer (see :mod:`gpuprompt.remote`).
        """
        policy = CallPolicy(timeout=timeout, max_retries=max_retries)
        if isinstance(requests, GenerationRequest):
            raise InputTypeError(
                "'requests' must be a list of GenerationRequest, got a bare GenerationRequest; wrap it in a "
                "list: generate([request])."
            )
        if not isinstance(requests, Sequence) or isinstance(requests, (str, bytes)):
            raise InputTypeError(f"'requests' must be a list of GenerationRequest (got {describe(requests)}).")
        if not requests:
            return []
        prepared = [self._prepare(request) for request in requests]  # every one checked before any is sent
        self.load()
        return self.client.run(self._generate_all(list(requests), prepared, policy))

    async def _generate_all(self, requests: list[GenerationRequest], prepared: list[tuple[str, dict[str, Any],
                            dict[str, str]]], policy: CallPolicy) -> list[GenerationResult]:
        tasks = [asyncio.ensure_future(policy.run(lambda p=p, r=r: self._collect(*p, r.request_id)))
                 for p, r in zip(prepared, requests, strict=True)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def agenerate(
        self, request: GenerationRequest, *, timeout: float | None = None, max_retries: int = 0
    ) -> GenerationResult:
        """Generate for one request without blocking the caller's loop; cancelling the awaiting
        task aborts the request on the server.

        Args:
            request: the request.
            timeout: most seconds (None: no limit); then the request is aborted and
                ``RequestTimeoutError`` raised.
            max_retries: further attempts after ``QueueFullError`` or a transient engine error.
        """
        policy = CallPolicy(timeout=timeout, max_retries=max_retries)
        path, body, headers = self._prepare(request)
        await self.aload()
        if policy.trivial:
            return await self.client.on_loop(self._collect(path, body, headers, request.request_id))
        return await policy.run(lambda: self.client.on_loop(self._collect(path, body, headers, request.request_id)))

    async def astream(self, request: GenerationRequest, *, timeout: float | None = None) -> AsyncIterator[StreamDelta]:
        """Stream one request's text (and tool-call pieces) as the server generates it.

        The last delta carries ``finish_reason`` and ``usage``. Closing the iterator early (or
        cancelling the consuming task) aborts the request on the server.

        Args:
            request: the request.
            timeout: most seconds for the whole reply; then the request is aborted and
                ``RequestTimeoutError`` raised (streams are not retried).
        """
        deadline = _deadline(timeout)
        path, body, headers = self._prepare(request)
        await self.aload()
        reader = _Reader(time.monotonic())
        self._count(requests=1, in_flight=1)
        error: BaseException | None = None
        events = self.client.astream(path, body, headers, deadline=deadline,
                                    read_timeout=self.client.generation_timeout)
        try:
            async for event in events:
                for delta in _feed(reader, event, self.client.root):
                    yield delta
            yield reader.last(redact(self.client.root))
        except RequestTimeoutError as exc:  # the server's own timeout
            error = exc
            raise
        except TimeoutError:  # the deadline
            error = _timed_out(timeout)
            raise error from None
        except BaseException as exc:
            error = exc
            raise
        finally:
            await events.aclose()
            self._finished(reader, error)

    def stream(self, request: GenerationRequest, *, timeout: float | None = None) -> Iterator[StreamDelta]:
        """Sync :meth:`astream`: works on any thread and needs no event loop. Closing the iterator
        early aborts the request on the server."""
        deadline = _deadline(timeout)
        path, body, headers = self._prepare(request)
        self.load()
        events = self.client.stream(path, body, headers, deadline=deadline,
                                   read_timeout=self.client.generation_timeout)
        return self._iterate(events, timeout)

    def _iterate(self, events: Iterator[dict[str, Any]], timeout: float | None) -> Iterator[StreamDelta]:
        reader = _Reader(time.monotonic())
        self._count(requests=1, in_flight=1)
        error: BaseException | None = None
        try:
            for event in events:
                yield from _feed(reader, event, self.client.root)
            yield reader.last(redact(self.client.root))
        except RequestTimeoutError as exc:  # the server's own timeout
            error = exc
            raise
        except TimeoutError:  # the deadline
            error = _timed_out(timeout)
            raise error from None
        except BaseException as exc:
            error = exc
            raise
        finally:
            events.close()  # type: ignore[attr-defined]
            self._finished(reader, error)

    def _finished(self, reader: _Reader, error: BaseException | None) -> None:
        if error is not None:
            self._ended(None, error)
            return
        if reader.finish_reason is None:  # left before the end: the consumer closed the stream
            self._count(in_flight=-1, aborted=1)
            return
        usage = reader.usage or Usage(0, 0, 0)
        self._count(in_flight=-1, completed=1, prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens)

    # ------------------------------------------------------------------ tokens, stats, close
    def count_tokens(
        self, messages_or_prompt: str | Sequence[Mapping[str, Any]] | GenerationRequest, *, tools: Any = None
    ) -> int:
        """Count a prompt's tokens as the server's engine sees them (chat template and ``tools``
        applied): ``POST /tokenize`` (gpuprompt serve and vLLM serve it), else the usage of a
        one-token request (or, for a prompt past the context window, the count its refusal names).

        Raises:
            InputTypeError: neither a str, a list of message dicts nor a GenerationRequest.
        """
        request = _count_request(messages_or_prompt, tools)
        if _tokenizable(request):
            ids = self._tokenize(request)
            if ids is not None:
                return len(ids)
            # a server without vLLM's /tokenize (OpenAI's API, TGI, llama.cpp): count by a generation
        try:
            [result] = self.generate([request])
        except ContextLengthError as exc:  # past the window: the refusal carries the exact count
            if exc.prompt_tokens > 0:
                return exc.prompt_tokens
            raise
        return result.usage.prompt_tokens

    def tokenize(
        self, messages_or_prompt: str | Sequence[Mapping[str, Any]] | GenerationRequest, *, tools: Any = None
    ) -> list[int]:
        """The served chat model's token ids of a prompt (``POST /tokenize``), as :meth:`count_tokens`
        counts them (a GenerationRequest's with the default tool plan: ``tool_choice="auto"``, no
        guided output).

        Raises:
            InputTypeError: neither a str, a list of message dicts nor a GenerationRequest.
            EngineError: the server has no ``/tokenize`` (gpuprompt serve and vLLM have it).
        """
        ids = self._tokenize(_count_request(messages_or_prompt, tools))
        if ids is None:
            raise EngineError(f"{SERVICE} at {redact(self.client.root)} has no vLLM /tokenize route (gpuprompt serve "
                              "and vLLM have it); count with count_tokens instead.")
        return ids

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of the served chat model's token ids (``POST /detokenize``).

        Raises:
            InputTypeError: ``ids`` is not a list of int.
            InvalidInputError: an id outside the vocabulary (the server's refusal).
        """
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise InputTypeError(f"'tokens' must be a list of token ids (got {describe(ids)}).")
        self.load()
        body: dict[str, Any] = {"tokens": list(ids)}
        if self.model is not None:
            body["model"] = self._served
        answer = self.client.request("POST", DETOKENIZE, body, idempotent=True)
        text = answer.get("prompt") if isinstance(answer, dict) else None
        if not isinstance(text, str):
            raise EngineError(f"{SERVICE} at {redact(self.client.root)} did not answer /detokenize with a prompt.")
        return text

    def _tokenize(self, request: GenerationRequest) -> list[int] | None:
        """The ids of ``request``'s prompt from ``POST /tokenize``, or None where the server has no
        vLLM ``/tokenize`` (it answers 404/405/422/501, or not vLLM's shape, as llama.cpp's)."""
        self.load()
        _, chat = request_body(request, self._served if self.model is not None else None)
        body = {key: chat[key] for key in ("model", "messages", "tools") if key in chat}
        if request.prompt is not None:
            body["prompt"] = request.prompt
        try:
            answer = self.client.request("POST", TOKENIZE, body, idempotent=True)
        except GPUPromptError as exc:
            if getattr(exc, "status", None) in _NO_TOKENIZE:
                return None
            raise
        ids = answer.get("tokens") if isinstance(answer, dict) else None
        if (not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
                or answer.get("count") != len(ids)):
            return None
        return ids

    def stats(self) -> EngineStats:
        """This client's request and token counters (the server's engine keeps its own)."""
        with self._stats_lock:
            return EngineStats(**self._counts)

    def close(self) -> None:
        """Refuse further calls (the shared connection pool stays open for other users)."""
        self._closed = True



def _feed(reader: _Reader, event: Mapping[str, Any], root: str) -> list[StreamDelta]:
    try:
        return reader.feed(event)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EngineError(f"{SERVICE} at {redact(root)} sent a malformed stream: {exc!r}") from exc


def _deadline(timeout: float | None) -> float | None:
    policy = CallPolicy(timeout=timeout)
    return None if policy.timeout is None else time.monotonic() + policy.timeout


def _timed_out(timeout: float | None) -> RequestTimeoutError:
    return RequestTimeoutError(
        f"the reply took longer than timeout={timeout:g} s and was aborted; raise the timeout or lower max_tokens."
    )


def _card_length(models: Any, served: str) -> int | None:
    """The ``max_model_len`` of ``served``'s card in a model list, if it carries a usable one."""
    for card in models.get("data", ()) if isinstance(models, dict) else ():
        if isinstance(card, dict) and card.get("id") == served:
            length = card.get("max_model_len")
            if isinstance(length, int) and not isinstance(length, bool) and length >= 16:
                return length
    return None


def _count_request(messages_or_prompt: Any, tools: Any) -> GenerationRequest:
    """The one-token request whose prompt is ``messages_or_prompt`` (with ``tools``)."""
    if isinstance(messages_or_prompt, GenerationRequest):
        return dataclasses.replace(messages_or_prompt, max_tokens=1, stop=(), priority=0)
    if isinstance(messages_or_prompt, str):
        if tools:
            raise InputTypeError("'tools' need chat messages (got a raw prompt str).")
        return GenerationRequest(prompt=messages_or_prompt, max_tokens=1)
    if isinstance(messages_or_prompt, Sequence):
        return GenerationRequest(messages=messages_or_prompt, tools=tools or (), max_tokens=1)
    raise InputTypeError(
        f"'messages_or_prompt' must be a str or a list of message dicts (got {describe(messages_or_prompt)})."
    )


_NO_TOKENIZE = frozenset({404, 405, 422, 501})
"""Statuses of a server whose ``/tokenize`` is missing or not vLLM's: counting falls back."""


def _tokenizable(request: GenerationRequest) -> bool:
    """Whether ``/tokenize`` reads ``request``'s prompt as the generation routes do: its tool plan
    must be the default one (the route renders tools with ``tool_choice="auto"`` and no guided
    output), else the count comes from a one-token generation."""
    return (request.tool_choice == "auto" and request.parallel_tool_calls and request.response_format is None
            and request.guided_regex is None and request.guided_choice is None)
