"""The generating OpenAI routes: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Handlers translate HTTP bodies into the core's :class:`~gpuprompt.llm.GenerationRequest` (tools,
sampling, constraints) and its results back into OpenAI's shapes, including the streamed chunk
shapes the ``openai`` SDK's stream helpers accumulate: the first tool-call chunk of an index
carries ``id``, ``type`` and ``function.name``; later ones only ``function.arguments`` pieces.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gpuprompt.errors import ContextLengthError, InvalidInputError
from gpuprompt.server._http import SSE_HEADERS, all_or_none, json_response, sse, until_disconnect
from gpuprompt.server.errors import ApiError, context_length_error, error_event
from gpuprompt.server.schemas.chat import (
    ChatChoice,
    ChatChoiceMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatUsage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ToolCallOut,
)
from gpuprompt.server.state import ServerState, State
from gpuprompt.validation import INT64_MIN
from gpuprompt.wire import CHAT_COMPLETIONS, COMPLETIONS, SESSION_HEADER, V1

if TYPE_CHECKING:
    from gpuprompt.llm import GenerationRequest, GenerationResult, StreamDelta, Usage

__all__ = ["router"]

_SEED_SPAN = 2**64  # per-choice seeds (seed + i) wrap around inside the int64 range


def _unsupported(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="unsupported_parameter")


def _refuse_vllm_fields(body: Any, llm: Any) -> None:
    """A 400 naming the first of vLLM's output-changing fields this server does not run, if sent.

    ``chat_template_kwargs`` are not passed to the template either; one the chat template does not
    read changes nothing (as in vLLM), so only a key it reads is refused (``enable_thinking`` is
    accepted for a model whose template has no such switch)."""
    refused = body.refused_vllm_field()
    if refused is not None:
        name, value = refused
        shown = json.dumps(value, ensure_ascii=True)[:80]
        raise _unsupported(name, f"'{name}' is a vLLM sampling field this server does not run (got {shown}); "
                           "leave it out or send its default, or send the request to a vLLM server.")
    check_template_kwargs((body.model_extra or {}).get("chat_template_kwargs"), llm)


def check_template_kwargs(kwargs: Any, llm: Any) -> None:
    """Refuse (400) ``chat_template_kwargs`` holding a key the chat template reads: the template is
    rendered without them, so only keys it ignores are accepted (they change nothing, as in vLLM)."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise ApiError(400, f"'chat_template_kwargs' must be an object (got {type(kwargs).__name__}).",
                       param="chat_template_kwargs", code="invalid_value")
    if not kwargs:
        return
    read = llm.template_variables()
    used = sorted(key for key in kwargs if str(key) in read or "*" in read)
    if used:
        raise _unsupported("chat_template_kwargs", f"'chat_template_kwargs' key {used[0]!r} is read by the served "
                           "model's chat template, and this server renders the template without it; leave it "
                           "out (the template's default applies).")


def _seed(seed: int | None, index: int) -> int | None:
    # Stays an int64 for every choice: (seed + i) wraps around.
    return None if seed is None else (seed + index - INT64_MIN) % _SEED_SPAN + INT64_MIN


def usage_model(usages: list[Usage], prompts: int | None = None) -> ChatUsage:
    """OpenAI's usage of one or more results: prompt tokens counted once per distinct prompt."""
    prompt = sum(u.prompt_tokens for u in usages[: prompts or len(usages)])
    completion = sum(u.completion_tokens for u in usages)
    cached = sum(u.cached_tokens for u in usages[: prompts or len(usages)])
    return ChatUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details={"cached_tokens": cached})




def session_of(request: Request) -> str | None:
    """The conversation a request belongs to (its ``X-Session-ID`` header), or None."""
    value = request.headers.get(SESSION_HEADER)
    if value is None or not value.strip():
        return None
    from gpuprompt.llm._types import affinity_key

    return affinity_key(value.strip())


def chat_request(
    server: ServerState, body: ChatCompletionRequest, request_id: str, index: int = 0, session_id: str | None = None
) -> GenerationRequest:
    """The core request for one choice of a chat completion (refusals raise a 400 naming the field)."""
    from gpuprompt.llm import GenerationRequest

    if body.logprobs:
        raise _unsupported("logprobs", "'logprobs' must be false: this server does not return log-probabilities "
                           "(got true).")
    if body.top_logprobs is not None:
        raise _unsupported("top_logprobs", "'top_logprobs' must be absent: this server does not return "
                           f"log-probabilities (got {body.top_logprobs}).")
    _refuse_vllm_fields(body, server.require_llm())
    if body.functions is not None or body.function_call is not None:
        field = "functions" if body.functions is not None else "function_call"
        raise _unsupported(field, f"'{field}' is OpenAI's deprecated tool interface; send 'tools' and 'tool_choice' "
                           "instead (every current client does).")
    if body.audio is not None or (body.modalities is not None and body.modalities != ["text"]):
        field = "audio" if body.audio is not None else "modalities"
        raise _unsupported(field, f"'{field}' asks for audio output; this server generates text only "
                           "(send modalities ['text'] or leave it out).")
    if body.stream and body.n != 1:
        raise _unsupported("n", f"'n' must be 1 when 'stream' is true (got {body.n}); stream one choice per request.")
    return GenerationRequest(
        messages=[message.core() for message in body.messages],
        max_tokens=body.max_tokens_or(body.max_completion_tokens or body.max_tokens, server.config.default_max_tokens),
        seed=_seed(body.seed, index),
        request_id=f"{request_id}-{index}",
        session_id=session_id,
        **body.sampling_options(),
        **body.core_tools(),
    )


def _chat_message(result: GenerationResult) -> ChatChoiceMessage:
    calls = [ToolCallOut(**call.to_openai()) for call in result.tool_calls]
    # OpenAI sends content null when a reply is only tool calls.
    content = result.text if (result.text or not calls) else None
    return ChatChoiceMessage(content=content, tool_calls=calls or None)


def completion_requests(
    server: ServerState, body: CompletionRequest, request_id: str, session_id: str | None = None
) -> list[GenerationRequest]:
    """One core request per prompt of a text completion (refusals raise a 400 naming the field)."""
    from gpuprompt.llm import GenerationRequest

    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if any(not isinstance(p, str) for p in prompts):
        raise ApiError(
            400,
            "'prompt' must be a str or a list of str (got token ids): token ids of another tokenizer cannot be "
            "read by the served model; send the text (the server tokenizes it with the model's own tokenizer).",
            param="prompt",
            code="invalid_value",
        )
    _refuse_vllm_fields(body, server.require_llm())
    if body.n != 1:
        raise _unsupported("n", f"'n' must be 1 (got {body.n}); for several continuations send the prompt several "
                           "times in a list.")
    if body.best_of not in (None, 1):
        raise _unsupported("best_of", f"'best_of' must be 1 or absent (got {body.best_of}); this server does not "
                           "rank candidates.")
    if body.logprobs is not None:
        raise _unsupported("logprobs", f"'logprobs' must be absent: this server does not return log-probabilities "
                           f"(got {body.logprobs}).")
    if body.suffix:
        raise _unsupported("suffix", "'suffix' must be empty: this server does not fill in the middle.")
    if body.stream and len(prompts) != 1:
        raise _unsupported("prompt", f"'prompt' must be one text when 'stream' is true (got {len(prompts)}); "
                           "stream one prompt per request.")
    options = body.sampling_options()
    return [
        GenerationRequest(
            prompt=prompt,
            max_tokens=body.max_tokens_or(body.max_tokens, server.config.default_max_tokens),
            seed=_seed(body.seed, index),
            request_id=f"{request_id}-{index}",
            session_id=session_id,
            **options,
        )
        for index, prompt in enumerate(prompts)
    ]


def _prompt_field(exc: ContextLengthError) -> ApiError:
    # The field at fault in a text completion is 'prompt', not 'messages'.
    return context_length_error(exc, "prompt")


router = APIRouter()


@router.post(V1 + CHAT_COMPLETIONS, response_model=ChatCompletionResponse, tags=["openai"])
async def chat_completions(server: State, body: ChatCompletionRequest, request: Request) -> Response:
    """Chat completion with tools; ``stream: true`` answers with server-sent events ending in ``[DONE]``.

    A client that disconnects cancels its generation inside the engine.
    """
    llm = server.require_llm()  # 404 naming --chat-model on a server with none
    name = server.check_model(body.model, "chat")
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    session_id = session_of(request)
    requests = [chat_request(server, body, completion_id, i, session_id) for i in range(body.n)]
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        return await _stream(server, request, requests[0], completion_id, include_usage, _chat_chunks)
    outcome = await until_disconnect(request, all_or_none([llm.agenerate(r) for r in requests]))
    if isinstance(outcome, Response):
        return outcome
    results: list[GenerationResult] = list(outcome)
    _observe(server, results, "chat")
    return json_response(
        ChatCompletionResponse(
            id=completion_id,
            created=int(time.time()),
            model=name,
            choices=[ChatChoice(index=i, message=_chat_message(r), finish_reason=r.finish_reason,
                                stop_reason=r.stop_reason) for i, r in enumerate(results)],
            usage=usage_model([r.usage for r in results], prompts=1),
        )
    )

@router.post(V1 + COMPLETIONS, response_model=CompletionResponse, tags=["openai"])
async def completions(server: State, body: CompletionRequest, request: Request) -> Response:
    """Text completion of a raw prompt (no chat template), or of each prompt of a list.

    ``echo`` puts the prompt before the continuation; ``stream: true`` answers with server-sent
    events ending in ``[DONE]`` (one prompt per streamed request).
    """
    llm = server.require_llm()  # 404 naming --chat-model on a server with none
    name = server.check_model(body.model, "chat")
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    requests = completion_requests(server, body, completion_id, session_of(request))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        prefix = requests[0].prompt if body.echo else ""
        try:
            return await _stream(server, request, requests[0], completion_id, include_usage,
                                 _text_chunks(prefix or ""))
        except ContextLengthError as exc:
            raise _prompt_field(exc) from exc
    try:
        outcome = await until_disconnect(request, all_or_none([llm.agenerate(r) for r in requests]))
    except ContextLengthError as exc:
        raise _prompt_field(exc) from exc
    if isinstance(outcome, Response):
        return outcome
    results: list[GenerationResult] = list(outcome)
    _observe(server, results, "completion")
    return json_response(
        CompletionResponse(
            id=completion_id,
            created=int(time.time()),
            model=name,
            choices=[
                CompletionChoice(index=i, text=(req.prompt if body.echo else "") + r.text,
                                 finish_reason=r.finish_reason, stop_reason=r.stop_reason)
                for i, (req, r) in enumerate(zip(requests, results, strict=True))
            ],
            usage=usage_model([r.usage for r in results]),
        )
    )


def _observe(server: ServerState, results: list[GenerationResult], route: str) -> None:
    for result in results:
        server.metrics.ttft.labels(route).observe(result.timings.ttft_s)
        server.metrics.generation_latency.labels(route).observe(result.timings.total_s)


# ---------------------------------------------------------------------- streaming
ChunkMaker = Callable[[dict[str, Any], "StreamDelta", str | None, bool], list[dict[str, Any]]]
"""Builds the ``choices`` entries of the chunks for one engine delta; with ``opening`` true, those
of the opening chunk, given the first delta (which is then sent by a second call)."""


def _chat_chunks(base: dict[str, Any], delta: StreamDelta, finish: str | None, opening: bool) -> list[dict[str, Any]]:
    def choice(payload: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": payload, "finish_reason": finish_reason, "logprobs": None,
                "stop_reason": delta.stop_reason if finish_reason else None}

    if opening:
        # The opening chunk names the role, as OpenAI's does: content "" for a text reply, null for
        # one that begins with tool calls (so a client folding the deltas, like the openai SDK's
        # stream helper, ends with content None for a reply that is only calls, as non-streamed).
        content = None if (delta.tool_calls and not delta.text) else ""
        return [choice({"role": "assistant", "content": content})]
    out = []
    if delta.text:
        out.append(choice({"content": delta.text}))
    if delta.tool_calls:
        calls = []
        for piece in delta.tool_calls:
            call: dict[str, Any] = {"index": piece.index}
            function: dict[str, Any] = {}
            if piece.id is not None:
                call["id"] = piece.id
                call["type"] = "function"
            if piece.name is not None:
                function["name"] = piece.name
            function["arguments"] = piece.arguments
            call["function"] = function
            calls.append(call)
        out.append(choice({"tool_calls": calls}))
    if finish is not None:
        out.append(choice({}, finish))
    return out


def _text_chunks(prefix: str) -> ChunkMaker:
    def make(base: dict[str, Any], delta: StreamDelta, finish: str | None, opening: bool) -> list[dict[str, Any]]:
        def choice(text: str, finish_reason: str | None = None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                    "stop_reason": delta.stop_reason if finish_reason else None}

        if opening:
            return [choice(prefix)] if prefix else []
        out = [choice(delta.text)] if delta.text else []
        if finish is not None:
            out.append(choice("", finish))
        return out

    return make


_HEADERS_AFTER_S = 1.0
"""Most seconds a stream waits for its first delta before it answers 200 and the opening chunk."""


async def _within(task: asyncio.Future[Any], seconds: float) -> Any:
    """``task``'s result if it ends within ``seconds`` (its error raised), else None (left running)."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    return task.result() if done else None


async def _drop(pending: asyncio.Future[Any], stream: Any) -> None:
    """Cancel the first-delta task, then close the engine stream (which aborts the request if it
    still runs). Safe to call again; a cancellation of the caller still propagates."""
    pending.cancel()
    await asyncio.wait({pending})
    if not pending.cancelled():
        pending.exception()  # retrieved: its error was reported (or it ended the stream) elsewhere
    await stream.aclose()


def _opening(request: GenerationRequest) -> StreamDelta:
    """What the opening chunk is built from when it goes before the first delta: a reply that may
    call tools opens with content null (what a reply of calls only must end with; a client folding
    the deltas turns null plus text into the text), any other with ""."""
    from gpuprompt.llm import StreamDelta
    from gpuprompt.llm._tools import ToolCallDelta

    may_call = bool(request.tools) and request.tool_choice != "none"
    return StreamDelta(text="", tool_calls=(ToolCallDelta(index=0),) if may_call else ())


class _EngineStream(StreamingResponse):
    """A streamed reply that always lets go of its engine stream: whether its body ran to the end,
    was closed early, or never started (the client left first), the first-delta task is cancelled
    before the engine stream is closed (closing it while that task runs it would fail, and leave
    the request generating for nobody)."""

    def __init__(self, body: AsyncIterator[str], pending: asyncio.Future[Any], stream: Any) -> None:
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._pending, self._engine_stream = pending, stream

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await _drop(self._pending, self._engine_stream)


async def _stream(
    server: ServerState,
    http_request: Request,
    request: GenerationRequest,
    completion_id: str,
    include_usage: bool,
    chunks: ChunkMaker,
) -> Response:
    """Start the stream and wait for its first delta before answering, for at most
    :data:`_HEADERS_AFTER_S`: a request the engine refuses (too long, unsupported field, queue full,
    ...) is refused at once and still gets its proper HTTP status. A first delta that takes longer
    (a busy engine, or a tool call, which is handed out whole) does not hold the headers back: the
    200 and the opening chunk go first, so clients and proxies see the stream begin."""
    metrics = server.metrics
    chat = chunks is _chat_chunks
    route = "chat_stream" if chat else "completion_stream"
    started = time.perf_counter()
    llm = server.require_llm()
    stream = llm.astream(request)
    pending = asyncio.ensure_future(stream.__anext__())
    try:
        first = await until_disconnect(http_request, _within(pending, _HEADERS_AFTER_S))
    except StopAsyncIteration:  # pragma: no cover - the engine always ends with a final delta
        raise InvalidInputError("the engine produced no output for this request.") from None
    except BaseException:
        await _drop(pending, stream)
        raise
    if isinstance(first, Response):  # the client left before the first token
        await _drop(pending, stream)
        return first
    if first is not None:
        metrics.ttft.labels(route).observe(time.perf_counter() - started)
    base = {
        "id": completion_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": server.served_name("chat"),
    }

    def event(choices: list[dict[str, Any]]) -> str:
        payload = {**base, "choices": choices}
        if include_usage:
            payload["usage"] = None
        return sse(payload)

    async def events() -> AsyncIterator[str]:
        # Closing the engine stream (normal end, error, or the client going away, which cancels
        # this generator) aborts the request inside the engine if it is still running; the first
        # delta's task goes first (see _EngineStream, which also covers a body that never started).
        try:
            try:
                for choice in chunks(base, first if first is not None else _opening(request), None, True):
                    yield event([choice])
                delta = first
                if delta is None:
                    delta = await pending  # cancelled with this generator when the client goes away
                    metrics.ttft.labels(route).observe(time.perf_counter() - started)
                while True:
                    for choice in chunks(base, delta, delta.finish_reason, False):
                        yield event([choice])
                    if delta.finish_reason is not None:
                        if include_usage and delta.usage is not None:
                            usage = usage_model([delta.usage]).model_dump()
                            yield sse({**base, "choices": [], "usage": usage})
                        break
                    delta = await stream.__anext__()
            except Exception as exc:  # noqa: BLE001 - headers are sent: report it in-band, as OpenAI does
                yield sse(error_event(exc, server.config.retry_after_s))
                return
            finally:
                metrics.generation_latency.labels(route).observe(time.perf_counter() - started)
            yield "data: [DONE]\n\n"
        finally:
            await _drop(pending, stream)

    return _EngineStream(events(), pending, stream)

