"""GET /health and GET /metrics (Prometheus text format fed by the core's stats)."""

from __future__ import annotations

from server_helpers import metric_samples as _samples


def test_health_reports_what_is_served(http, server_llm, embedder) -> None:
    body = http.get("/health").json()
    assert body["status"] == "ok"
    assert body["chat_model"] == server_llm.model_name
    assert body["embedding_model"] == embedder.model_id
    assert body["llm_backend"] == "transformers"
    assert body["device"] == "cpu"
    assert body["uptime_s"] >= 0


def test_metrics_follow_traffic(http, embedder) -> None:
    before = _samples(http)
    texts = [f"metrics probe text {i}" for i in range(3)]
    assert http.post("/v1/embeddings", json={"input": texts}).status_code == 200
    assert http.post("/v1/embeddings", json={"input": texts}).status_code == 200  # cache hits now
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
    assert http.post("/v1/chat/completions", json=chat).status_code == 200
    assert http.post("/v1/chat/completions", json={"messages": []}).status_code == 400
    after = _samples(http)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    route = {"method": "POST", "route": "/v1/embeddings", "status": "200"}
    assert delta("gpuprompt_http_requests_total", **route) == 2
    assert delta("gpuprompt_http_requests_total", method="POST", route="/v1/chat/completions", status="400") == 1
    assert delta("gpuprompt_http_request_duration_seconds_count", route="/v1/embeddings") == 2
    assert delta("gpuprompt_embedder_texts_total") == 6
    assert delta("gpuprompt_embedder_cache_hits_total") >= 3
    stats = embedder.stats()
    assert after[("gpuprompt_embedder_cache_hit_ratio", ())] == stats.cache_hits / (stats.cache_hits + stats.cache_misses)
    assert after[("gpuprompt_embedder_batch_size_max", ())] >= 1
    assert ("gpuprompt_embedder_queue_depth", ()) in after
    assert ("gpuprompt_embedder_queue_wait_seconds", (("quantile", "0.95"),)) in after
    assert delta("gpuprompt_llm_requests_total") == 1
    assert delta("gpuprompt_llm_completion_tokens_total") >= 1
    assert delta("gpuprompt_llm_time_to_first_token_seconds_count", endpoint="chat") == 1
    assert delta("gpuprompt_embedding_request_texts_sum") == 6
    assert ("gpuprompt_llm_in_flight", ()) in after
    assert ("gpuprompt_context_sessions", ()) in after
