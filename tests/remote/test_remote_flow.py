"""Remote mode under load and interruption: a busy server's 429 becomes ``QueueFullError`` with its
``retry_after``; closing a stream, cancelling a task or a timeout aborts the request on the server
(its engine counts it aborted); embeddings and session appends ride out a busy server by retrying."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpuprompt.errors import QueueFullError, RequestTimeoutError
from gpuprompt.llm import GenerationRequest
from gpuprompt.remote import RemoteEmbedder, RemoteLLM

LONG = GenerationRequest(messages=[{"role": "user", "content": "Write a long story about a red dress."}],
                         max_tokens=400)


def _aborted(engine) -> int:
    return engine.stats().aborted


def test_busy_server_answers_queue_full_with_retry_after(busy) -> None:
    llm = RemoteLLM(busy.url).load()
    first = llm.stream(LONG)
    next(first)  # the server is now busy with this stream
    try:
        with pytest.raises(QueueFullError) as full:
            llm.generate([GenerationRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=2)])
        assert full.value.retry_after == 2.0
        with pytest.raises(QueueFullError):
            list(llm.stream(LONG))
    finally:
        first.close()


async def test_concurrent_async_calls_get_queue_full(busy) -> None:
    llm = await RemoteLLM(busy.url).aload()
    request = GenerationRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=24)
    outcomes = await asyncio.gather(*(llm.agenerate(request) for _ in range(4)), return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, QueueFullError)]
    assert refused and all(o.retry_after == 2.0 for o in refused)
    assert any(not isinstance(o, BaseException) for o in outcomes)
    # The engine-level policy retries back-pressure, as in process.
    results = await asyncio.gather(*(llm.agenerate(request, max_retries=30) for _ in range(2)))
    assert all(r.usage.completion_tokens > 0 for r in results)


def test_embeddings_retry_through_a_busy_server(busy, embedder) -> None:
    llm = RemoteLLM(busy.url).load()
    remote = RemoteEmbedder(busy.url, max_retries=3, backoff=0.05)
    first = llm.stream(LONG)
    next(first)
    release = threading.Timer(0.5, first.close)  # the slot frees while the embedder backs off (Retry-After 2 s)
    release.start()
    try:
        vectors = remote.embed(["a retried text"])
    finally:
        release.join()
    assert vectors.shape == (1, embedder.dim)


def test_a_session_append_rides_out_a_busy_server(busy) -> None:
    """A 429 is answered before any work, so even a call that is not idempotent (a session append)
    is retried after it, and applied exactly once."""
    from gpuprompt.remote import RemoteContextCache

    llm = RemoteLLM(busy.url).load()
    cache = RemoteContextCache(busy.url, max_retries=3, backoff=0.05)
    cache.clear("busy-append")
    first = llm.stream(LONG)
    next(first)
    release = threading.Timer(0.5, first.close)  # the slot frees while the append backs off (Retry-After 2 s)
    release.start()
    try:
        turn = cache.append("busy-append", "user", "a retried turn")
    finally:
        release.join()
    assert turn.text == "a retried turn"
    assert [t.text for t in cache.turns("busy-append")] == ["a retried turn"]


def test_closing_a_stream_aborts_it_on_the_server(live, remote_llm_engine, poll) -> None:
    before = _aborted(remote_llm_engine)
    stream = RemoteLLM(live.url).stream(LONG)
    next(stream)
    stream.close()
    assert poll(lambda: _aborted(remote_llm_engine) > before, timeout=30)
    assert poll(lambda: remote_llm_engine.stats().in_flight == 0, timeout=30)


async def test_cancelling_async_calls_aborts_them_on_the_server(live, remote_llm_engine, poll) -> None:
    llm = await RemoteLLM(live.url).aload()
    before = _aborted(remote_llm_engine)
    task = asyncio.ensure_future(llm.agenerate(LONG))
    await asyncio.to_thread(poll, lambda: remote_llm_engine.stats().in_flight > 0, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(poll, lambda: _aborted(remote_llm_engine) > before, 30)

    before = _aborted(remote_llm_engine)
    stream = llm.astream(LONG)
    await stream.__anext__()
    await stream.aclose()
    assert await asyncio.to_thread(poll, lambda: _aborted(remote_llm_engine) > before, 30)
    assert llm.stats().aborted == 2 and llm.stats().in_flight == 0


def test_timeouts_abort_on_the_server(live, remote_llm_engine, poll) -> None:
    llm = RemoteLLM(live.url).load()
    before = _aborted(remote_llm_engine)
    with pytest.raises(RequestTimeoutError, match="timeout=0.5"):
        llm.generate([LONG], timeout=0.5)
    assert poll(lambda: _aborted(remote_llm_engine) > before, timeout=30)
    before = _aborted(remote_llm_engine)
    with pytest.raises(RequestTimeoutError):
        list(llm.stream(LONG, timeout=0.5))
    assert poll(lambda: _aborted(remote_llm_engine) > before, timeout=30)
