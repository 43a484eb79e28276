"""Collections over HTTP: upsert, filtered query, RAG chat with per-session memory, delete."""

from __future__ import annotations

import numpy as np

PRODUCTS = [
    ("P1", "Aurora dress: red, 100% cotton, shrinks 3% after a 40 C wash, 49 EUR.", {"type": "dress", "price": 49}),
    ("P2", "Breeze jeans: navy denim, 98% cotton, 2% elastane, 60 EUR.", {"type": "jeans", "price": 60}),
    ("P3", "Cedar sweater: grey wool, hand wash cold, 120 EUR.", {"type": "sweater", "price": 120}),
    ("P4", "Dune dress: red linen, dry clean only, 180 EUR.", {"type": "dress", "price": 180}),
]


def _add(http, name: str) -> dict:
    response = http.post(
        f"/v1/collections/{name}/documents",
        json={"ids": [p[0] for p in PRODUCTS], "documents": [p[1] for p in PRODUCTS], "metadatas": [p[2] for p in PRODUCTS]},
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_upsert_then_query_returns_the_nearest_records(http, embedder) -> None:
    body = _add(http, "shop-query")
    assert body["ids"] == ["P1", "P2", "P3", "P4"]
    assert body["count"] == 4
    assert body["usage"]["prompt_tokens"] == sum(embedder.count_tokens([p[1] for p in PRODUCTS]))
    response = http.post("/v1/collections/shop-query/query", json={"query": "a warm wool jumper", "k": 2})
    assert response.status_code == 200
    hits = response.json()["hits"]
    assert len(hits) == 2
    assert hits[0]["id"] == "P3"
    assert hits[0]["document"] == PRODUCTS[2][1]
    assert hits[0]["metadata"] == PRODUCTS[2][2]
    query = embedder.embed(["a warm wool jumper"])[0]
    expected = float(embedder.embed([PRODUCTS[2][1]])[0] @ query)
    assert abs(hits[0]["score"] - expected) < 1e-4
    assert hits[0]["score"] >= hits[1]["score"]


def test_filter_is_applied_before_ranking(http) -> None:
    _add(http, "shop-filter")
    response = http.post(
        "/v1/collections/shop-filter/query",
        json={"query": "a warm wool jumper", "k": 4, "filter": {"$and": [{"type": "dress"}, {"price": {"$lt": 100}}]}},
    )
    assert response.status_code == 200
    assert [hit["id"] for hit in response.json()["hits"]] == ["P1"]
    bad = http.post("/v1/collections/shop-filter/query", json={"query": "x", "filter": {"price": {"$near": 3}}})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["param"] == "filter"
    assert "$near" in error["message"]


def test_upsert_replaces_by_id_and_delete_removes(http) -> None:
    _add(http, "shop-upsert")
    response = http.post(
        "/v1/collections/shop-upsert/documents",
        json={"ids": ["P1"], "documents": ["Aurora dress: now in blue silk, 59 EUR."], "metadatas": [{"price": 59}]},
    )
    assert response.json()["count"] == 4
    hits = http.post("/v1/collections/shop-upsert/query", json={"query": "blue silk dress", "k": 1}).json()["hits"]
    assert hits[0]["id"] == "P1"
    assert hits[0]["metadata"] == {"price": 59}
    deleted = http.post("/v1/collections/shop-upsert/documents/delete", json={"ids": ["P1", "P9"]}).json()
    assert (deleted["deleted"], deleted["count"]) == (1, 3)
    generated = http.post("/v1/collections/shop-upsert/documents", json={"documents": ["a plain hat"]}).json()
    assert len(generated["ids"][0]) == 32
    listing = {c["name"]: c["count"] for c in http.get("/v1/collections").json()["data"]}
    assert listing["shop-upsert"] == 4
    assert http.delete("/v1/collections/shop-upsert").status_code == 200
    assert http.post("/v1/collections/shop-upsert/query", json={"query": "x"}).status_code == 404


def test_rag_chat_answers_from_the_collection_and_remembers_the_session(http, live) -> None:
    _add(http, "shop-chat")
    first = http.post(
        "/v1/collections/shop-chat/chat",
        json={"session_id": "alice", "question": "I want a red cotton dress. What does it cost?", "k": 2,
              "max_tokens": 24},
    )
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["session_id"] == "alice"
    assert body["history_turns"] == 0
    assert body["answer"].strip()
    assert body["sources"][0]["id"] == "P1"
    assert len(body["sources"]) == 2
    assert body["usage"]["completion_tokens"] <= 24
    assert body["usage"]["prompt_tokens"] > 0
    timings = body["timings"]
    assert set(timings) == {"embed_s", "retrieve_s", "context_s", "generate_s", "total_s"}
    assert timings["total_s"] >= timings["generate_s"] > 0
    second = http.post(
        "/v1/collections/shop-chat/chat",
        json={"session_id": "alice", "question": "Will it shrink after washing?", "max_tokens": 16,
              "filter": {"type": "dress"}},
    ).json()
    assert second["history_turns"] == 2  # alice's first question and its answer
    assert {s["metadata"]["type"] for s in second["sources"]} == {"dress"}
    other = http.post(
        "/v1/collections/shop-chat/chat", json={"session_id": "bob", "question": "Hello?", "max_tokens": 4}
    ).json()
    assert other["history_turns"] == 0  # sessions never leak into each other
    memory = live.state.memory
    assert [t.role for t in memory.turns("shop-chat/alice")] == ["user", "assistant", "user", "assistant"]
    assert http.delete("/v1/collections/shop-chat/sessions/alice").status_code == 200
    assert memory.turns("shop-chat/alice") == []


def test_documents_are_embedded_by_the_shared_embedder(http, live, embedder) -> None:
    _add(http, "shop-vectors")
    [record] = live.state.collections.get("shop-vectors").index.get(["P2"])
    np.testing.assert_allclose(record.vector, embedder.embed([PRODUCTS[1][1]])[0], atol=1e-6)
