"""``gpuprompt demo``: the e-commerce support case end to end on the bundled models.

Builds a synthetic product catalogue, indexes it, runs a scripted multi-turn conversation and a
burst of concurrent customers through :class:`~gpuprompt.RAGPipeline`, then the same conversation
and customers through a naive serial pipeline, and prints the per-stage latency table of both.
"""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuprompt._corpus import SCRIPT, catalogue, customer_questions

__all__ = ["SCRIPT", "NaivePipeline", "catalogue", "customer_questions", "run_demo"]

@dataclass
class _StageRow:
    embed: list[float]
    retrieve: list[float]
    context: list[float]
    generate: list[float]
    total: list[float]
    response: list[float]  # what the customer waits: queueing behind earlier customers included
    rerank: list[float] | None = None  # with a rerank model: the cross-encoder stage


class NaivePipeline:
    """The "before" picture: one request at a time, no batching, no caches.

    Each answer encodes the question alone, re-encodes the whole conversation history, searches a
    flat faiss index with one query, and generates with a lone ``transformers`` ``generate`` call
    — what a straightforward RAG service does.
    """

    def __init__(self, documents: Sequence[str], vectors: Any, system_prompt: str, k: int = 4, max_tokens: int = 48):
        import numpy as np
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from gpuprompt.index._faiss import import_faiss
        from gpuprompt.models import resolve_chat_model, resolve_embedding_model

        faiss = import_faiss()  # a typed DependencyError naming the extra when faiss is missing

        self.documents = list(documents)
        self.encoder = SentenceTransformer(resolve_embedding_model(None), device="cpu")
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        folder = resolve_chat_model(None)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.system_prompt = system_prompt
        self.k = k
        self.max_tokens = max_tokens
        self.history: dict[str, list[dict[str, str]]] = {}

    def answer(self, session_id: str, question: str) -> tuple[str, dict[str, float]]:
        """Answer one question; return the text and per-stage seconds."""
        import torch

        t0 = time.perf_counter()
        query = self.encoder.encode([question], normalize_embeddings=True)
        t1 = time.perf_counter()
        _, ids = self.index.search(query, self.k)
        t2 = time.perf_counter()
        history = self.history.setdefault(session_id, [])
        if history:
            self.encoder.encode([m["content"] for m in history], normalize_embeddings=True)  # re-encoded every turn
        t3 = time.perf_counter()
        facts = "\n".join(f"[{i + 1}] {self.documents[j]}" for i, j in enumerate(ids[0]) if j >= 0)
        messages = [{"role": "system", "content": self.system_prompt}, *history[-6:],
                    {"role": "user", "content": f"Product facts:\n{facts}\n\nQuestion: {question}"}]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                    return_dict=True)
        with torch.inference_mode():
            out = self.model.generate(**prompt, max_new_tokens=self.max_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.eos_token_id)
        text = self.tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True).strip()
        t4 = time.perf_counter()
        history.extend([{"role": "user", "content": question}, {"role": "assistant", "content": text}])
        return text, {"embed": t1 - t0, "retrieve": t2 - t1, "context": t3 - t2, "generate": t4 - t3, "total": t4 - t0}


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _table(rows: dict[str, _StageRow], throughput: dict[str, float]) -> str:
    stages = ["embed", "retrieve", "context", "generate", "total", "response"]
    if any(row.rerank is not None for row in rows.values()):
        stages.insert(2, "rerank")
    names = list(rows)
    header = f"{'stage':10s}" + "".join(f" | {name + ' p50':>30s} {'p95':>8s}" for name in names)
    lines = [header, "-" * len(header)]
    for stage in stages:
        cells = []
        for name in names:
            values = getattr(rows[name], stage)
            if values is None:
                cells.append(f" | {'-':>30s} {'':>8s}")
                continue
            cells.append(f" | {_p(values, 0.5) * 1000:>27,.0f} ms {_p(values, 0.95) * 1000:>6,.0f} ms")
        lines.append(f"{stage:10s}" + "".join(cells))
    lines.append(f"{'answers/s':10s}" + "".join(f" | {throughput[n]:>30.2f} {'':>8s}" for n in names))
    return "\n".join(lines)


def run_demo(
    products: int = 2000,
    customers: int = 32,
    naive_customers: int | None = None,
    max_tokens: int = 48,
    llm_backend: str = "auto",
    rerank_model: str | None = None,
) -> int:
    """Run the demo and print what it does; return the process exit code.

    Args:
        products: catalogue size.
        customers: concurrent customers in the burst.
        naive_customers: how many of them the naive serial pipeline serves, one at a time
            (None: all of them).
        max_tokens: new tokens per answer.
        llm_backend: the engine backend (``"auto"``, ``"vllm"`` or ``"transformers"``).
        rerank_model: a cross-encoder (local folder or hub id): the pipeline then retrieves 20
            candidates and reranks them to 4, and the stage table gets a ``rerank`` row.

    Raises:
        ConfigurationError: a count that is not an int >= 1.
    """
    from gpuprompt.errors import ConfigurationError, describe

    naive_customers = customers if naive_customers is None else naive_customers
    for name, value in (("products", products), ("customers", customers), ("naive_customers", naive_customers),
                        ("max_tokens", max_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigurationError(f"'{name}' must be an int >= 1 (got {describe(value)}).")
    from gpuprompt.index import VectorIndex
    from gpuprompt.rag import RAGPipeline
    from gpuprompt.runtime import get_runtime
    from gpuprompt.rag import DEFAULT_SYSTEM_PROMPT

    started = time.perf_counter()
    runtime = get_runtime()
    embedder = runtime.embedder(show_progress=True)
    print(f"gpuprompt demo — device: {embedder.device}")
    items = catalogue(products)
    print(f"\n1. Indexing {len(items):,} products")
    t = time.perf_counter()
    vectors = embedder.embed([p["text"] for p in items], show_progress=True)
    index = VectorIndex(embedder.dim, metric="cosine")
    index.add([p["id"] for p in items], vectors, documents=[p["text"] for p in items],
              metadatas=[p["metadata"] for p in items])
    print(f"   {index.count:,} products indexed in {time.perf_counter() - t:.1f} s ({index!r})")

    print("\n2. Starting the LLM engine (bundled SmolLM2-135M-Instruct)")
    t = time.perf_counter()
    llm = runtime.llm(backend=llm_backend)
    llm.load()
    print(f"   backend {llm.backend_name} ready in {time.perf_counter() - t:.1f} s")
    reranker = None
    if rerank_model is not None:
        reranker = runtime.reranker(rerank_model).load()
        print(f"   reranking with {reranker.model_id}: 20 candidates retrieved, the best 4 kept")
    rag = RAGPipeline(index, llm, embedder=embedder, max_tokens=max_tokens, reranker=reranker,
                      fetch_k=20 if reranker is not None else None)

    print("\n3. A scripted conversation (session 'alice')")
    scripted = []
    for question in SCRIPT:
        reply = rag.answer("alice", question)
        scripted.append(reply)
        print(f"   customer: {question}")
        print(textwrap.fill(f"assistant: {reply.answer}", 100, initial_indent="   ", subsequent_indent="      "))
        print(f"      sources: {', '.join(h.id for h in reply.sources)}  "
              f"({reply.timings.total_s * 1000:,.0f} ms, {len(reply.history)} history turns)")

    named = items[len(items) * 3 // 7]
    question = f"I bought SKU {named['id']}: how much will it shrink?"
    print("\n   A question that names an article code: the code decides, not the meaning")
    dense = index.search(embedder.embed([question]), 1)[0]
    hybrid = RAGPipeline(index, llm, embedder=embedder, max_tokens=max_tokens, retrieval="hybrid", alpha=0.3)
    reply = hybrid.answer("bob", question)
    print(f"   customer: {question}")
    print(f"      dense retrieval's best match: {dense[0].id if dense else '-'}; hybrid (BM25 + vectors, "
          f"alpha 0.3): {reply.sources[0].id if reply.sources else '-'} (asked for {named['id']})")
    print(textwrap.fill(f"assistant: {reply.answer}", 100, initial_indent="   ", subsequent_indent="      "))

    questions = customer_questions(customers)
    print(f"\n4. A burst of {customers} concurrent customers")

    async def burst() -> list[Any]:
        return list(await asyncio.gather(*(rag.aanswer(f"customer-{i}", q) for i, q in enumerate(questions))))

    t = time.perf_counter()
    replies = asyncio.run(burst())
    burst_wall = time.perf_counter() - t
    print(f"   {customers} answers in {burst_wall:.1f} s")
    fast = _StageRow(*([getattr(r.timings, f"{s}_s") for r in replies] for s in
                       ("embed", "retrieve", "context", "generate", "total", "total")),
                     rerank=[r.timings.rerank_s for r in replies] if reranker is not None else None)

    print(f"\n5. The same conversation, then {naive_customers} customers, through a naive serial pipeline "
          "(one request at a time, history re-encoded every turn)")
    naive = NaivePipeline([p["text"] for p in items], vectors, DEFAULT_SYSTEM_PROMPT, max_tokens=max_tokens)
    for question in SCRIPT:
        _, stages = naive.answer("alice", question)
    history_cost = (stages["context"], scripted[-1].timings.context_s)
    slow = _StageRow([], [], [], [], [], [])
    t = time.perf_counter()
    for i, q in enumerate(questions[:naive_customers]):
        _, stages = naive.answer(f"customer-{i}", q)
        for name, value in stages.items():
            getattr(slow, name).append(value)
        slow.response.append(time.perf_counter() - t)  # all arrived at once, served one by one
    naive_wall = time.perf_counter() - t

    print("\nPer-stage latency of the customers' answers (p50 / p95); 'response' is what a customer waits "
          "when all arrive at once\n")
    naive_name, fast_name = f"naive serial, {naive_customers} cust.", f"gpuprompt, {customers} cust."
    print(_table({naive_name: slow, fast_name: fast},
                 {naive_name: naive_customers / naive_wall, fast_name: customers / burst_wall}))
    print(f"\nhistory at turn {len(SCRIPT)} of the conversation: naive {history_cost[0] * 1000:,.1f} ms "
          f"(re-encodes {2 * (len(SCRIPT) - 1)} messages), gpuprompt {history_cost[1] * 1000:,.1f} ms "
          "(each turn embedded once, on arrival)")
    print(f"throughput: {customers / burst_wall / (naive_customers / naive_wall):.1f}x the naive pipeline; "
          f"device {embedder.device}, LLM backend {llm.backend_name}; demo took {time.perf_counter() - started:.0f} s")
    return 0
