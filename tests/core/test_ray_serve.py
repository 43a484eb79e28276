"""Ray Serve smoke test: build_app deployed on a local cluster (loopback), concurrent questions answered."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.live import free_port

pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

from gpuprompt.apps.bulk import index_bulk
from gpuprompt.apps.bulk._ray import ensure_ray
from gpuprompt.apps.ray import DEFAULT_MAX_ONGOING_REQUESTS, build_app
from gpuprompt.errors import ConfigurationError

pytestmark = pytest.mark.ray

DOCS = [
    ("aurora", "Aurora dress: red, 100% cotton, shrinks 3% at 40 C, 49 EUR."),
    ("boreal", "Boreal jeans: navy denim, do not tumble dry, 79 EUR."),
    ("cirrus", "Cirrus scarf: grey wool, hand wash only, 25 EUR."),
]
LLM = {"backend": "transformers", "device": "cpu", "max_num_seqs": 4, "dtype": "float32"}


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster (2 CPUs, node address on loopback) for the session; reused if already up."""
    import ray

    started = ensure_ray(ray, None, num_cpus=2, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()



def test_build_app_checks_options_before_any_replica_starts() -> None:
    refused = [
        ({"max_ongoing_requests": 0}, "max_ongoing_requests"),
        ({"llm": {"backend": "transformers", "bogus": 1}}, "unknown 'llm' option"),
        ({"llm": "router:8000/v1"}, "base_url"),  # a remote fleet's URL, checked as RemoteLLM checks it
        ({"llm": "http://router:8000/v1", "llm_api_key": "two words"}, "api_key"),
        ({"llm": "http://router:8000/v1", "llm_model": ""}, "llm_model"),
    ]
    for options, said in refused:
        with pytest.raises(ConfigurationError, match=said):
            build_app(**options)
    app = build_app(llm=LLM)
    deployment = app._bound_deployment  # what serve.run deploys
    assert deployment._deployment_config.max_ongoing_requests == DEFAULT_MAX_ONGOING_REQUESTS == 256


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory, embedder) -> Path:
    """A small snapshot built by index_bulk: one chunk per product."""
    folder = tmp_path_factory.mktemp("kb")
    corpus = folder / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS))
    index_bulk(corpus, folder / "kb", id_field="id", embedder=embedder, progress=False)
    return folder / "kb"


@pytest.fixture(scope="module")
def serve_url(ray_cluster):
    """Serve's HTTP proxy on a free loopback port for this module; shut down after it."""
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()


def ask_all(url: str, questions: list[str]) -> list[httpx.Response]:
    with httpx.Client(timeout=300) as client, ThreadPoolExecutor(len(questions)) as pool:
        return list(pool.map(lambda q: client.post(url, json={"question": q}), questions))


def check_replies(replies: list[httpx.Response]) -> None:
    for reply in replies:
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert isinstance(body["answer"], str) and 0 < body["usage"]["completion_tokens"] <= 4
        assert len(body["sources"]) == 2 and body["sources"][0]["id"].endswith("#0")
    assert len({r.json()["session_id"] for r in replies}) == len(replies)  # no session given: one each


def test_serve_answers_concurrent_questions(serve_url: str, kb: Path) -> None:
    from ray import serve

    app = build_app(index_path=kb, llm=LLM, embedder={"device": "cpu"}, k=2, max_tokens=4)
    serve.run(app, name="rag", route_prefix="/rag")
    try:
        url = f"{serve_url}/rag"
        replies = ask_all(url, ["Will the red dress shrink?", "Can I tumble dry the jeans?",
                                "How do I wash the scarf?", "How much is the dress?"])
        check_replies(replies)
        assert replies[0].json()["sources"][0]["id"] == "aurora#0"
        assert replies[2].json()["sources"][0]["id"] == "cirrus#0"
        with httpx.Client(timeout=60) as client:
            bad = client.post(url, json={"question": "", "k": 2})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "question"
            extra = client.post(url, json={"question": "hi", "colour": "red"})
            assert extra.status_code == 400 and "colour" in extra.json()["error"]["message"]
            assert client.get(url).status_code == 405
    finally:
        serve.delete("rag")


def test_serve_with_a_remote_openai_compatible_llm(serve_url: str, kb: Path, embedder, tf_engine) -> None:
    """The replicas load no LLM: generation goes to an OpenAI-compatible server (here `gpuprompt serve`'s
    app over the session's transformers engine, on loopback)."""
    import threading
    import time

    import uvicorn
    from ray import serve

    from gpuprompt.server import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(embedder=embedder, llm=tf_engine), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        before = tf_engine.stats().completed
        app = build_app(index_path=kb, llm=f"http://127.0.0.1:{port}/v1", embedder={"device": "cpu"}, k=2,
                        max_tokens=4, name="rag-remote")
        serve.run(app, name="rag-remote", route_prefix="/rag-remote")
        try:
            replies = ask_all(f"{serve_url}/rag-remote", ["Will the red dress shrink?", "How do I wash the scarf?"])
            check_replies(replies)
            assert tf_engine.stats().completed - before == 2  # generated by the remote server
        finally:
            serve.delete("rag-remote")
    finally:
        server.should_exit = True
        thread.join(30)
