"""Quickstart: the official ``openai`` client (and plain HTTP for collections) against ``gpuprompt serve``.

Start a server, then run this::

    gpuprompt serve --port 8000 &                # the bundled models; vLLM when installed
    python examples/server_quickstart.py         # or: --start, to start (and stop) a local server itself

Environment: ``GPUPROMPT_BASE_URL`` (default ``http://127.0.0.1:8000``), ``GPUPROMPT_API_KEY`` (when the
server was started with ``--api-key``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import httpx
import openai


def wait_for(base_url: str, timeout: float = 900.0) -> None:
    """Block until ``GET /health`` answers (models load before the port opens)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"no gpuprompt server answered at {base_url}; start one with: gpuprompt serve")
        time.sleep(1.0)


def run(base_url: str, api_key: str) -> None:
    """Embeddings, chat, streaming and a RAG conversation over a collection."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key)

    # 1. What is served: the chat model first, then the embedding model.
    chat_model, embedding_model = (m.id for m in client.models.list())
    print(f"chat model: {chat_model}\nembedding model: {embedding_model}\n")

    # 2. Embeddings: concurrent requests from any number of clients are batched on the server.
    response = client.embeddings.create(model=embedding_model, input=["a red cotton dress", "a navy wool coat"])
    print(f"2 embeddings of dimension {len(response.data[0].embedding)}, {response.usage.prompt_tokens} tokens\n")

    # 3. Chat completion.
    messages = [
        {"role": "system", "content": "You are a concise shop assistant."},
        {"role": "user", "content": "Suggest a colour for a summer dress."},
    ]
    reply = client.chat.completions.create(model=chat_model, messages=messages, max_tokens=40, temperature=0)
    print(f"chat: {reply.choices[0].message.content!r} ({reply.usage.completion_tokens} tokens)\n")

    # 4. Streaming: tokens arrive as they are generated; closing the stream early cancels the request.
    print("stream: ", end="", flush=True)
    stream = client.chat.completions.create(
        model=chat_model, messages=messages, max_tokens=40, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            print(f"\n({chunk.usage.total_tokens} tokens in all)\n")

    # 5. Collections (gpuprompt's own routes): upsert documents, search with a filter, RAG chat.
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=300.0) as http:
        products = [
            ("P1", "Aurora dress: red, 100% cotton, shrinks about 3% after a 40 C wash, 49 EUR.", 49),
            ("P2", "Breeze dress: red linen, dry clean only, 180 EUR.", 180),
            ("P3", "Cedar coat: navy wool, hand wash cold, 220 EUR.", 220),
        ]
        http.post(
            "/v1/collections/quickstart/documents",
            json={"ids": [p[0] for p in products], "documents": [p[1] for p in products],
                  "metadatas": [{"price": p[2]} for p in products]},
        ).raise_for_status()
        hits = http.post(
            "/v1/collections/quickstart/query", json={"query": "red dress", "k": 2, "filter": {"price": {"$lt": 100}}}
        ).json()["hits"]
        print("search (price < 100):", [(h["id"], round(h["score"], 3)) for h in hits], "\n")
        for question in ("I'd like a red dress under 100 EUR. Which one?", "Will it shrink after washing?"):
            answer = http.post(
                "/v1/collections/quickstart/chat",
                json={"session_id": "customer-42", "question": question, "max_tokens": 48},
            ).json()
            print(f"customer: {question}\nassistant: {answer['answer']}")
            print(f"  sources {[s['id'] for s in answer['sources']]}, history turns {answer['history_turns']}, "
                  f"{answer['timings']['total_s']:.2f} s\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", action="store_true", help="start a local server on --port, stop it at the end")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--backend", default="auto", choices=["auto", "vllm", "transformers"])
    args = parser.parse_args(argv)
    base_url = os.environ.get("GPUPROMPT_BASE_URL", f"http://127.0.0.1:{args.port}").rstrip("/")
    api_key = os.environ.get("GPUPROMPT_API_KEY", "no-key-needed")
    server = None
    if args.start:
        code = (
            "import sys\nfrom gpuprompt.server import serve\n"
            f"sys.exit(serve(port={args.port}, llm_backend={args.backend!r}, log_level='warning'))\n"
        )
        server = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_for(base_url)
        run(base_url, api_key)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)  # drains, then exits 0
            server.wait(120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
