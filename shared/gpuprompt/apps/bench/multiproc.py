"""``multiproc``: four app worker processes answering RAG questions, in process vs remote.

The deployment question of a RAG app under ``uvicorn --workers 4`` or gunicorn: each worker loads
its own embedder, index and LLM engine (*in process*), or every worker sends its questions to one
``gpuprompt serve`` that holds the models once and batches across workers (*remote*). Both sides
run the same :class:`~gpuprompt.RAGPipeline` over the same catalogue (in each worker, or in the
server's collection chat route), at temperature 0, with the same LLM backend (vLLM's CPU build
when installed, each engine with a 1 GiB KV cache; else transformers). On a GPU the in-process side
could not even run: a second in-process vLLM engine does not start on a GPU the first one holds.

Measured per side, over one burst that starts in every worker at the same instant: answers per
second of wall time, p50 / p95 latency of one answer, and the total resident memory of every
process on the side (workers, plus the server and its children for remote). Each worker is a
fresh process; a remote worker imports httpx only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario

__all__: list[str] = []

WORKERS = 4
CONCURRENCY = 4  # questions in flight per worker (an async app serving several users)
_START_TIMEOUT_S = 600.0
_RUN_TIMEOUT_S = 1800.0


def _sizes(quick: bool) -> tuple[int, int, int]:
    """(catalogue products, questions per worker, new tokens per answer)."""
    return (200, 8, 16) if quick else (500, 16, 32)


def _backend() -> str:
    """The LLM backend of both sides: vLLM (the product's default) when installed, else transformers."""
    import importlib.util

    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


def _env() -> dict[str, str]:
    # The same KV cache for every vLLM engine of both sides (1 GiB each on CPU).
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_LOGGING_LEVEL": "ERROR"}


def _questions(worker: int, n: int, run: int) -> list[str]:
    from gpuprompt.apps.bench._load import queries

    return queries(n, f"run {run} worker {worker}: ")


def _rss_bytes(pids: list[int]) -> int:
    """Resident memory of these processes and all their descendants."""
    import psutil

    seen: set[int] = set()
    total = 0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in family:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
    return total


# ---------------------------------------------------------------------- one worker (child process)
def _worker_inproc(args: argparse.Namespace) -> dict[str, Any]:
    from gpuprompt.embed import Embedder
    from gpuprompt.index import VectorIndex
    from gpuprompt.llm import LLMEngine
    from gpuprompt.rag import RAGPipeline
    from gpuprompt._corpus import catalogue

    products, _, max_tokens = _sizes(args.quick)
    embedder = Embedder(device="cpu").load()
    llm = LLMEngine(backend=_backend(), device="cpu").load()
    items = catalogue(products)
    texts = [item["text"] for item in items]
    index = VectorIndex(embedder.dim, metric="cosine", device="cpu")
    index.add([item["id"] for item in items], embedder.embed_tensor(texts), texts)
    rag = RAGPipeline(index, llm, embedder=embedder, max_tokens=max_tokens)
    _ready(args)

    async def one(i: int, question: str) -> str:
        return (await rag.aanswer(f"w{args.worker}-q{i}", question)).answer

    try:
        return _burst(args, one)
    finally:
        index.close()
        llm.close()
        embedder.close()


def _worker_remote(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    _, _, max_tokens = _sizes(args.quick)
    client = httpx.AsyncClient(base_url=args.url, timeout=600.0,
                               limits=httpx.Limits(max_connections=CONCURRENCY * 2))
    _ready(args)

    async def one(i: int, question: str) -> str:
        reply = await client.post("/v1/collections/kb/chat", json={
            "session_id": f"w{args.worker}-q{i}", "question": question, "max_tokens": max_tokens})
        reply.raise_for_status()
        return reply.json()["answer"]

    return _burst(args, one)


def _ready(args: argparse.Namespace) -> None:
    """Say the models are loaded, then wait for the common start instant (a file the parent writes)."""
    Path(args.out + ".ready").write_text("1")
    go = Path(args.go)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the bench never said go")
        time.sleep(0.01)


def _burst(args: argparse.Namespace, one: Any) -> dict[str, Any]:
    import asyncio

    _, per_worker, _ = _sizes(args.quick)
    questions = _questions(args.worker, per_worker, args.run)

    async def run() -> list[tuple[float, str, float]]:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def timed(i: int, question: str) -> tuple[float, str, float]:
            async with gate:
                started = time.perf_counter()
                answer = await one(i, question)
                return time.perf_counter() - started, answer, time.time()

        return list(await asyncio.gather(*(timed(i, q) for i, q in enumerate(questions))))

    started = time.time()
    done = asyncio.run(run())
    return {"latencies_s": [d[0] for d in done], "answers": [d[1] for d in done], "started": started,
            "finished": max(d[2] for d in done)}


# ---------------------------------------------------------------------- one side (parent)
def _spawn_workers(mode: str, run: int, quick: bool, work: Path, url: str | None) -> list[subprocess.Popen]:
    go = work / f"go-{mode}-{run}"
    procs = []
    for worker in range(WORKERS):
        command = [sys.executable, "-m", "gpuprompt.apps.bench.multiproc", "--worker", mode, "--index", str(worker),
                   "--run", str(run), "--out", str(work / f"{mode}-{run}-{worker}.json"), "--go", str(go)]
        if quick:
            command.append("--quick")
        if url:
            command += ["--url", url]
        env = _env()
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True))
    return procs


def _run_side(mode: str, run: int, quick: bool, work: Path, url: str | None, server_pid: int | None) -> dict[str, float]:
    procs = _spawn_workers(mode, run, quick, work, url)
    outs = [work / f"{mode}-{run}-{w}.json" for w in range(WORKERS)]
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not all(Path(str(o) + ".ready").exists() for o in outs):
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a {mode} worker exited early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {mode} workers did not load in {_START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        pids = [p.pid for p in procs] + ([server_pid] if server_pid else [])
        rss = _rss_bytes(pids)  # everything loaded, before the burst
        (work / f"go-{mode}-{run}").write_text("go")
        peak = rss
        while any(p.poll() is None for p in procs):
            peak = max(peak, _rss_bytes(pids))
            time.sleep(0.5)
        for proc in procs:
            if proc.returncode != 0:
                raise RuntimeError(f"a {mode} worker failed ({proc.returncode}): {proc.stderr.read()[-3000:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
    results = [json.loads(o.read_text()) for o in outs]
    latencies = sorted(x for r in results for x in r["latencies_s"])
    wall = max(r["finished"] for r in results) - min(r["started"] for r in results)
    return {
        "answers_per_s": len(latencies) / wall,
        "p50_s": statistics.median(latencies),
        "p95_s": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
        "rss_gib": rss / 2**30,
        "peak_rss_gib": peak / 2**30,
        "answers": float(len(latencies)),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _remote_side(run: int, quick: bool, work: Path) -> dict[str, float]:
    import httpx

    from gpuprompt._corpus import catalogue

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env()
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuprompt.apps.cli", "serve", "--port", str(port), "--llm-backend", _backend(),
         "--device", "cpu", "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"gpuprompt serve exited ({server.returncode}): {server.stderr.read()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("gpuprompt serve did not start")
            time.sleep(0.2)
        products, _, _ = _sizes(quick)
        items = catalogue(products)
        httpx.post(f"{url}/v1/collections/kb/documents", timeout=600, json={
            "documents": [i["text"] for i in items], "ids": [i["id"] for i in items]}).raise_for_status()
        return _run_side("remote", run, quick, work, url, server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)


@scenario(
    "multiproc",
    "4 app worker processes answering RAG questions (4 in flight each): every worker loads its own "
    "embedder, index and LLM engine (in process) vs every worker calls one gpuprompt serve (remote); "
    "answers/s, p50/p95 and the total resident memory of all processes.",
)
def multiproc(ctx: BenchContext) -> ScenarioResult:
    run_ids = iter(range(10**6))
    with tempfile.TemporaryDirectory(prefix="gpuprompt-multiproc-") as folder:
        work = Path(folder)

        def measure() -> dict[str, float]:
            run = next(run_ids)
            sides = ["inproc", "remote"] if run % 2 == 0 else ["remote", "inproc"]
            figures = {}
            for side in sides:
                figures[side] = (_run_side("inproc", run, ctx.quick, work, None, None) if side == "inproc"
                                 else _remote_side(run, ctx.quick, work))
            ours, stock = figures["remote"], figures["inproc"]
            return {
                "inproc_answers_per_s": stock["answers_per_s"],
                "remote_answers_per_s": ours["answers_per_s"],
                "throughput_ratio": ours["answers_per_s"] / stock["answers_per_s"],
                "inproc_p50_s": stock["p50_s"],
                "remote_p50_s": ours["p50_s"],
                "inproc_p95_s": stock["p95_s"],
                "remote_p95_s": ours["p95_s"],
                "inproc_rss_gib": stock["rss_gib"],
                "remote_rss_gib": ours["rss_gib"],
                "inproc_peak_rss_gib": stock["peak_rss_gib"],
                "remote_peak_rss_gib": ours["peak_rss_gib"],
                "memory_ratio": ours["peak_rss_gib"] / stock["peak_rss_gib"],
            }

        medians, runs = ctx.repeat(measure)
    met = (medians["throughput_ratio"] >= 1.0 and medians["remote_p95_s"] <= medians["inproc_p95_s"]
           and medians["memory_ratio"] < 1.0)
    return ScenarioResult(
        metrics=medians,
        goal="remote beats in process on every figure: answers/s, p50, p95 and total memory",
        goal_met=met,
        runs=runs,
        ratio=medians["throughput_ratio"],
        ratio_label="answers/s, remote vs in process",
        chart=Chart(
            kind="bar",
            title=f"{WORKERS} app workers: in process vs one gpuprompt serve",
            ylabel="answers/s",
            labels=["in process (4 engines)", "remote (1 server)"],
            values=[medians["inproc_answers_per_s"], medians["remote_answers_per_s"]],
        ),
        notes=(
            f"Both sides: RAGPipeline over the same catalogue, the {_backend()} backend on CPU (vLLM: 1 GiB KV "
            "cache per engine), temperature 0. "
            "Memory: resident set of every process of the side (workers; remote also the server) with the "
            "models loaded, and its peak during the burst. On a GPU box the in-process side is worse than "
            "this: a second in-process vLLM engine cannot start on a GPU the first one holds, and four "
            "copies of the weights and KV cache do not fit; remote keeps one engine whose batches mix "
            "every worker's requests."
        ),
    )


def _worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one worker of the multiproc bench (internal)")
    parser.add_argument("--worker", choices=["inproc", "remote"], required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--run", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--go", required=True)
    parser.add_argument("--url")
    args = parser.parse_args(argv)
    args.worker, args.mode = args.index, args.worker
    figures = _worker_inproc(args) if args.mode == "inproc" else _worker_remote(args)
    Path(args.out).write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
