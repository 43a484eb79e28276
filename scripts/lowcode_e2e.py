"""Flowise end to end against ``gpuprompt serve`` (``make lowcode-e2e``; scripts/lowcode_e2e.sh installs
Flowise first).

Starts, all on loopback: ``gpuprompt serve`` with an API key; a recording pass-through proxy in front
of it (so the run shows what Flowise really sends); Flowise from its install folder with a fresh
database. Then, through Flowise's 3.x REST API as a user's script would (register, login, an OpenAI
API credential holding the server's key, chatflows, prediction), builds four flows and checks each:

1. chat: *ChatOpenAI Custom* -> *Conversation Chain* (with *Buffer Memory*);
2. RAG with a follow-up: *Plain Text* -> *In-Memory Vector Store* (*OpenAI Embeddings Custom*) ->
   *Conversational Retrieval QA Chain*; the first answer's source document must be the product asked
   about (our embeddings ranked it), and the follow-up must reach the model with the first turn;
3. streaming: the chat flow predicted with ``streaming: true`` (server-sent token events);
4. Tool Agent: *Tool Agent* with the *Calculator* tool and *Buffer Memory*.

Prints one line per step with the elapsed time, what Flowise sent (per route: ``stream``,
``tools``, ``tool_choice``, embedding ``encoding_format`` and input type), and exits 1 on the first
failed check with the logs' tails. Nothing is left running.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

CHAT = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBED = "sentence-transformers/all-MiniLM-L6-v2"
MAX_TOKENS = 48
PRODUCTS = [
    "The Aurora dress is made of red cotton and costs 49 EUR.",
    "The Borealis jeans are slim fit blue denim and cost 79 EUR.",
    "The Cirrus raincoat is a yellow waterproof jacket and costs 120 EUR.",
    "The Dune sandals are brown leather and cost 35 EUR.",
]
STARTED = time.monotonic()


class CheckFailed(Exception):
    """A step's answer was not what the flow must give."""


def say(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:7.1f} s] {message}", flush=True)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(url: str, process: subprocess.Popen, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise CheckFailed(f"{what} exited with status {process.returncode} before answering {url}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise CheckFailed(f"{what} did not answer {url} within {timeout:.0f} s")


@contextlib.contextmanager
def started(command: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> Iterator[subprocess.Popen]:
    """A child process in its own process group, its output in ``log``; SIGTERM then SIGKILL on exit."""
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)


# ---------------------------------------------------------------------------- the recording proxy
class Recorder:
    """A pass-through HTTP proxy (uvicorn, a loopback port, a daemon thread) that keeps a summary of
    each request body it forwards: what Flowise really sends."""

    def __init__(self, upstream: str) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.background import BackgroundTask
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        self.seen: list[dict[str, Any]] = []
        client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(600.0))

        async def forward(request: Request) -> StreamingResponse:
            body = await request.body()
            self.seen.append(summarise(request.url.path, body, request.headers.get("authorization")))
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            upstream_request = client.build_request(request.method, request.url.path, params=request.query_params,
                                                    headers=headers, content=body)
            response = await client.send(upstream_request, stream=True)
            kept = {k: v for k, v in response.headers.items()
                    if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")}
            return StreamingResponse(response.aiter_raw(), status_code=response.status_code, headers=kept,
                                     background=BackgroundTask(response.aclose))

        app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            check(time.monotonic() < deadline, "the recording proxy did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.seen[mark:]


def summarise(path: str, body: bytes, authorization: str | None) -> dict[str, Any]:
    """The request fields the README documents (never the texts themselves)."""
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        data = {}
    seen: dict[str, Any] = {"path": path, "auth": bool(authorization)}
    if path.endswith("/chat/completions"):
        seen |= {"model": data.get("model"), "stream": data.get("stream", False),
                 "stream_options": data.get("stream_options"), "max_tokens": data.get("max_tokens"),
                 "tools": [t.get("function", {}).get("name") for t in data.get("tools") or []],
                 "tool_choice": data.get("tool_choice", "<absent>"),
                 "roles": [m.get("role") for m in data.get("messages", [])],
                 "text": json.dumps(data.get("messages", []))}
    elif path.endswith("/embeddings"):
        items = data.get("input")
        items = items if isinstance(items, list) else [items]
        seen |= {"model": data.get("model"), "encoding_format": data.get("encoding_format", "<absent>"),
                 "input": "text" if all(isinstance(i, str) for i in items) else "token ids", "count": len(items)}
    return seen


def described(requests: list[dict[str, Any]]) -> str:
    parts = []
    for r in requests:
        if r["path"].endswith("/chat/completions"):
            parts.append(f"chat(stream={r['stream']}, tools={r['tools'] or '-'}, tool_choice={r['tool_choice']}, "
                         f"max_tokens={r['max_tokens']}, roles={'/'.join(r['roles'])})")
        elif r["path"].endswith("/embeddings"):
            parts.append(f"embeddings({r['count']} {r['input']}, encoding_format={r['encoding_format']})")
        else:
            parts.append(r["path"])
    return "; ".join(parts) or "nothing"


# ---------------------------------------------------------------------------- Flowise's REST API
class Flowise:
    """A logged-in client of Flowise's 3.x REST API."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=httpx.Timeout(600.0))
        self._nodes: dict[str, dict[str, Any]] = {}

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        check(response.status_code < 300, f"Flowise {method} {path} answered {response.status_code}: "
                                          f"{response.text[:2000]}")
        return response.json() if response.content else None

    def sign_up(self, email: str, password: str) -> None:
        self.call("POST", "/api/v1/account/register",
                  json={"user": {"name": "gpuprompt e2e", "email": email, "credential": password}})
        self.call("POST", "/api/v1/auth/login", json={"email": email, "password": password})
        self.http.headers["x-request-from"] = "internal"  # the UI's header: session-cookie auth on /api/v1

    def credential(self, api_key: str) -> str:
        made = self.call("POST", "/api/v1/credentials", json={
            "name": "gpuprompt", "credentialName": "openAIApi", "plainDataObj": {"openAIApiKey": api_key}})
        return str(made["id"])

    def node(self, name: str, node_id: str, inputs: dict[str, Any], output: str | None = None,
             credential: str | None = None) -> dict[str, Any]:
        """A canvas node as Flowise's UI makes one (its ``initNode``) from the node's definition."""
        if name not in self._nodes:
            self._nodes[name] = self.call("GET", f"/api/v1/nodes/{name}")
        spec = json.loads(json.dumps(self._nodes[name]))
        params_types = {"asyncOptions", "asyncMultiOptions", "options", "multiOptions", "datagrid", "string",
                        "number", "boolean", "password", "json", "code", "date", "file", "folder", "tabs"}
        params, anchors = [], []
        for item in spec.get("inputs", []):
            item = {**item, "id": f"{node_id}-input-{item['name']}-{item['type']}"}
            (params if item["type"] in params_types else anchors).append(item)
        if spec.get("credential"):
            params.insert(0, {**spec["credential"], "id": f"{node_id}-input-credential-credential"})
        values = {p["name"]: p.get("default", "") for p in params if p["type"] != "credential"}
        values |= {a["name"]: "" for a in anchors}
        values |= inputs
        outputs: dict[str, Any] = {}
        if spec.get("outputs"):
            options = [{"id": f"{node_id}-output-{o['name']}-{'|'.join(o['baseClasses'])}", "name": o["name"],
                        "label": o["label"], "type": " | ".join(o["baseClasses"])} for o in spec["outputs"]]
            chosen = output or spec["outputs"][0]["name"]
            output_anchors = [{"name": "output", "label": "Output", "type": "options", "options": options,
                               "default": chosen}]
            outputs = {"output": chosen}
        else:
            output_anchors = [{"id": f"{node_id}-output-{spec['name']}-{'|'.join(spec['baseClasses'])}",
                               "name": spec["name"], "label": spec.get("type", spec["name"]),
                               "type": " | ".join(spec["baseClasses"])}]
        data = {**{k: v for k, v in spec.items() if k not in ("inputs", "outputs", "filePath")}, "id": node_id,
                "inputParams": params, "inputAnchors": anchors, "outputAnchors": output_anchors, "inputs": values,
                "outputs": outputs, "selected": False}
        if credential:
            data["credential"] = credential
            values["FLOWISE_CREDENTIAL_ID"] = credential
        return {"id": node_id, "type": "customNode", "position": {"x": 0, "y": 0}, "data": data, "width": 300,
                "height": 500}

    @staticmethod
    def edge(source: dict[str, Any], target: dict[str, Any], input_name: str) -> dict[str, Any]:
        """Connect ``source``'s (chosen) output to ``target``'s input; the input's value names the source."""
        anchor = source["data"]["outputAnchors"][0]
        if anchor.get("options"):
            chosen = source["data"]["outputs"]["output"]
            source_handle = next(o["id"] for o in anchor["options"] if o["name"] == chosen)
        else:
            source_handle = anchor["id"]
        target_anchor = next(a for a in target["data"]["inputAnchors"] if a["name"] == input_name)
        reference = f"{{{{{source['id']}.data.instance}}}}"
        if target_anchor.get("list"):
            current = target["data"]["inputs"].get(input_name) or []
            target["data"]["inputs"][input_name] = [*current, reference]
        else:
            target["data"]["inputs"][input_name] = reference
        return {"source": source["id"], "sourceHandle": source_handle, "target": target["id"],
                "targetHandle": target_anchor["id"], "type": "buttonedge",
                "id": f"{source['id']}-{source_handle}-{target['id']}-{target_anchor['id']}"}

    def chatflow(self, name: str, nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> str:
        made = self.call("POST", "/api/v1/chatflows", json={
            "name": name, "type": "CHATFLOW", "deployed": False,
            "flowData": json.dumps({"nodes": nodes, "edges": edges, "viewport": {"x": 0, "y": 0, "zoom": 1}})})
        return str(made["id"])

    def predict(self, flow: str, question: str, **extra: Any) -> dict[str, Any]:
        return self.call("POST", f"/api/v1/prediction/{flow}", json={"question": question, **extra})

    def predict_streaming(self, flow: str, question: str) -> tuple[list[str], list[dict[str, Any]]]:
        """The token events' texts and every event of a streamed prediction."""
        tokens, events = [], []
        with self.http.stream("POST", f"/api/v1/prediction/{flow}",
                              json={"question": question, "streaming": True}) as response:
            check(response.status_code == 200, f"streamed prediction answered {response.status_code}")
            check(response.headers.get("content-type", "").startswith("text/event-stream"),
                  f"streamed prediction is not an event stream: {response.headers.get('content-type')}")
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                try:
                    event = json.loads(payload)
                except ValueError:
                    continue
                events.append(event)
                if event.get("event") == "token":
                    tokens.append(event.get("data", ""))
        return tokens, events


# ---------------------------------------------------------------------------- the four flows
def chat_model(flowise: Flowise, node_id: str, server: str, credential: str) -> dict[str, Any]:
    """*ChatOpenAI Custom* as the README sets it: the served model's id, the base path, the credential
    (streaming stays at Flowise's default: on)."""
    return flowise.node("chatOpenAICustom", node_id, {"modelName": CHAT, "temperature": 0, "maxTokens": MAX_TOKENS,
                                                      "basepath": f"{server}/v1"}, credential=credential)


def chat_flow(flowise: Flowise, server: str, credential: str) -> str:
    model = chat_model(flowise, "chatOpenAICustom_0", server, credential)
    memory = flowise.node("bufferMemory", "bufferMemory_0", {})
    chain = flowise.node("conversationChain", "conversationChain_0",
                         {"systemMessagePrompt": "You are a helpful shop assistant."})
    edges = [flowise.edge(model, chain, "model"), flowise.edge(memory, chain, "memory")]
    return flowise.chatflow("e2e chat", [model, memory, chain], edges)


def rag_flow(flowise: Flowise, server: str, credential: str) -> str:
    model = chat_model(flowise, "chatOpenAICustom_0", server, credential)
    embeddings = flowise.node("openAIEmbeddingsCustom", "openAIEmbeddingsCustom_0",
                              {"modelName": EMBED, "basepath": f"{server}/v1"}, credential=credential)
    text = flowise.node("plainText", "plainText_0", {"text": "\n\n".join(PRODUCTS)}, output="document")
    splitter = flowise.node("recursiveCharacterTextSplitter", "recursiveCharacterTextSplitter_0",
                            {"chunkSize": 80, "chunkOverlap": 1})
    store = flowise.node("memoryVectorStore", "memoryVectorStore_0", {"topK": 2}, output="retriever")
    chain = flowise.node("conversationalRetrievalQAChain", "conversationalRetrievalQAChain_0",
                         {"returnSourceDocuments": True})
    edges = [flowise.edge(splitter, text, "textSplitter"), flowise.edge(text, store, "document"),
             flowise.edge(embeddings, store, "embeddings"), flowise.edge(store, chain, "vectorStoreRetriever"),
             flowise.edge(model, chain, "model")]
    return flowise.chatflow("e2e rag", [model, embeddings, text, splitter, store, chain], edges)


def agent_flow(flowise: Flowise, server: str, credential: str) -> str:
    model = chat_model(flowise, "chatOpenAICustom_0", server, credential)
    calculator = flowise.node("calculator", "calculator_0", {})
    memory = flowise.node("bufferMemory", "bufferMemory_0", {})
    agent = flowise.node("toolAgent", "toolAgent_0", {"maxIterations": 3})
    edges = [flowise.edge(calculator, agent, "tools"), flowise.edge(memory, agent, "memory"),
             flowise.edge(model, agent, "model")]
    return flowise.chatflow("e2e tool agent", [model, calculator, memory, agent], edges)


def run_flows(flowise: Flowise, recorder: Recorder, server: str, api_key: str) -> None:
    email = f"e2e-{secrets.token_hex(4)}@example.com"
    flowise.sign_up(email, f"Gp-{secrets.token_hex(8)}-1!")
    credential = flowise.credential(api_key)
    say(f"Flowise: registered {email}, logged in, made an OpenAI API credential")

    # 1. chat
    flow = chat_flow(flowise, server, credential)
    mark = len(recorder.seen)
    started_at = time.monotonic()
    answer = flowise.predict(flow, "Say hello to a customer who wants a dress.")
    sent = recorder.since(mark)
    say(f"1 chat: {time.monotonic() - started_at:.1f} s, answer {answer.get('text', '')[:100]!r}")
    say(f"  Flowise sent: {described(sent)}")
    check(isinstance(answer.get("text"), str) and answer["text"].strip() != "", f"chat: empty answer {answer}")
    check(any(r["path"] == "/v1/chat/completions" and r["auth"] and r["model"] == CHAT for r in sent),
          f"chat: no chat completion with the key and model reached the server: {sent}")

    # 2. RAG with a follow-up
    flow = rag_flow(flowise, server, credential)
    mark = len(recorder.seen)
    started_at = time.monotonic()
    first = flowise.predict(flow, "How much is the Aurora dress?")
    sources = [d.get("pageContent", "") for d in first.get("sourceDocuments") or []]
    say(f"2 RAG: {time.monotonic() - started_at:.1f} s, answer {first.get('text', '')[:100]!r}, "
        f"top source {sources[:1]}")
    check(first.get("text", "").strip() != "", f"RAG: empty answer {first}")
    check(bool(sources) and "Aurora" in sources[0], f"RAG: the Aurora product is not the top source: {sources}")
    started_at = time.monotonic()
    follow = flowise.predict(flow, "What is it made of?", chatId=first["chatId"])
    sent = recorder.since(mark)
    say(f"  follow-up: {time.monotonic() - started_at:.1f} s, answer {follow.get('text', '')[:100]!r}")
    say(f"  Flowise sent: {described(sent)}")
    check(follow.get("text", "").strip() != "", f"RAG follow-up: empty answer {follow}")
    embeds = [r for r in sent if r["path"] == "/v1/embeddings"]
    check(bool(embeds) and all(r["input"] == "text" for r in embeds),
          f"RAG: the embeddings requests were not text: {embeds}")
    last_chats = [r for r in sent if r["path"] == "/v1/chat/completions"]
    check(any("How much is the Aurora dress?" in r["text"] and "What is it made of?" in r["text"]
              for r in last_chats), "RAG follow-up: no model call carried the first question with the follow-up")

    # 3. streaming (the chat flow again, streamed to the caller)
    flow = chat_flow(flowise, server, credential)
    started_at = time.monotonic()
    tokens, events = flowise.predict_streaming(flow, "Name three colours of dresses.")
    kinds = sorted({e.get("event", "?") for e in events})
    say(f"3 streaming: {time.monotonic() - started_at:.1f} s, {len(tokens)} token events, events {kinds}, "
        f"text {''.join(tokens)[:100]!r}")
    check(len(tokens) > 1 and "".join(tokens).strip() != "", f"streaming: {len(tokens)} token events")
    check("end" in kinds, f"streaming: no end event ({kinds})")

    # 4. Tool Agent
    flow = agent_flow(flowise, server, credential)
    mark = len(recorder.seen)
    started_at = time.monotonic()
    answer = flowise.predict(flow, "What is 12 times 7?")
    sent = recorder.since(mark)
    used = [t.get("tool") for t in answer.get("usedTools") or []]
    say(f"4 Tool Agent: {time.monotonic() - started_at:.1f} s, answer {answer.get('text', '')[:100]!r}, "
        f"tools used {used}")
    say(f"  Flowise sent: {described(sent)}")
    chats = [r for r in sent if r["path"] == "/v1/chat/completions"]
    check(bool(chats) and all("calculator" in r["tools"] for r in chats),
          f"Tool Agent: the calculator tool was not sent with every call: {chats}")
    check(answer.get("text", "").strip() != "", f"Tool Agent: empty answer {answer}")

    chats = [r for r in recorder.seen if r["path"] == "/v1/chat/completions"]
    embeds = [r for r in recorder.seen if r["path"] == "/v1/embeddings"]
    say(f"in all, Flowise sent {len(chats)} chat calls (streamed: {sum(bool(r['stream']) for r in chats)}, with "
        f"tools: {sum(bool(r['tools']) for r in chats)}, with tool_choice: "
        f"{sum(r['tool_choice'] != '<absent>' for r in chats)}) and {len(embeds)} embeddings calls (text input: "
        f"{sum(r['input'] == 'text' for r in embeds)}, encoding_format: "
        f"{sorted({str(r['encoding_format']) for r in embeds})}), all with the key: "
        f"{all(r['auth'] for r in recorder.seen)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flowise-dir", type=Path, required=True, help="the folder Flowise is installed in")
    parser.add_argument("--llm-backend", default=os.environ.get("GPUPROMPT_LLM_BACKEND", "auto"))
    parser.add_argument("--work-dir", type=Path,
                        help="where the logs and Flowise's database go (default: a temp folder)")
    parser.add_argument("--without-tokenizer-fix", action="store_true",
                        help="start Flowise without examples/flowise_offline_tiktoken.cjs (offline, every streamed "
                             "call then stalls on LangChain.js's tokenizer download)")
    args = parser.parse_args(argv)
    flowise_bin = args.flowise_dir / "node_modules" / "flowise" / "bin" / "run"
    if not flowise_bin.is_file():
        print(f"lowcode-e2e: no Flowise at {flowise_bin}: run scripts/lowcode_e2e.sh (it installs it)", file=sys.stderr)
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpuprompt-lowcode-"))
    for sub in ("db", "secrets", "logs", "blobs"):
        (work / "flowise" / sub).mkdir(parents=True, exist_ok=True)
    api_key = secrets.token_urlsafe(16)
    server_port, flowise_port = free_port(), free_port()
    server_url = f"http://127.0.0.1:{server_port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    flowise_env = {**os.environ, "PORT": str(flowise_port), "HOST": "127.0.0.1",
                   "DATABASE_PATH": str(work / "flowise" / "db"), "SECRETKEY_PATH": str(work / "flowise" / "secrets"),
                   "LOG_PATH": str(work / "flowise" / "logs"), "BLOB_STORAGE_PATH": str(work / "flowise" / "blobs"),
                   "DISABLE_FLOWISE_TELEMETRY": "true",
                   # 3.1.4 denies loopback and private base paths unless the check is off; keep the cloud
                   # metadata range denied.
                   "HTTP_SECURITY_CHECK": "false", "HTTP_DENY_LIST": "169.254.0.0/16"}
    if not args.without_tokenizer_fix:
        preload = Path(__file__).resolve().parent.parent / "examples" / "flowise_offline_tiktoken.cjs"
        flowise_env["NODE_OPTIONS"] = f"{os.environ.get('NODE_OPTIONS', '')} --require {preload}".strip()
    version = json.loads((args.flowise_dir / "node_modules" / "flowise" / "package.json").read_text())["version"]
    fix = "off" if args.without_tokenizer_fix else "on"
    say(f"work folder {work}; backend {args.llm_backend}; tokenizer fix {fix}")
    server_cmd = [str(Path(sys.executable).with_name("gpuprompt")), "serve", "--host", "127.0.0.1",
                  "--port", str(server_port), "--api-key", api_key, "--llm-backend", args.llm_backend,
                  "--max-model-len", "2048", "--log-level", "warning"]
    try:
        with started(server_cmd, env, work / "server.log") as server, \
                started(["node", str(flowise_bin), "start"], flowise_env, work / "flowise.log",
                        cwd=args.flowise_dir) as flowise_process:
            wait_for(f"{server_url}/health", server, "gpuprompt serve", 600)
            say(f"gpuprompt serve up at {server_url} ({httpx.get(f'{server_url}/health').json()})")
            wait_for(f"http://127.0.0.1:{flowise_port}/api/v1/ping", flowise_process, "Flowise", 600)
            say(f"Flowise {version} up at http://127.0.0.1:{flowise_port}")
            recorder = Recorder(server_url)
            recorder.start()
            try:
                say(f"recording proxy at {recorder.url} -> {server_url}")
                run_flows(Flowise(f"http://127.0.0.1:{flowise_port}"), recorder, recorder.url, api_key)
            finally:
                recorder.stop()
    except (CheckFailed, httpx.HTTPError) as failure:
        say(f"FAILED: {failure}")
        for name in ("server.log", "flowise.log"):
            text = (work / name).read_text(errors="replace") if (work / name).exists() else ""
            print(f"--- last lines of {work / name}:\n{text[-3000:]}", flush=True)
        return 1
    say("PASSED: chat, RAG with a follow-up, streaming and Tool Agent through Flowise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
