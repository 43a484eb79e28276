"""`gpuprompt serve` past one process: sessions in Redis (--redis-url), collections in Milvus
(--vector-uri), the chat model on another server (--llm-url), and the X-Session-ID affinity key.

Every server here is real and on loopback: a Redis server (the session fixture), Milvus Lite (a
local file), and a second gpuprompt app standing in for the LLM fleet.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
from server_helpers import LiveServer, start_server

from gpuprompt.errors import ConfigurationError
from gpuprompt.server import ServerConfig, create_app
from gpuprompt.server._collection import milvus_collection, server_name

DOCS = [
    "The Aurora dress is red, made of cotton, and costs 49 euros.",
    "Delivery to Norway takes four days.",
    "Invoices are available for orders above 100 euros.",
]
HAS_MILVUS = importlib.util.find_spec("pymilvus") is not None and importlib.util.find_spec("milvus_lite") is not None


# ---------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"llm_url": "ftp://fleet"}, "llm_url"),
        ({"llm_url": "http://fleet:8000", "llm_backend": "vllm"}, "llm_backend"),
        ({"redis_url": "localhost:6379"}, "redis_url"),
        ({"session_ttl_s": 0}, "session_ttl_s"),
        ({"session_ttl_s": float("nan")}, "session_ttl_s"),
        ({"vector_uri": "  "}, "vector_uri"),
    ],
)
def test_bad_deployment_settings_are_refused_at_construction(options, needle) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        ServerConfig(**options)


def test_llm_url_makes_the_engine_remote_and_keeps_the_servers_own_key_private(monkeypatch) -> None:
    monkeypatch.setenv("GPUPROMPT_API_KEY", "the-servers-own-key")
    options = ServerConfig(llm_url="http://fleet:8000/v1").llm_options()
    assert options["backend"] == "remote" and options["base_url"] == "http://fleet:8000/v1"
    assert options["api_key"] == ""  # "" = send none: the server's own key never goes to the fleet
    monkeypatch.setenv("GPUPROMPT_LLM_API_KEY", "fleet-key")
    assert ServerConfig(llm_url="http://fleet:8000").llm_options()["api_key"] == "fleet-key"
    assert ServerConfig().llm_options() == {"backend": "auto", "device": "auto"}
    assert ServerConfig(llm_url="http://fleet:8000", max_model_len=32768).llm_options()["max_model_len"] == 32768


@pytest.mark.parametrize("name", ["kb", "kb-1.2_x", "9lives", "a_u", "x" * 64])
def test_collection_names_map_to_milvus_names_and_back(name) -> None:
    stored = milvus_collection(name)
    assert stored.replace("_", "").isalnum() and len(stored) <= 255
    assert server_name(stored) == name


def test_foreign_milvus_collections_are_not_taken_for_server_collections() -> None:
    assert server_name("gpuprompt") is None
    assert server_name("langchain_abc") is None
    assert server_name("gpuprompt_c_bad_q") is None  # not an escape this server writes


# ---------------------------------------------------------------------- --redis-url
@pytest.mark.redis
def test_a_session_continues_on_another_replica_through_redis(embedder, server_llm, redis_server) -> None:
    """Replica A answers turns 1-2 and is stopped; replica B answers turn 3 with turns 1-2 in its
    history, without embedding them again."""
    config = ServerConfig(redis_url=redis_server.url, session_ttl_s=600, default_max_tokens=8)
    session = f"s-{id(config)}"
    a = start_server(config=config, embedder=embedder, llm=server_llm)
    try:
        with a.client() as http:
            assert http.post("/v1/collections/shop/documents", json={"documents": DOCS}).status_code == 200
            for question in ("Is the Aurora dress red?", "How long is delivery to Norway?"):
                answer = http.post("/v1/collections/shop/chat", json={"session_id": session, "question": question})
                assert answer.status_code == 200, answer.text
        stored = a.state.memory.session_store.load(f"shop/{session}")
        assert [t.role for t in stored.records] == ["user", "assistant", "user", "assistant"]
    finally:
        a.stop()
    b = start_server(config=config, embedder=embedder, llm=server_llm)
    try:
        with b.client() as http:
            assert http.post("/v1/collections/shop/documents", json={"documents": DOCS}).status_code == 200
            before = embedder.stats().texts
            answer = http.post("/v1/collections/shop/chat", json={"session_id": session, "question": "Invoices?"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["history_turns"] >= 2  # turns 1-2 reached B through Redis
            # B embedded the question (for retrieval, and to rank the history) and its two new turns,
            # never the four stored turns.
            assert embedder.stats().texts - before <= 4
        assert len(b.state.memory.session_store.load(f"shop/{session}").records) == 6
    finally:
        b.stop()
        b.state.memory.clear()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # uvicorn's exit(3)
def test_an_unreachable_redis_fails_the_start_not_the_first_turn(embedder, server_llm) -> None:
    pytest.importorskip("redis")
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = create_app(
        ServerConfig(redis_url=f"redis://127.0.0.1:{port}/0", preload=False), embedder=embedder, llm=server_llm
    )
    with pytest.raises(RuntimeError, match="did not start"):
        LiveServer(app).start()


# ---------------------------------------------------------------------- --vector-uri
@pytest.fixture()
def milvus_uri(tmp_path) -> Iterator[str]:
    if not HAS_MILVUS:
        pytest.skip("the milvus extra (pymilvus, milvus-lite) is not installed")
    yield str(tmp_path / "collections.db")


def test_collections_in_milvus_outlive_the_server(embedder, server_llm, milvus_uri) -> None:
    config = ServerConfig(vector_uri=milvus_uri, preload=False)
    first = start_server(config=config, embedder=embedder, llm=server_llm)
    try:
        with first.client() as http:
            added = http.post(
                "/v1/collections/kb-1/documents",
                json={"documents": DOCS, "ids": ["a", "b", "c"], "metadatas": [{"t": 1}, {"t": 2}, {"t": 3}]},
            )
            assert added.status_code == 200, added.text
            assert http.post("/v1/collections/kb-1/documents/delete", json={"ids": ["c"]}).json()["deleted"] == 1
    finally:
        first.stop()
    second = start_server(config=config, embedder=embedder, llm=server_llm)
    try:
        with second.client() as http:
            listed = {c["name"]: c["count"] for c in http.get("/v1/collections").json()["data"]}
            assert listed == {"kb-1": 2}
            hits = http.post(
                "/v1/collections/kb-1/query", json={"query": "a red cotton dress", "k": 2, "filter": {"t": {"$ne": 2}}}
            ).json()["hits"]
            assert [h["id"] for h in hits] == ["a"]
            assert http.delete("/v1/collections/kb-1").status_code == 200
    finally:
        second.stop()
    third = start_server(config=config, embedder=embedder, llm=server_llm)
    try:
        with third.client() as http:
            assert http.get("/v1/collections").json()["data"] == []  # a deleted collection's data is gone
    finally:
        third.stop()


# ---------------------------------------------------------------------- --llm-url
@pytest.fixture(scope="module")
def fleet(embedder, server_llm) -> Iterator[LiveServer]:
    """A gpuprompt server standing in for the LLM fleet (any OpenAI-compatible server would do)."""
    server = start_server(embedder=embedder, llm=server_llm)
    yield server
    server.stop()


def test_a_front_server_answers_through_the_fleet_like_the_fleet_itself(embedder, fleet) -> None:
    front = start_server(config=ServerConfig(llm_url=fleet.url, api_key="front-key"), embedder=embedder)
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "temperature": 0}
    try:
        assert front.state.llm.config.backend == "remote"
        with fleet.client() as direct, front.client(headers={"Authorization": "Bearer front-key"}) as http:
            expected = direct.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
            reply = http.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "conversation-7"})
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"] == expected
            streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
            assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
    finally:
        front.stop()


def test_replicas_sharing_milvus_see_each_others_collections(embedder, server_llm, milvus_uri) -> None:
    config = ServerConfig(vector_uri=milvus_uri, preload=False)
    a = start_server(config=config, embedder=embedder, llm=server_llm)
    b = start_server(config=config, embedder=embedder, llm=server_llm)
    try:
        with a.client() as at_a, b.client() as at_b:
            added = at_a.post("/v1/collections/shared/documents", json={"documents": DOCS, "ids": ["a", "b", "c"]})
            assert added.status_code == 200, added.text
            # B started before the collection existed: it finds it in Milvus on first use.
            hits = at_b.post("/v1/collections/shared/query", json={"query": "delivery to Norway", "k": 1})
            assert hits.status_code == 200, hits.text
            assert [h["id"] for h in hits.json()["hits"]] == ["b"]
            assert {c["name"] for c in at_b.get("/v1/collections").json()["data"]} == {"shared"}
            assert at_a.delete("/v1/collections/shared").status_code == 200
            # B's handle now points at a dropped collection: listing and metrics still answer.
            assert at_b.get("/v1/collections").status_code == 200
            assert at_b.get("/metrics").status_code == 200
    finally:
        a.stop()
        b.stop()
