"""``gpuprompt serve --chat-model none``: an embeddings (and rerank) server that starts no LLM engine.

Chat, completion and collection chat answer 404 in the OpenAI error shape naming ``--chat-model``;
``/health`` and ``/v1/models`` say what is loaded; remote clients embed and rerank against it and
get a typed error for chat; the command line starts no engine process, imports no LLM backend and
converts no GGUF file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
from support.asgi import InProcessServer
from support.live import free_port, wait_until

from gpuprompt.errors import ConfigurationError

CHAT_ROUTES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ("/v1/completions", {"prompt": "Once upon"}),
    ("/v1/completions", {"prompt": "Once upon", "stream": True}),
]


@pytest.fixture(scope="module")
def server(embedder, reranker) -> InProcessServer:
    """``create_app(chat_model="none")`` with the session's embedder and reranker, started in process."""
    from gpuprompt.server import create_app

    served = InProcessServer(create_app(chat_model="none", embedder=embedder, reranker=reranker)).start()
    yield served
    served.stop()


def _said_chat_model(reply: httpx.Response) -> None:
    assert reply.status_code == 404, reply.text
    error = reply.json()["error"]
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
    assert "--chat-model" in error["message"], error["message"]


def test_the_state_holds_no_engine_and_the_runtime_built_none(server) -> None:
    from gpuprompt import get_runtime

    assert server.state.llm is None
    assert server.state.loaded  # the preload ran (embedder and reranker) and did not need an engine
    assert all(collection.rag is None for collection in server.state.collections._items.values())
    engines = [key[1] for key in get_runtime().loaded() if isinstance(key, tuple) and key[0] == "llm"]
    assert all(config[0] != "none" for config in engines)  # no LLMEngine(model="none") was even built


async def test_health_and_models_say_what_is_loaded(server, embedder, reranker) -> None:
    async with server.client() as client:
        health = (await client.get("/health")).json()
        models = (await client.get("/v1/models")).json()
        missing = await client.get("/v1/models/SmolLM2-135M-Instruct")
    assert health["chat_model"] is None and health["llm_backend"] is None
    assert health["embedding_model"] == embedder.model_id and health["rerank_model"] == reranker.model_id
    assert health["embedder_identity"] == embedder.identity and health["device"] == "cpu"
    assert (health["embed_backend"], health["rerank_backend"]) == ("torch", "torch")
    assert [card["id"] for card in models["data"]] == [embedder.model_id, reranker.model_id]
    assert missing.status_code == 404


@pytest.mark.parametrize(("path", "body"), CHAT_ROUTES)
async def test_chat_and_completion_routes_answer_404_naming_the_flag(server, path, body) -> None:
    async with server.client() as client:
        _said_chat_model(await client.post(path, json=body))


async def test_collections_search_but_their_chat_answers_404(server) -> None:
    async with server.client() as client:
        added = await client.post("/v1/collections/no-chat/documents",
                                  json={"documents": ["a red silk dress", "a blue steel kettle"], "ids": ["d", "k"]})
        assert added.status_code == 200, added.text
        hits = (await client.post("/v1/collections/no-chat/query", json={"query": "kettle", "k": 1})).json()["hits"]
        assert [hit["id"] for hit in hits] == ["k"]
        _said_chat_model(await client.post("/v1/collections/no-chat/chat",
                                           json={"session_id": "s1", "question": "Which dress is red?"}))
        assert (await client.delete("/v1/collections/no-chat")).status_code == 200


async def test_embeddings_rerank_and_metrics_are_served(server, embedder) -> None:
    import numpy as np

    async with server.client() as client:
        embedded = (await client.post("/v1/embeddings", json={"input": ["red dress", "blue kettle"]})).json()
        ranked = (await client.post("/v1/rerank", json={"query": "kettle", "documents": ["dress", "kettle"]})).json()
        metrics = await client.get("/metrics")
    got = np.asarray([item["embedding"] for item in embedded["data"]], dtype=np.float32)
    assert np.allclose(got, embedder.embed(["red dress", "blue kettle"]), atol=1e-5)
    assert sorted(result["index"] for result in ranked["results"]) == [0, 1]
    assert metrics.status_code == 200 and "gpuprompt_llm_in_flight" not in metrics.text  # no engine to ask
    assert "gpuprompt_embed" in metrics.text


def test_remote_clients_embed_and_rerank_and_chat_is_a_typed_error(server, embedder) -> None:
    import numpy as np

    from gpuprompt.llm import GenerationRequest

    runtime = server.connect()
    try:
        vectors = runtime.embedder().embed(["red dress"])
        assert np.allclose(vectors, embedder.embed(["red dress"]), atol=1e-5)
        assert [hit.index for hit in runtime.reranker().rerank("kettle", ["dress", "kettle"])] in ([0, 1], [1, 0])
        with pytest.raises(ConfigurationError, match="--chat-model"):
            runtime.llm().generate([GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4)])
    finally:
        runtime.shutdown()


async def test_the_openai_client_gets_not_found_naming_the_flag(server) -> None:
    import openai

    async with server.client() as http:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", http_client=http, max_retries=0)
        with pytest.raises(openai.NotFoundError, match="--chat-model"):
            await client.chat.completions.create(model="SmolLM2-135M-Instruct",
                                                 messages=[{"role": "user", "content": "hi"}])
        embedded = await client.embeddings.create(model="all-MiniLM-L6-v2", input=["red dress"])
    assert len(embedded.data[0].embedding) == 384


def test_contradicting_options_are_refused(embedder) -> None:
    from gpuprompt.llm import LLMEngine
    from gpuprompt.server import ServerConfig, create_app

    with pytest.raises(ConfigurationError, match="--llm-url"):
        ServerConfig(chat_model="none", llm_url="http://127.0.0.1:9/v1")
    with pytest.raises(ConfigurationError, match="--llm-url"):
        ServerConfig(chat_model="none", llm_backend="remote")
    with pytest.raises(ConfigurationError, match="'llm'"):
        create_app(chat_model="none", llm=LLMEngine(backend="transformers"), embedder=embedder, preload=False)
    assert ServerConfig(chat_model="None").serves_chat is False
    assert ServerConfig(chat_model="./none").serves_chat is True  # a folder named none stays reachable


def test_the_variable_and_the_flag_read_none(monkeypatch) -> None:
    from gpuprompt.apps.cli import build_parser
    from gpuprompt.server._settings import load_settings

    monkeypatch.setenv("GPUPROMPT_CHAT_MODEL", "none")
    assert load_settings().serve_options()["chat_model"] == "none"
    monkeypatch.delenv("GPUPROMPT_CHAT_MODEL")
    args = build_parser().parse_args(["serve", "--chat-model", "none"])
    assert load_settings(chat_model=args.chat_model).serve_options()["chat_model"] == "none"


_IMPORTS = r"""
import asyncio, json, sys
import gpuprompt.models as models

converted = []
original = models.convert_gguf
models.convert_gguf = lambda *a, **k: converted.append(str(a)) or original(*a, **k)
from gpuprompt.server import create_app

app = create_app(chat_model="none", device="cpu")

async def main():
    async with app.router.lifespan_context(app):
        pass

asyncio.run(main())
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "gguf", "llama_cpp")
               or m.startswith("gpuprompt.llm.backends") or m == "gpuprompt.llm._engine")
print(json.dumps({"heavy": heavy, "converted": converted, "embedder": "sentence_transformers" in sys.modules}))
"""


def test_no_llm_backend_is_imported_and_no_gguf_converted() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", _IMPORTS], capture_output=True, text=True, timeout=600,
                          check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"heavy": [], "converted": [], "embedder": True}


def _tree(pid: int) -> list[int]:
    """``pid`` and every descendant, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        line = next(line for line in handle if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_command_starts_no_engine_process_and_stays_small() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    code = "import sys; from gpuprompt.apps.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "GPUPROMPT_CHAT_MODEL": "none"}
    process = subprocess.Popen([sys.executable, "-c", code, "serve", "--port", str(port), "--device", "cpu",
                                "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)

    def up() -> bool:
        if process.poll() is not None:
            return True
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_until(up, 300, interval=0.2) and process.poll() is None, process.stderr.read()[-3000:]
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["chat_model"] is None and health["llm_backend"] is None
        _said_chat_model(httpx.post(f"{url}/v1/chat/completions", timeout=30,
                                    json={"messages": [{"role": "user", "content": "hi"}]}))
        assert httpx.post(f"{url}/v1/embeddings", json={"input": ["red dress"]}, timeout=60).status_code == 200
        tree = _tree(process.pid)
        assert tree == [process.pid]  # no engine core, no worker: one process
        # The bound for an embeddings-only server (the bundled MiniLM on CPU; it was 5.2 GB with
        # the chat engine always loaded).
        assert _rss_bytes(process.pid) < 1.5 * 2**30
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(120) == 0
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)

