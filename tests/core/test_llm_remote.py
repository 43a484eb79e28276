"""The remote LLM backend against live servers on loopback.

``gpuprompt serve`` (its app under uvicorn, sharing the session's transformers engine, so the
in-process answer and the remote one come from the same engine) for the behaviour; a small HTTP
server of the test's own for what only the client side decides (the session header, a 429 with
Retry-After); and, marked ``vllm``, one real vLLM OpenAI server (``python -m
vllm.entrypoints.openai.api_server``), which gets the prompt as token ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest
from support.live import free_port, start_server, wait_until

from gpuprompt.errors import ConfigurationError, EngineError, InvalidInputError, QueueFullError
from gpuprompt.llm import GenerationRequest, LLMEngine
from gpuprompt.wire import api_root, error_from_status, redact

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_SERVER = importlib.util.find_spec("fastapi") is not None and importlib.util.find_spec("uvicorn") is not None

ASK = [{"role": "user", "content": "Name three colors."}]
SMOL_ENDOFTEXT, SMOL_IM_END = 0, 2  # SmolLM2's <|endoftext|> and <|im_end|> (its eos_token_id)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


# ---------------------------------------------------------------------- gpuprompt serve
@pytest.fixture(scope="module")
def gp_server(embedder, tf_engine) -> Iterator[str]:
    """``gpuprompt serve``'s app over the session's transformers engine."""
    if not HAS_SERVER:
        pytest.skip("the server extra (fastapi, uvicorn) is not installed")
    server = start_server(embedder=embedder, llm=tf_engine)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def remote(gp_server: str) -> Iterator[LLMEngine]:
    engine = LLMEngine(backend="remote", base_url=gp_server, max_model_len=2048).load()
    yield engine
    engine.close()


def test_remote_greedy_answer_equals_in_process(remote: LLMEngine, tf_engine: LLMEngine) -> None:
    requests = [GenerationRequest(messages=ASK, max_tokens=16),
                GenerationRequest(prompt="The capital of France is", max_tokens=8)]
    here = tf_engine.generate(requests)
    there = remote.generate(requests)
    for local, far in zip(here, there, strict=True):
        assert far.text == local.text and far.text
        assert far.finish_reason == local.finish_reason
        assert far.usage.prompt_tokens == local.usage.prompt_tokens
        assert far.usage.completion_tokens == local.usage.completion_tokens
    assert remote.backend_name == "remote" and remote.device == "remote"
    assert remote.capabilities["server"] == "gpuprompt"


def test_remote_stream_and_stop(remote: LLMEngine, tf_engine: LLMEngine) -> None:
    request = GenerationRequest(messages=ASK, max_tokens=16)
    deltas = list(remote.stream(request))
    whole = tf_engine.generate([request])[0]
    assert len(deltas) > 2, "the reply came in one piece, not streamed"
    assert "".join(d.text for d in deltas) == whole.text
    assert deltas[-1].finish_reason == whole.finish_reason
    assert deltas[-1].usage is not None and deltas[-1].usage.completion_tokens == whole.usage.completion_tokens
    # A stop string taken from the reply ends it there, and is not part of the text.
    word = whole.text.split()[2]
    stopped = GenerationRequest(messages=ASK, max_tokens=16, stop=[word])
    far, local = remote.generate([stopped])[0], tf_engine.generate([stopped])[0]
    assert far.finish_reason == "stop" and word not in far.text
    assert far.text == local.text


def test_closing_a_remote_stream_aborts_the_server_request(remote: LLMEngine, tf_engine: LLMEngine) -> None:
    before = tf_engine.stats()

    async def main() -> None:
        stream = remote.astream(GenerationRequest(messages=ASK, max_tokens=400))
        async with contextlib.aclosing(stream):
            first = await stream.__anext__()
            assert first.finish_reason is None
            assert tf_engine.stats().in_flight == before.in_flight + 1

    asyncio.run(main())
    assert wait_until(lambda: tf_engine.stats().in_flight == before.in_flight, 30), "the server kept generating"
    after = tf_engine.stats()
    assert after.aborted == before.aborted + 1
    assert after.completion_tokens - before.completion_tokens < 200
    assert remote.stats().aborted >= 1 and remote.stats().in_flight == 0


def test_cancelling_a_remote_task_aborts_it(remote: LLMEngine, tf_engine: LLMEngine) -> None:
    before = tf_engine.stats()

    async def main() -> None:
        task = asyncio.ensure_future(remote.agenerate(GenerationRequest(messages=ASK, max_tokens=400)))
        await asyncio.to_thread(wait_until, lambda: tf_engine.stats().in_flight > before.in_flight, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_until(lambda: tf_engine.stats().in_flight == before.in_flight, 30)
    assert tf_engine.stats().aborted == before.aborted + 1


def test_remote_required_tool_call_is_well_formed(remote: LLMEngine, tf_engine: LLMEngine) -> None:
    request = GenerationRequest(messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_tokens=48)
    far = remote.generate([request])[0]
    assert far.finish_reason == "tool_calls"
    [call] = far.tool_calls
    assert call.name == "get_weather" and set(call.args) == {"city"} and isinstance(call.args["city"], str)
    local = tf_engine.generate([request])[0]
    assert [(c.name, c.args) for c in local.tool_calls] == [(call.name, call.args)]


def test_remote_structured_output(remote: LLMEngine) -> None:
    person = remote.generate([GenerationRequest(messages=[{"role": "user", "content": "Describe a person."}],
                                                response_format=PERSON, max_tokens=48)])[0]
    data = json.loads(person.text)
    assert set(data) == {"name", "age"} and isinstance(data["age"], int)
    choice = remote.generate([GenerationRequest(messages=ASK, guided_choice=["red", "green"], max_tokens=8)])[0]
    assert choice.text in ("red", "green")
    regex = remote.generate([GenerationRequest(messages=ASK, guided_regex=r"[0-9]{3}", max_tokens=8)])[0]
    assert len(regex.text) == 3 and regex.text.isdigit()


def test_remote_bad_request_is_invalid_input_with_the_servers_message(remote: LLMEngine) -> None:
    # Token id 10**6 is outside SmolLM2's vocabulary: the server refuses it with 400.
    with pytest.raises(InvalidInputError, match="400") as info:
        remote.generate([GenerationRequest(messages=ASK, logit_bias={10**6: 5.0}, max_tokens=4)])
    assert "logit_bias" in str(info.value)


def test_remote_context_length_is_checked_locally(remote: LLMEngine, tf_engine: LLMEngine) -> None:
    long = GenerationRequest(prompt="word " * 3000, max_tokens=4)
    with pytest.raises(InvalidInputError) as far:
        remote.generate([long])
    with pytest.raises(InvalidInputError) as local:
        tf_engine.generate([long])
    assert type(far.value) is type(local.value) and str(far.value) == str(local.value)
    assert remote.count_tokens(ASK) == tf_engine.count_tokens(ASK)


# ---------------------------------------------------------------------- a server of the test's own
class _Recorder(BaseHTTPRequestHandler):
    """An OpenAI-shaped server: lists one model, streams "hello world", or answers ``status``."""

    seen: ClassVar[list[dict[str, Any]]] = []
    status: ClassVar[int] = 200
    server_: ClassVar[Any] = None
    model_id: ClassVar[str] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    cut_short: ClassVar[bool] = False

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        cards = {"object": "list", "data": [{"id": self.model_id, "object": "model", "owned_by": "test"}]}
        self._reply(200, json.dumps(cards).encode(), {"Content-Type": "application/json"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"headers": dict(self.headers), "body": body})
        if self.status != 200:
            error = {"error": {"message": "too busy", "type": "rate_limit_error", "code": "queue_full"}}
            self._reply(self.status, json.dumps(error).encode(), {"Retry-After": self.retry_after,
                                                                  "Content-Type": "application/json"})
            return
        events = [{"choices": [{"index": 0, "text": piece, "finish_reason": None}]} for piece in ("hello", " world")]
        if self.cut_short:  # a proxy that closed the stream cleanly when its backend died
            stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
            self._reply(200, stream.encode(), {"Content-Type": "text/event-stream"})
            return
        events.append({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
        events.append({"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 2}})
        stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._reply(200, stream.encode(), {"Content-Type": "text/event-stream"})


@pytest.fixture()
def recorder() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Recorder", (_Recorder,), {"seen": [], "status": 200, "cut_short": False, "retry_after": "7"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.server_ = server
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    server.shutdown()
    server.server_close()


def test_session_id_travels_in_the_session_header(recorder) -> None:
    url, handler = recorder
    with LLMEngine(backend="remote", base_url=url, session_header="X-Conversation") as engine:
        result = engine.generate([GenerationRequest(messages=ASK, max_tokens=4, session_id="user-42 turn")])[0]
        engine.generate([GenerationRequest(messages=ASK, max_tokens=4)])
    assert result.text == "hello world" and result.finish_reason == "stop"
    assert result.usage.completion_tokens == 2
    first, second = handler.seen
    assert first["headers"]["X-Conversation"] == "user-42 turn"
    assert "X-Conversation" not in second["headers"]
    # The prompt went as the locally rendered token ids, with the sampling fields.
    prompt = first["body"]["prompt"]
    assert all(isinstance(t, int) for t in prompt) and len(prompt) == result.usage.prompt_tokens == engine.count_tokens(ASK)
    assert first["body"]["max_tokens"] == 4 and first["body"]["stream"] is True


def test_a_429_becomes_queue_full_with_retry_after(recorder) -> None:
    url, handler = recorder
    handler.status = 429
    with LLMEngine(backend="remote", base_url=url) as engine:
        with pytest.raises(QueueFullError, match="too busy") as info:
            engine.generate([GenerationRequest(messages=ASK, max_tokens=4)])
        assert info.value.retry_after == 7.0
        # The engine's CallPolicy retries back-pressure when asked to: 1 + 2 attempts, each after
        # the server's Retry-After.
        handler.retry_after = "0.5"
        started = time.monotonic()
        with pytest.raises(QueueFullError):
            engine.generate([GenerationRequest(messages=ASK, max_tokens=4)], max_retries=2)
        assert time.monotonic() - started >= 1.0
    assert len(handler.seen) == 4


def test_server_gone_is_an_engine_error_without_a_hang(recorder) -> None:
    url, handler = recorder
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(EngineError, match="could not reach"):
        LLMEngine(backend="remote", base_url=f"http://127.0.0.1:{port}").load()
    handler.status = 503
    with LLMEngine(backend="remote", base_url=url) as engine:
        with pytest.raises(EngineError, match="503"):
            engine.generate([GenerationRequest(messages=ASK, max_tokens=4)])
        handler.server_.shutdown()  # the server goes away after the engine started
        handler.server_.server_close()
        with pytest.raises(EngineError, match="ConnectError"):
            engine.generate([GenerationRequest(messages=ASK, max_tokens=4)])
    assert time.monotonic() - started < 20


def test_a_server_of_another_model_is_refused_at_load(recorder) -> None:
    url, handler = recorder
    handler.model_id = "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(ConfigurationError, match="Llama-3.1-8B-Instruct"):
        LLMEngine(backend="remote", base_url=url).load()


def test_a_stream_cut_short_is_an_error_not_a_short_answer(recorder) -> None:
    url, handler = recorder
    handler.cut_short = True
    with LLMEngine(backend="remote", base_url=url) as engine, pytest.raises(EngineError, match="before it finished"):
        engine.generate([GenerationRequest(messages=ASK, max_tokens=4)])


def test_error_mapping_by_status() -> None:
    body = {"error": {"message": "bad thing", "type": "invalid_request_error"}}
    assert isinstance(error_from_status(400, body), InvalidInputError)
    assert "bad thing" in str(error_from_status(400, json.dumps(body)))
    assert isinstance(error_from_status(401, body), EngineError)  # the server's configuration, not the request's
    assert type(error_from_status(500, "oops")) is EngineError
    assert type(error_from_status(502, b"")) is EngineError
    assert error_from_status(429, body, {"retry-after": "3"}).retry_after == 3.0
    assert api_root("http://h:1") == "http://h:1/v1" and api_root("http://h:1/v1/") == "http://h:1/v1"
    assert redact("http://user:tok@h:1/v1") == "http://h:1/v1"
    assert "tok" not in str(error_from_status(500, "oops", None, "http://user:tok@h:1/v1"))


def test_remote_config_and_session_id_validation(monkeypatch) -> None:
    from gpuprompt.llm import LLMConfig

    monkeypatch.delenv("GPUPROMPT_LLM_URL", raising=False)
    with pytest.raises(ConfigurationError, match="base_url"):
        LLMConfig(backend="remote")
    with pytest.raises(ConfigurationError, match="backend='remote'"):
        LLMConfig(backend="transformers", base_url="http://127.0.0.1:1")
    with pytest.raises(ConfigurationError, match="http"):
        LLMConfig(backend="remote", base_url="127.0.0.1:8000")
    with pytest.raises(ConfigurationError, match="session_header"):
        LLMConfig(backend="remote", base_url="http://h", session_header="X Bad")
    monkeypatch.setenv("GPUPROMPT_LLM_URL", "http://fleet:8000/v1/")
    monkeypatch.setenv("GPUPROMPT_API_KEY", "sekret")
    config = LLMConfig(backend="remote")
    assert config.base_url == "http://fleet:8000/v1" and config.api_key == "sekret"
    assert "sekret" not in repr(config)
    assert LLMConfig().backend == "auto" and LLMConfig().base_url is None  # auto never means remote
    for bad in ("", "a\nb", " lead", "x" * 257, "caf\u00e9", 5):
        with pytest.raises(InvalidInputError, match="session_id"):
            GenerationRequest(prompt="hi", session_id=bad)
    assert GenerationRequest(prompt="hi", session_id="s-1 a").session_id == "s-1 a"


# ---------------------------------------------------------------------- a real vLLM server
@pytest.fixture(scope="module")
def vllm_server(vllm_pair) -> str:
    """A vLLM OpenAI server for the bundled SmolLM2: one of the session's pair that is alive."""
    alive = [server for server in vllm_pair if server.alive() and server.answers()]
    if not alive:
        pytest.fail("neither vLLM server of the session is alive")
    return alive[0].url


@pytest.fixture(scope="module")
def vllm_remote(vllm_server: str) -> Iterator[LLMEngine]:
    engine = LLMEngine(backend="remote", base_url=vllm_server, max_model_len=2048).load()
    yield engine
    engine.close()


def _running(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))


@pytest.mark.vllm
def test_vllm_server_gets_token_ids_and_answers_as_its_own_chat_route(vllm_remote: LLMEngine,
                                                                       vllm_server: str) -> None:
    assert vllm_remote.capabilities["server"] == "vllm" and vllm_remote._backend.token_id_prompts
    result = vllm_remote.generate([GenerationRequest(messages=ASK, max_tokens=16, priority=-1, seed=3)])[0]
    own = httpx.post(f"{vllm_server}/v1/chat/completions", timeout=120,
                     json={"messages": ASK, "max_tokens": 16, "temperature": 0}).json()
    assert result.text == own["choices"][0]["message"]["content"]
    assert result.usage.prompt_tokens == own["usage"]["prompt_tokens"]
    assert result.usage.completion_tokens == own["usage"]["completion_tokens"]
    deltas = list(vllm_remote.stream(GenerationRequest(messages=ASK, max_tokens=16)))
    assert "".join(d.text for d in deltas) == result.text and len(deltas) > 2
    # A prompt longer than a KV block (128 tokens on CPU), sent twice: the server's prefix cache
    # serves the second, and says so.
    long = [{"role": "system", "content": "You answer briefly and politely. " * 40}, *ASK]
    vllm_remote.generate([GenerationRequest(messages=long, max_tokens=2)])
    again = vllm_remote.generate([GenerationRequest(messages=long, max_tokens=2)])[0]
    assert again.usage.cached_tokens >= 128
    stopped = vllm_remote.generate([GenerationRequest(messages=ASK, max_tokens=16, stop=[result.text.split()[2]])])[0]
    assert stopped.finish_reason == "stop" and result.text.startswith(stopped.text)
    # vLLM's end-of-reply fields travel as its own fields: the same reply as its own chat route gives.
    short = [{"role": "user", "content": "Say just the word yes."}]
    replies = []
    for fields in ({"ignore_eos": True}, {"min_tokens": 10}, {"ignore_eos": True, "stop_token_ids": [198]},
                   {"stop": ["."], "include_stop_str_in_output": True},
                   {"ignore_eos": True, "skip_special_tokens": False}):
        ours = vllm_remote.generate([GenerationRequest(messages=short, max_tokens=16, **fields)])[0]
        own = httpx.post(f"{vllm_server}/v1/chat/completions", timeout=120,
                         json={"messages": short, "max_tokens": 16, "temperature": 0, **fields}).json()
        assert (ours.text, ours.stop_reason, ours.usage.completion_tokens) == (own["choices"][0]["message"]["content"],
                own["choices"][0]["stop_reason"], own["usage"]["completion_tokens"]), fields
        replies.append(ours)
    assert replies[0].usage.completion_tokens == 16 and replies[1].usage.completion_tokens >= 10


@pytest.mark.vllm
def test_vllm_server_tool_call_and_structured_output(vllm_remote: LLMEngine) -> None:
    request = GenerationRequest(messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_tokens=48)
    [call] = vllm_remote.generate([request])[0].tool_calls
    assert call.name == "get_weather" and set(call.args) == {"city"}
    person = vllm_remote.generate([GenerationRequest(messages=[{"role": "user", "content": "Describe a person."}],
                                                     response_format=PERSON, max_tokens=48)])[0]
    assert set(json.loads(person.text)) == {"name", "age"}
    choice = vllm_remote.generate([GenerationRequest(messages=ASK, guided_choice=["red", "green"])])[0]
    assert choice.text in ("red", "green")


@pytest.mark.vllm
def test_vllm_server_request_is_aborted_when_the_stream_closes(vllm_remote: LLMEngine, vllm_server: str) -> None:
    # The end-of-text and end-of-turn tokens are barred, so the reply runs to max_tokens (tens of
    # seconds here) whatever the model would say: "Name three colors." alone ends in about a second,
    # sometimes before vLLM's gauges, refreshed by its stats loop, ever show it running.
    no_end = {SMOL_ENDOFTEXT: -100.0, SMOL_IM_END: -100.0}
    stream = vllm_remote.stream(GenerationRequest(messages=ASK, max_tokens=1500, logit_bias=no_end))
    assert next(stream).finish_reason is None
    assert wait_until(lambda: _running(vllm_server) >= 1, 10), "vLLM never reported the request running"
    stream.close()
    assert wait_until(lambda: _running(vllm_server) == 0, 20), "vLLM kept the request after the stream closed"
