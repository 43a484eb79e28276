"""Load test for ``gpuprompt serve``: mixed embeddings, chat (plain and streamed), search and RAG traffic.

``make load`` starts a local server and runs this headless for a bounded time. By hand::

    gpuprompt serve --port 8000 &
    locust -f examples/locustfile.py --headless -u 32 -r 32 -t 60s --host http://127.0.0.1:8000 --only-summary

At the start the test upserts a small synthetic product catalogue into a collection (the RAG and
search tasks read it). At the end it prints one line per request type and a total with p50, p95 and
failures. Any non-200 answer, or a 200 whose body is not what the API promises, counts as a failure.

Environment:
    GPUPROMPT_API_KEY: sent as ``Authorization: Bearer ...`` when set.
    LOAD_MAX_TOKENS: tokens per generated answer (default 16: the test measures serving, not prose).
    LOAD_PRODUCTS: catalogue size (default 200).
    LOAD_COLLECTION: collection name (default ``locust-shop``).
"""

from __future__ import annotations

import json
import os
import random
import uuid
from typing import Any

from locust import HttpUser, between, events, task
from locust.runners import WorkerRunner

MAX_TOKENS = int(os.environ.get("LOAD_MAX_TOKENS", "16"))
PRODUCTS = int(os.environ.get("LOAD_PRODUCTS", "200"))
COLLECTION = os.environ.get("LOAD_COLLECTION", "locust-shop")
API_KEY = os.environ.get("GPUPROMPT_API_KEY")
HEADERS = {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}

TYPES = ["dress", "t-shirt", "jeans", "sweater", "rain jacket", "skirt", "shirt", "hoodie"]
COLOURS = ["red", "navy", "olive", "black", "white", "mustard", "grey", "teal"]
MATERIALS = ["cotton", "linen", "wool", "polyester", "viscose", "silk"]
QUESTIONS = [
    "Do you have a {colour} {kind} in {material}?",
    "How much is the {colour} {kind}?",
    "Will the {material} {kind} shrink after washing?",
    "Which {kind} is cheapest?",
    "Is the {colour} {kind} machine washable?",
]


def catalogue(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """A deterministic synthetic catalogue (kept here so the load test needs only Locust)."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        kind, colour, material = rng.choice(TYPES), rng.choice(COLOURS), rng.choice(MATERIALS)
        price = rng.randrange(15, 260)
        shrink = round(rng.uniform(0, 5), 1)
        items.append({
            "id": f"P{i:05d}",
            "text": f"{kind.title()} {i} (SKU P{i:05d}): {colour}, 100% {material}, shrinks {shrink}% at 40 C, "
                    f"{price} EUR.",
            "metadata": {"type": kind, "colour": colour, "material": material, "price": price},
        })
    return items


def question(rng: random.Random) -> str:
    """A random customer question about the catalogue."""
    return rng.choice(QUESTIONS).format(kind=rng.choice(TYPES), colour=rng.choice(COLOURS),
                                        material=rng.choice(MATERIALS))


def seed(host: str) -> int:
    """Upsert the catalogue into the collection (idempotent: same ids; repeated texts are cache hits).

    Returns:
        The number of products upserted.
    """
    import requests

    items = catalogue(PRODUCTS)
    response = requests.post(
        f"{host}/v1/collections/{COLLECTION}/documents",
        json={"ids": [p["id"] for p in items], "documents": [p["text"] for p in items],
              "metadatas": [p["metadata"] for p in items]},
        headers=HEADERS,
        timeout=600,
    )
    response.raise_for_status()
    return len(items)


@events.test_start.add_listener
def seed_collection(environment: Any, **kwargs: Any) -> None:
    """Seed once before any user starts (on the master or the local runner)."""
    if isinstance(environment.runner, WorkerRunner):
        return
    count = seed(environment.host)
    print(f"seeded collection {COLLECTION!r} with {count} products", flush=True)


@events.quitting.add_listener
def print_summary(environment: Any, **kwargs: Any) -> None:
    """One line per request type, then the total: requests, failures, p50, p95 (ms), throughput."""
    stats = environment.stats
    rows = [stats.entries[key] for key in sorted(stats.entries)] + [stats.total]
    print("gpuprompt load summary (response times in ms)")
    for entry in rows:
        if not entry.num_requests:
            continue
        print(
            f"  {entry.name:24s} requests {entry.num_requests:6d}  failures {entry.num_failures:4d}  "
            f"p50 {entry.get_response_time_percentile(0.5):7.0f}  p95 {entry.get_response_time_percentile(0.95):7.0f}  "
            f"{entry.total_rps:6.2f} req/s"
        )


class ShopUser(HttpUser):
    """A customer-facing app: embeds queries, chats, searches the catalogue and asks RAG questions."""

    wait_time = between(0.5, 1.5)

    def on_start(self) -> None:
        self.rng = random.Random()
        self.session_id = uuid.uuid4().hex

    def _post(self, path: str, body: dict[str, Any], name: str, check: Any) -> None:
        with self.client.post(path, json=body, headers=HEADERS, name=name, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            try:
                problem = check(response.json())
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                problem = f"unexpected body: {exc!r}"
            if problem:
                response.failure(problem)

    @task(4)
    def embeddings(self) -> None:
        texts = [question(self.rng) for _ in range(self.rng.randint(1, 4))]

        def check(body: dict[str, Any]) -> str | None:
            if len(body["data"]) != len(texts) or not body["data"][0]["embedding"]:
                return "wrong number of embeddings"
            return None

        self._post("/v1/embeddings", {"input": texts, "encoding_format": "float"}, "embeddings", check)

    @task(3)
    def chat(self) -> None:
        body = {"messages": [{"role": "user", "content": question(self.rng)}], "max_tokens": MAX_TOKENS,
                "temperature": 0}

        def check(reply: dict[str, Any]) -> str | None:
            if reply["choices"][0]["finish_reason"] not in ("stop", "length"):
                return f"finish_reason {reply['choices'][0]['finish_reason']!r}"
            return None if reply["usage"]["completion_tokens"] <= MAX_TOKENS else "too many tokens"

        self._post("/v1/chat/completions", body, "chat", check)

    @task(1)
    def chat_stream(self) -> None:
        body = {"messages": [{"role": "user", "content": question(self.rng)}], "max_tokens": MAX_TOKENS,
                "temperature": 0, "stream": True}
        # With stream=True the recorded time is the time to the first byte (the first token).
        with self.client.post("/v1/chat/completions", json=body, headers=HEADERS, name="chat stream (first byte)",
                              stream=True, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            events_seen = [line[6:] for line in response.iter_lines(decode_unicode=True) if line.startswith("data: ")]
            if not events_seen or events_seen[-1] != "[DONE]":
                response.failure("the stream did not end with [DONE]")
            elif any('"error"' in e and "error" in json.loads(e) for e in events_seen[:-1]):
                response.failure("the stream reported an error")

    @task(2)
    def search(self) -> None:
        kind = self.rng.choice(TYPES)
        body = {"query": question(self.rng), "k": 4, "filter": {"type": kind}}

        def check(reply: dict[str, Any]) -> str | None:
            if any(hit["metadata"]["type"] != kind for hit in reply["hits"]):
                return "a hit does not match the filter"
            return None

        self._post(f"/v1/collections/{COLLECTION}/query", body, "collection query", check)

    @task(2)
    def rag_chat(self) -> None:
        body = {"session_id": self.session_id, "question": question(self.rng), "max_tokens": MAX_TOKENS}

        def check(reply: dict[str, Any]) -> str | None:
            return None if reply["sources"] else "no sources"

        self._post(f"/v1/collections/{COLLECTION}/chat", body, "collection chat (RAG)", check)


def main(argv: list[str] | None = None) -> int:
    """``make load``: start a local server, run this file under Locust headless, stop the server.

    Returns:
        Locust's exit status (1 when any request failed), or 1 when the server did not start.
    """
    import argparse
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    parser = argparse.ArgumentParser(description="Run the gpuprompt load test against a local server.")
    parser.add_argument("--users", type=int, default=32, help="concurrent simulated users (default 32)")
    parser.add_argument("--run-time", default="60s", help="how long to run, Locust syntax (default 60s)")
    parser.add_argument("--port", type=int, default=8765, help="the local server's port (default 8765)")
    parser.add_argument("--backend", default="auto", choices=["auto", "vllm", "transformers"], help="LLM backend")
    parser.add_argument("--host", default=None, help="test this running server instead of starting one")
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for the server")
    args = parser.parse_args(argv)

    server = None
    host = args.host
    if host is None:
        host = f"http://127.0.0.1:{args.port}"
        code = (
            "import sys\nfrom gpuprompt.server import serve\n"
            f"sys.exit(serve(host='127.0.0.1', port={args.port}, llm_backend={args.backend!r}, log_level='warning'))\n"
        )
        # The engine's own INFO/WARNING lines would bury Locust's summary (override by setting them).
        env = {"VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error", **os.environ}
        server = subprocess.Popen([sys.executable, "-c", code], env=env)
        print(f"starting a local server on {host} (LLM backend {args.backend}) ...", flush=True)
    try:
        deadline = time.monotonic() + args.startup_timeout
        while True:
            try:
                with urllib.request.urlopen(f"{host}/health", timeout=2):
                    break
            except OSError:
                if (server is not None and server.poll() is not None) or time.monotonic() > deadline:
                    print(f"the server at {host} did not come up", file=sys.stderr)
                    return 1
                time.sleep(1.0)
        # Seeding here first keeps Locust's clock for the load: its own seeding is then cache hits.
        seed(host)
        command = [
            sys.executable, "-m", "locust", "-f", __file__, "--headless", "-u", str(args.users), "-r",
            str(args.users), "-t", args.run_time, "--stop-timeout", "60", "--host", host, "--only-summary",
        ]
        print(" ".join(command[1:]), flush=True)
        return subprocess.run(command).returncode
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)  # drains in-flight requests, then exits
            try:
                server.wait(180)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


if __name__ == "__main__":
    raise SystemExit(main())
