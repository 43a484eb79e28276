"""Core errors through HTTP: a full engine queue is 429 with Retry-After, a closed engine is 503, and a
client that goes away cancels its generation inside the engine."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from server_helpers import LiveServer, metric_samples, start_server, wait_until

STORY = [{"role": "user", "content": "Tell me a long story about a red dress and a wedding."}]


@pytest.fixture(scope="module")
def tiny_engine():
    """A private engine that computes one request at a time and queues at most one more."""
    from gpuprompt import LLMEngine

    engine = LLMEngine(backend="transformers", device="cpu", max_num_seqs=1, max_queue=1).load()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tiny(embedder, tiny_engine) -> Iterator[LiveServer]:
    server = start_server(embedder=embedder, llm=tiny_engine, retry_after_s=2)
    yield server
    server.stop()


def test_full_engine_queue_is_429_and_the_queued_request_still_completes(tiny, tiny_engine) -> None:
    slow = {"messages": STORY, "max_tokens": 200, "temperature": 0, "stream": True}
    queued_result: dict[str, httpx.Response] = {}

    def queued() -> None:
        with tiny.client() as client:
            queued_result["response"] = client.post(
                "/v1/chat/completions", json={"messages": STORY, "max_tokens": 3, "temperature": 0}
            )

    with tiny.client() as http:
        with http.stream("POST", "/v1/chat/completions", json=slow) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")  # running: the engine's only seat is taken
            waiter = threading.Thread(target=queued)
            waiter.start()
            assert wait_until(lambda: tiny_engine.stats().in_flight == 2)  # one running, one queued
            refused = http.post("/v1/chat/completions", json={"messages": STORY, "max_tokens": 3})
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "2"
            error = refused.json()["error"]
            assert error["code"] == "queue_full"
            assert "retry later" in error["message"]
        # Leaving the stream aborts the running request, so the queued one runs.
        waiter.join(60)
    assert not waiter.is_alive()
    assert queued_result["response"].status_code == 200
    assert wait_until(lambda: tiny_engine.stats().in_flight == 0)
    assert tiny_engine.stats().aborted >= 1


def test_leaving_before_the_first_token_drops_the_queued_request(tiny, tiny_engine) -> None:
    slow = {"messages": STORY, "max_tokens": 200, "temperature": 0, "stream": True}
    before = tiny_engine.stats()
    with tiny.client() as http, http.stream("POST", "/v1/chat/completions", json=slow) as running:
        lines = running.iter_lines()
        assert next(lines).startswith("data: ")
        # A second stream waits in the engine queue: its first token comes only after the running
        # one ends (its headers and opening chunk after 1 s), so the client gives up first.
        with tiny.client(timeout=httpx.Timeout(30.0, read=1.0)) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                with impatient.stream("POST", "/v1/chat/completions", json=slow) as queued:
                    queued.read()
        assert wait_until(lambda: tiny_engine.stats().aborted == before.aborted + 1)
        assert tiny_engine.stats().in_flight == 1  # only the running stream is left
        assert tiny_engine.stats().completion_tokens == before.completion_tokens  # the queued one never ran
    assert wait_until(lambda: tiny_engine.stats().in_flight == 0)


def test_stream_disconnect_aborts_the_engine_request(live, server_llm) -> None:
    before = server_llm.stats().aborted
    body = {"messages": STORY, "max_tokens": 200, "temperature": 0, "stream": True}
    with live.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as stream:
        for line in stream.iter_lines():
            if '"delta":{"content"' in line:
                break  # generated text is flowing: now hang up
    assert wait_until(lambda: server_llm.stats().aborted == before + 1)
    assert wait_until(lambda: server_llm.stats().in_flight == 0)


def test_non_streaming_disconnect_aborts_the_engine_request(live, server_llm) -> None:
    before = server_llm.stats().aborted
    body = {"messages": STORY, "max_tokens": 200, "temperature": 0}
    with live.client(timeout=httpx.Timeout(30.0, read=1.0)) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=body)
    assert wait_until(lambda: server_llm.stats().aborted == before + 1)
    assert wait_until(lambda: server_llm.stats().in_flight == 0)


def test_closed_engine_is_503(tiny, tiny_engine) -> None:
    tiny_engine.close()
    with tiny.client() as http:
        response = http.post("/v1/chat/completions", json={"messages": STORY, "max_tokens": 2})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "unavailable"
    assert "closed" in error["message"]


def test_an_embedding_client_that_goes_away_takes_its_texts_out_of_the_queue(server_llm) -> None:
    """The openai SDK retries a request it timed out on: the abandoned one must not keep the
    embedder busy (its queued texts are cancelled, never computed)."""
    from gpuprompt import Embedder
    from gpuprompt._corpus import prose_paragraphs

    embedder = Embedder(device="cpu", batch_size=4, cache_size=0).load()  # small batches: a long queue
    server = start_server(embedder=embedder, llm=server_llm)
    try:
        texts = [f"{i}: {p}" for i, p in enumerate(prose_paragraphs()[:256])]
        with server.client(timeout=httpx.Timeout(30.0, read=0.3)) as http:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/embeddings", json={"input": texts})
        assert wait_until(lambda: embedder.stats().batcher.cancelled > 0)
        assert wait_until(lambda: embedder.stats().batcher.queue_depth == 0)
        assert embedder.stats().batcher.items < len(texts)
        with server.client() as http:  # the server goes on serving
            assert http.post("/v1/embeddings", json={"input": "still here"}).status_code == 200
    finally:
        server.stop()
        embedder.close()


def test_a_rerank_client_that_goes_away_takes_its_pairs_out_of_the_queue(embedder, server_llm,
                                                                          cross_encoder_path: str) -> None:
    from gpuprompt import Reranker
    from gpuprompt._corpus import prose_paragraphs

    reranker = Reranker(cross_encoder_path, device="cpu", batch_size=2, cache_size=0).load()
    server = start_server(embedder=embedder, llm=server_llm, reranker=reranker)
    try:
        # 1,000 pairs two at a time take seconds: far longer than the 0.3 s the client waits, even when
        # the server is slow to notice the disconnect on a busy machine (200 pairs were not always).
        documents = [f"{i}: {p}" for i, p in enumerate(prose_paragraphs()[:250] * 4)]
        with server.client(timeout=httpx.Timeout(30.0, read=0.3)) as http:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/rerank", json={"query": "How is an assignment evaluated?", "documents": documents})
        # The server ends the abandoned request (its 499) wherever the disconnect meets it: while the
        # pairs are tokenized on a worker thread (then none is ever queued; a busy machine) or while
        # they wait in the queue (then the queued ones are cancelled). Either way the queue drains
        # without scoring them all.
        with server.client() as http:
            assert wait_until(lambda: metric_samples(http)[("gpuprompt_http_in_flight", ())] == 0)
        stats = reranker.stats()
        assert stats.batcher.queue_depth == 0 and stats.scored < len(documents), stats
        with server.client() as http:
            reply = http.post("/v1/rerank", json={"query": "q", "documents": ["still here"]})
            assert reply.status_code == 200, reply.text
    finally:
        server.stop()
        reranker.close()


def test_a_session_append_whose_client_goes_away_stores_nothing(server_llm) -> None:
    """A remote append that timed out (the client raised, and will retry) must not be stored
    later: its turns' embedding is cancelled, so the retry does not store every turn twice."""
    from gpuprompt import Embedder
    from gpuprompt._corpus import prose_paragraphs

    embedder = Embedder(device="cpu", batch_size=1, cache_size=0).load()  # one text per batch: a long queue
    server = start_server(embedder=embedder, llm=server_llm)
    try:
        turns = [{"role": "user", "text": f"{i}: {p}"} for i, p in enumerate(prose_paragraphs()[:256])]
        with server.client(timeout=httpx.Timeout(30.0, read=0.3)) as http:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/sessions/abandoned/turns", json={"turns": turns})
        assert wait_until(lambda: embedder.stats().batcher.cancelled > 0)
        assert wait_until(lambda: embedder.stats().batcher.queue_depth == 0)
        with server.client() as http:
            assert http.get("/v1/sessions/abandoned/turns").json()["data"] == []
            stored = http.post("/v1/sessions/abandoned/turns", json={"turns": turns[:2]})  # the retry, shorter
            assert stored.status_code == 200, stored.text
            assert [t["text"] for t in http.get("/v1/sessions/abandoned/turns").json()["data"]] == [
                turns[0]["text"], turns[1]["text"]]
    finally:
        server.stop()
        embedder.close()
