"""LLMEngine on the bundled SmolLM2-135M-Instruct, both backends (vLLM's CPU build here).

Greedy decoding throughout, so outputs are deterministic; max_tokens stays small.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuprompt.errors import ClosedError, ContextLengthError, EngineError, InputTypeError
from gpuprompt.llm import GenerationRequest, LLMEngine, StreamDelta

QUESTIONS = [
    "Name three colors.",
    "What is the capital of Italy?",
    "Write a haiku about the sea.",
    "Give me one tip for sleeping well.",
]

HANG_GUARD_S = 120.0  # only guards against a hang; no test asserts on speed


def chat(question: str, **kwargs) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": question}], **kwargs)


async def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.05)


_REFERENCE: dict[str, list] = {}


def one_at_a_time(engine: LLMEngine) -> list:
    """Greedy answers to QUESTIONS, each generated alone (computed once per backend)."""
    if engine.backend_name not in _REFERENCE:
        _REFERENCE[engine.backend_name] = [engine.generate([chat(q, max_tokens=12)])[0] for q in QUESTIONS]
    return _REFERENCE[engine.backend_name]


# ---------------------------------------------------------------------- results
def test_batched_results_equal_one_at_a_time(engine: LLMEngine) -> None:
    alone = one_at_a_time(engine)
    batched = engine.generate([chat(q, max_tokens=12) for q in QUESTIONS])
    assert [r.text for r in batched] == [r.text for r in alone]
    assert all(r.text for r in batched)
    # prefix-cache hits depend on what ran before (the default system prompt is shared): not compared
    assert [dataclasses.replace(r.usage, cached_tokens=0) for r in batched] == [
        dataclasses.replace(r.usage, cached_tokens=0) for r in alone]
    assert len({r.request_id for r in batched}) == len(QUESTIONS)
    assert all(r.model == engine.model_name for r in batched)


def test_concurrent_async_and_threaded_callers_get_their_own_answers(engine: LLMEngine) -> None:
    requests = [chat(q, max_tokens=12) for q in QUESTIONS]
    reference = [r.text for r in one_at_a_time(engine)]

    async def together() -> list[str]:
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0.01)

        tick = asyncio.create_task(ticker())
        results = await asyncio.gather(*(engine.agenerate(r) for r in requests))
        done = True
        await tick
        # The loop kept running while the engine worked (nothing blocked it).
        assert ticks >= 3
        return [r.text for r in results]

    assert asyncio.run(together()) == reference
    with ThreadPoolExecutor(len(requests)) as pool:
        threaded = list(pool.map(lambda r: engine.generate([r])[0].text, requests))
    assert threaded == reference


def test_sync_calls_work_on_a_thread_that_runs_an_event_loop(engine: LLMEngine) -> None:
    # As in a notebook: blocking calls made from code that runs inside a live event loop.
    reference = one_at_a_time(engine)[1]
    outcome: list[object] = []

    async def inside_a_loop() -> None:
        [result] = engine.generate([chat(QUESTIONS[1], max_tokens=12)])
        streamed = "".join(d.text for d in engine.stream(chat(QUESTIONS[1], max_tokens=12)))
        outcome.extend([result.text, streamed])

    worker = threading.Thread(target=lambda: asyncio.run(inside_a_loop()), daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)
    assert not worker.is_alive(), "a sync call made on an event-loop thread hung"
    assert outcome == [reference.text, reference.text]


def test_streaming_concatenation_equals_generate(engine: LLMEngine) -> None:
    request = chat(QUESTIONS[2], max_tokens=12)
    result = one_at_a_time(engine)[2]
    deltas = list(engine.stream(request))
    assert all(isinstance(d, StreamDelta) for d in deltas)
    assert "".join(d.text for d in deltas) == result.text
    assert len([d for d in deltas if d.text]) > 1  # really streamed, not one block
    assert [d.finish_reason is not None for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert deltas[-1].finish_reason == result.finish_reason
    assert dataclasses.replace(deltas[-1].usage, cached_tokens=0) == dataclasses.replace(result.usage, cached_tokens=0)

    async def collect() -> list[StreamDelta]:
        return [d async for d in engine.astream(request)]

    assert "".join(d.text for d in asyncio.run(collect())) == result.text


def test_seeded_sampling_repeats_and_differs_from_greedy(engine: LLMEngine) -> None:
    sampled = [chat(QUESTIONS[3], max_tokens=12, temperature=1.5, top_p=0.95, seed=s) for s in (7, 7, 8)]
    first, again, other = (engine.generate([r])[0].text for r in sampled)
    assert first == again  # same seed, same text
    greedy = one_at_a_time(engine)[3].text
    assert len({first, other, greedy}) > 1  # sampling really samples


def test_stop_strings_cut_the_text(engine: LLMEngine) -> None:
    full = one_at_a_time(engine)[0]
    # Stop on a word from the middle of the unconstrained answer.
    words = [w for w in full.text.split() if len(w) > 2]
    stop = words[len(words) // 2]
    cut = full.text[: full.text.index(stop)]
    [stopped] = engine.generate([chat(QUESTIONS[0], max_tokens=12, stop=[stop, "never-appears-xyz"])])
    assert stopped.text == cut
    assert stopped.finish_reason == "stop"
    streamed = "".join(d.text for d in engine.stream(chat(QUESTIONS[0], max_tokens=12, stop=[stop])))
    assert streamed == cut


def test_usage_counts_match_the_tokenizer(engine: LLMEngine) -> None:
    from transformers import AutoTokenizer

    from gpuprompt.models import resolve_chat_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_chat_model(None))
    messages = [{"role": "system", "content": "Answer at length."}, {"role": "user", "content": "Tell me a story."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected_prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    [result] = engine.generate([GenerationRequest(messages=messages, max_tokens=8)])
    assert result.finish_reason == "length"
    assert result.usage.prompt_tokens == expected_prompt == engine.count_tokens(messages)
    assert result.usage.completion_tokens == 8
    assert result.usage.total_tokens == expected_prompt + 8
    # Without an end-of-sequence token inside the budget, the text is exactly those 8 tokens.
    assert len(tokenizer(result.text, add_special_tokens=False)["input_ids"]) == 8
    [raw] = engine.generate([GenerationRequest(prompt="The capital of France is", max_tokens=4)])
    assert raw.usage.prompt_tokens == len(tokenizer("The capital of France is")["input_ids"])
    timings = raw.timings
    assert 0 <= timings.queued_s <= timings.ttft_s <= timings.total_s


# ---------------------------------------------------------------------- cancellation
def test_cancelling_running_requests_frees_their_slots(engine: LLMEngine) -> None:
    async def scenario() -> None:
        before = engine.stats()
        # A short request runs first, so that the four long ones below queue up together and
        # then fill every slot (max_num_seqs=4) at once, whatever the backend's batching policy.
        blocker = engine.astream(chat(QUESTIONS[0], max_tokens=16))
        await anext(blocker)
        streams = [engine.astream(GenerationRequest(prompt=f"Story {i}: once upon a time", max_tokens=1500)) for i in range(4)]
        firsts = await asyncio.wait_for(asyncio.gather(*(anext(s) for s in streams)), HANG_GUARD_S)
        assert all(isinstance(d, StreamDelta) for d in firsts)
        for stream in streams:
            await stream.aclose()
        await blocker.aclose()
        await wait_until(lambda: engine.stats().in_flight == before.in_flight, "the aborted requests left the engine")
        await wait_until(lambda: engine._backend.in_flight() == 0, "the backend dropped them")
        assert engine.stats().aborted == before.aborted + 4
        # A following request gets a slot and completes.
        result = await asyncio.wait_for(engine.agenerate(chat(QUESTIONS[1], max_tokens=8)), HANG_GUARD_S)
        assert result.finish_reason in ("stop", "length") and result.text

    asyncio.run(scenario())


def test_cancelling_an_awaiting_task_aborts_its_request(engine: LLMEngine) -> None:
    async def scenario() -> None:
        before = engine.stats()
        task = asyncio.create_task(engine.agenerate(GenerationRequest(prompt="Count to a thousand:", max_tokens=1500)))
        await wait_until(lambda: engine.stats().in_flight == before.in_flight + 1, "the request was accepted")
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: engine.stats().in_flight == before.in_flight, "the request was aborted")
        assert engine.stats().aborted == before.aborted + 1
        assert engine.stats().completion_tokens - before.completion_tokens < 1500

    asyncio.run(scenario())


def test_closing_a_sync_stream_aborts_it(engine: LLMEngine) -> None:
    before = engine.stats()
    stream = engine.stream(GenerationRequest(prompt="List every prime number:", max_tokens=1500))
    next(stream)
    stream.close()
    deadline = time.monotonic() + HANG_GUARD_S
    while engine.stats().in_flight != before.in_flight:
        assert time.monotonic() < deadline, "the closed stream's request never left the engine"
        time.sleep(0.05)
    assert engine.stats().aborted == before.aborted + 1


def test_a_cancelled_queued_request_never_runs(tf_engine: LLMEngine) -> None:
    async def scenario() -> None:
        batcher = tf_engine._backend._batcher
        before, aborted = batcher.stats().cancelled, tf_engine.stats().aborted
        running = tf_engine.astream(chat(QUESTIONS[2], max_tokens=24))
        await anext(running)  # the worker is busy with it now
        queued = asyncio.create_task(tf_engine.agenerate(chat("Never answered.", max_tokens=24)))
        await wait_until(lambda: batcher.stats().queue_depth == 1, "the second request was queued")
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        async for _ in running:
            pass
        await wait_until(lambda: tf_engine.stats().in_flight == 0, "both requests ended")
        assert batcher.stats().cancelled == before + 1  # dropped from the queue, never batched
        assert tf_engine.stats().aborted == aborted + 1

    asyncio.run(scenario())


# ---------------------------------------------------------------------- priorities
def test_priorities_order_service_under_load(engine: LLMEngine) -> None:
    async def scenario() -> None:
        finished: list[str] = []
        started: dict[str, float] = {}

        async def run(name: str, priority: int) -> None:
            result = await engine.agenerate(GenerationRequest(prompt=f"Count slowly ({name}): 1, 2,", max_tokens=16,
                                                             priority=priority, request_id=name))
            started[name] = result.timings.queued_s
            finished.append(name)

        base = engine.stats().in_flight
        submitted: dict[str, float] = {}
        lows = []
        for i in range(8):
            submitted[f"low{i}"] = time.monotonic()
            lows.append(asyncio.create_task(run(f"low{i}", 10)))
        await wait_until(lambda: engine.stats().in_flight == base + 8, "the low-priority requests were queued")
        submitted["high"] = time.monotonic()
        high = asyncio.create_task(run("high", 0))
        await asyncio.gather(*lows, high)
        start = {name: submitted[name] + started[name] for name in submitted}
        # The engine holds 4 requests at a time: the late high-priority request is served before
        # the low-priority ones still waiting when it arrived.
        assert start["high"] < start["low7"]
        assert finished.index("high") < finished.index("low7")

    asyncio.run(scenario())


# ---------------------------------------------------------------------- context window
def test_too_long_prompt_raises_context_length_error_and_runs_nothing(engine: LLMEngine) -> None:
    before = engine.stats().requests
    long = "The catalogue lists a red linen dress, blue jeans and wool socks. " * 200
    with pytest.raises(ContextLengthError) as info:
        engine.generate([chat(QUESTIONS[0], max_tokens=8), chat(long, max_tokens=8)])
    assert info.value.prompt_tokens > engine.context_window == info.value.max_context == 2048
    assert engine.stats().requests == before  # the good request was not run either


def test_truncate_left_drops_the_oldest_turns(engine: LLMEngine) -> None:
    messages = [{"role": "system", "content": "You are a terse shop assistant."}]
    for i in range(40):
        messages.append({"role": "user", "content": f"Question {i}: " + "what fabrics do the dresses use? " * 4})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "linen, cotton and wool blends. " * 4})
    messages.append({"role": "user", "content": "Which fabric is warmest?"})
    assert engine.count_tokens(messages) > engine.context_window
    [result] = engine.generate([GenerationRequest(messages=messages, max_tokens=16, truncate="left")])
    assert result.finish_reason in ("stop", "length") and result.text
    assert result.usage.prompt_tokens <= engine.context_window - 16
    assert result.usage.prompt_tokens >= engine.count_tokens([messages[0], messages[-1]])


# ---------------------------------------------------------------------- structured output
def test_structured_output_parses_against_its_schema(engine: LLMEngine) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "price": {"type": "number"}, "in_stock": {"type": "boolean"}},
        "required": ["name", "price", "in_stock"],
        "additionalProperties": False,
    }
    assert engine.supports_structured_output
    request = chat("Describe one product of a clothing shop as JSON.", max_tokens=64, response_format=schema)
    [result] = engine.generate([request])
    data = json.loads(result.text)
    assert set(data) == {"name", "price", "in_stock"}
    assert isinstance(data["name"], str) and isinstance(data["price"], (int, float))
    assert isinstance(data["in_stock"], bool)
    # OpenAI's json_object form: the output is constrained to be a JSON object from its first token.
    loose = engine.generate([chat("A product as JSON.", max_tokens=16, response_format={"type": "json_object"})])
    assert loose[0].text.lstrip().startswith("{")


# ---------------------------------------------------------------------- bad input, lifecycle
def test_bad_arguments_are_typed_errors(engine: LLMEngine) -> None:
    before = engine.stats().requests
    with pytest.raises(InputTypeError, match="wrap it in a list"):
        engine.generate(chat("hi"))  # type: ignore[arg-type]
    with pytest.raises(InputTypeError, match=r"'requests\[1\]'"):
        engine.generate([chat("hi"), "hello"])  # type: ignore[list-item]
    with pytest.raises(InputTypeError, match="'request' must be a GenerationRequest"):
        asyncio.run(engine.agenerate({"prompt": "hi"}))  # type: ignore[arg-type]
    with pytest.raises(InputTypeError):
        engine.count_tokens(42)  # type: ignore[arg-type]
    assert engine.generate([]) == []
    assert engine.stats().requests == before


def test_a_failing_batch_fails_its_requests_and_the_next_ones_run(
    tf_engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tf_engine._backend._model
    real = model.generate
    calls = {"n": 0}

    def broken_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", broken_once)
    before = tf_engine.stats()
    with pytest.raises(EngineError, match="injected fault"):
        tf_engine.generate([chat(QUESTIONS[0], max_tokens=8), chat(QUESTIONS[1], max_tokens=8)])
    after = tf_engine.stats()
    assert after.failed == before.failed + 2 and after.in_flight == 0
    [result] = tf_engine.generate([chat(QUESTIONS[1], max_tokens=8)])
    assert result.text and result.finish_reason in ("stop", "length")


def test_auto_falls_back_to_transformers_and_close_fails_pending_work(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import gpuprompt.llm.backends._vllm as vllm_backend

    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)
    engine = LLMEngine(backend="auto", device="cpu", max_num_seqs=2)
    with caplog.at_level(logging.WARNING, logger="gpuprompt.llm._engine"):
        assert engine.backend_name == "transformers"
    assert "uses transformers: vLLM is not installed" in caplog.text

    errors: list[BaseException] = []

    def long_call() -> None:
        try:
            engine.generate([GenerationRequest(prompt="Write a very long essay:", max_tokens=1500)])
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=long_call)
    worker.start()
    deadline = time.monotonic() + HANG_GUARD_S
    while engine.stats().in_flight == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    engine.close()
    worker.join(HANG_GUARD_S)
    assert not worker.is_alive(), "a request pending at close() hung"
    assert len(errors) == 1 and isinstance(errors[0], ClosedError)
    with pytest.raises(ClosedError):
        engine.generate([chat("hi")])
    engine.close()  # twice is fine


@pytest.mark.gpu
def test_transformers_backend_on_cuda_batches_like_single_calls() -> None:
    engine = LLMEngine(backend="transformers", device="cuda", dtype="float32", max_num_seqs=4)
    try:
        requests = [chat(q, max_tokens=16) for q in QUESTIONS]
        batched = engine.generate(requests)
        alone = [engine.generate([r])[0] for r in requests]
        assert [r.text for r in batched] == [r.text for r in alone]
        assert "".join(d.text for d in engine.stream(requests[0])) == batched[0].text
    finally:
        engine.close()
