"""Framework scenarios: whole LangChain / LlamaIndex apps with the stock classes vs ours, same
models, same run (``li-query``: a LlamaIndex query engine under 16 concurrent ``aquery`` calls)."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from gpuprompt.bench._registry import BenchContext, Chart, ScenarioResult, scenario

__all__: list[str] = []


# ============================================================================ li-query (LlamaIndex)
_LI_CONCURRENCY = 16


def _li_stock_classes(max_tokens: int) -> tuple[Any, Any, Any]:
    """The stock LlamaIndex stack on the bundled models: HuggingFaceEmbedding, FaissVectorStore
    (IndexFlatL2, as in its docs) and HuggingFaceLLM (greedy, the model's chat template)."""
    import faiss
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.llms.huggingface import HuggingFaceLLM
    from llama_index.vector_stores.faiss import FaissVectorStore

    from gpuprompt.models import resolve_chat_model, resolve_embedding_model
    from gpuprompt.runtime import resolve_device

    device = resolve_device("auto")
    embed = HuggingFaceEmbedding(model_name=resolve_embedding_model(None), device=device)
    chat_path = resolve_chat_model(None)
    llm = HuggingFaceLLM(
        model_name=chat_path,
        tokenizer_name=chat_path,
        context_window=2048,
        max_new_tokens=max_tokens,
        device_map=device,
        is_chat_model=True,  # both stacks prompt through the model's chat template
        generate_kwargs={"do_sample": False},
    )
    store = FaissVectorStore(faiss_index=faiss.IndexFlatL2(embed._model.get_sentence_embedding_dimension()))
    return embed, store, llm


def _li_our_classes(max_tokens: int) -> tuple[Any, Any, Any]:
    from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptLLM, GPUPromptVectorStore

    return GPUPromptEmbedding(), GPUPromptVectorStore(), GPUPromptLLM(max_tokens=max_tokens)


def _li_engine(documents: list[Any], embed: Any, store: Any, llm: Any, top_k: int) -> Any:
    from llama_index.core import StorageContext, VectorStoreIndex

    storage = StorageContext.from_defaults(vector_store=store)
    index = VectorStoreIndex.from_documents(documents, storage_context=storage, embed_model=embed)
    return index.as_query_engine(llm=llm, embed_model=embed, similarity_top_k=top_k)


def _li_burst(engine: Any, questions: list[str]) -> dict[str, float]:
    """All questions as concurrent ``aquery`` calls on one event loop: answers/s and latencies."""

    async def one(question: str) -> float:
        started = time.perf_counter()
        response = await engine.aquery(question)
        if not str(response).strip() and not response.source_nodes:
            raise RuntimeError(f"empty response for {question!r}")
        return time.perf_counter() - started

    async def burst() -> list[float]:
        return list(await asyncio.gather(*(one(q) for q in questions)))

    started = time.perf_counter()
    latencies = sorted(asyncio.run(burst()))
    wall = time.perf_counter() - started
    return {
        "answers_per_s": len(questions) / wall,
        "p50_s": statistics.median(latencies),
        "p95_s": latencies[int(0.95 * (len(latencies) - 1))],
    }


@scenario(
    "li-query",
    "LlamaIndex query engine over the e-commerce catalogue, 16 concurrent aquery calls: stock "
    "HuggingFaceEmbedding + FaissVectorStore + HuggingFaceLLM vs GPUPromptEmbedding + "
    "GPUPromptVectorStore + GPUPromptLLM, same models (bundled MiniLM and SmolLM2-135M-Instruct).",
)
def li_query(ctx: BenchContext) -> ScenarioResult:
    from llama_index.core import Document

    from gpuprompt.demo import catalogue, customer_questions

    products, max_tokens, top_k = (200, 24, 2) if ctx.quick else (2000, 48, 3)
    documents = [Document(text=p["text"], metadata=p["metadata"], doc_id=p["id"]) for p in catalogue(products)]

    # Build times cover embedding and indexing the catalogue (the stock models load before).
    stock_classes = _li_stock_classes(max_tokens)
    started = time.perf_counter()
    stock = _li_engine(documents, *stock_classes, top_k=top_k)
    stock_build = time.perf_counter() - started
    our_classes = _li_our_classes(max_tokens)
    our_classes[0].embedder.load()
    started = time.perf_counter()
    ours = _li_engine(documents, *our_classes, top_k=top_k)
    ours_build = time.perf_counter() - started
    backend = our_classes[2].engine.backend_name  # loads the engine (outside the timed bursts)

    warm = customer_questions(2, seed=999)
    _li_burst(stock, warm)
    _li_burst(ours, warm)
    run_id = iter(range(10**6))

    def measure() -> dict[str, float]:
        # New questions every run: neither stack may answer from a cache warmed by an earlier run.
        questions = customer_questions(_LI_CONCURRENCY, seed=1000 + next(run_id))
        stock_fig = _li_burst(stock, questions)
        ours_fig = _li_burst(ours, questions)
        return {
            "stock_answers_per_s": stock_fig["answers_per_s"],
            "ours_answers_per_s": ours_fig["answers_per_s"],
            "throughput_ratio": ours_fig["answers_per_s"] / stock_fig["answers_per_s"],
            "stock_p50_s": stock_fig["p50_s"],
            "ours_p50_s": ours_fig["p50_s"],
            "stock_p95_s": stock_fig["p95_s"],
            "ours_p95_s": ours_fig["p95_s"],
            "p95_ratio": stock_fig["p95_s"] / ours_fig["p95_s"],
        }

    # Quick: at most two runs -- a stock burst alone takes ~30 s on two CPU cores.
    repeat_ctx = BenchContext(quick=True, runs=min(ctx.runs, 2), out_dir=ctx.out_dir) if ctx.quick else ctx
    metrics, runs = repeat_ctx.repeat(measure)
    metrics["stock_index_build_s"] = stock_build
    metrics["ours_index_build_s"] = ours_build
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal="ours >= 5x stock answers/s with 16 concurrent aquery calls",
        goal_met=metrics["throughput_ratio"] >= 5.0,
        chart=Chart(
            kind="bar",
            title=f"LlamaIndex query engine, {_LI_CONCURRENCY} concurrent aquery ({products} products)",
            ylabel="answers / s",
            labels=["stock HF + Faiss + HF LLM", f"gpuprompt ({backend})"],
            values=[metrics["stock_answers_per_s"], metrics["ours_answers_per_s"]],
        ),
        notes=(
            f"{products} products, top_k={top_k}, max_tokens={max_tokens}, greedy; our LLM backend: {backend}. "
            "Both stacks use the bundled all-MiniLM-L6-v2 and SmolLM2-135M-Instruct (stock HuggingFaceLLM in "
            "the model's own dtype via transformers; ours through LLMEngine). The stock HuggingFaceLLM has no "
            "native async: its aquery calls run one after another on the event loop. Index build times "
            "(embedding and indexing the catalogue, models already loaded) are reported beside the burst figures."
        ),
    )
