"""Framework scenarios: whole LangChain / LlamaIndex apps with the stock classes vs ours, same
models, same run (``li-query``: a LlamaIndex query engine under 16 concurrent ``aquery`` calls)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from gpuprompt.apps.bench._load import Load, compare, in_thread, task_load, thread_load
from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario

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

    from gpuprompt.device import resolve_device
    from gpuprompt.models import resolve_chat_model, resolve_embedding_model

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


def _li_burst(engine: Any, questions: list[str]) -> Load:
    """All questions as concurrent ``aquery`` calls on one event loop: answers/s and latencies."""

    async def one(question: str) -> Any:
        response = await engine.aquery(question)
        if not str(response).strip() and not response.source_nodes:
            raise RuntimeError(f"empty response for {question!r}")
        return response

    return task_load(one, questions)


@scenario(
    "li-query",
    "LlamaIndex query engine over the e-commerce catalogue, 16 concurrent aquery calls: stock "
    "HuggingFaceEmbedding + FaissVectorStore + HuggingFaceLLM vs GPUPromptEmbedding + "
    "GPUPromptVectorStore + GPUPromptLLM, same models (bundled MiniLM and SmolLM2-135M-Instruct).",
)
def li_query(ctx: BenchContext) -> ScenarioResult:
    from llama_index.core import Document

    from gpuprompt._corpus import catalogue, customer_questions

    products, max_tokens, top_k = (200, 24, 2) if ctx.quick else (2000, 48, 3)
    documents = [Document(text=p["text"], metadata=p["metadata"], doc_id=p["id"]) for p in catalogue(products)]

    # Build times cover embedding and indexing the catalogue (the stock models load before).
    # The stock side's torch work runs on short-lived threads (see in_thread).
    stock_classes = _li_stock_classes(max_tokens)
    started = time.perf_counter()
    stock = in_thread(lambda: _li_engine(documents, *stock_classes, top_k=top_k))
    stock_build = time.perf_counter() - started
    our_classes = _li_our_classes(max_tokens)
    our_classes[0].embedder.load()
    started = time.perf_counter()
    ours = _li_engine(documents, *our_classes, top_k=top_k)
    ours_build = time.perf_counter() - started
    backend = our_classes[2].engine.backend_name  # loads the engine (outside the timed bursts)

    warm = customer_questions(2, seed=999)
    in_thread(lambda: _li_burst(stock, warm))
    _li_burst(ours, warm)
    run_id = iter(range(10**6))

    def measure() -> dict[str, float]:
        # New questions every run: neither stack may answer from a cache warmed by an earlier run.
        questions = customer_questions(_LI_CONCURRENCY, seed=1000 + next(run_id))
        return compare(in_thread(lambda: _li_burst(stock, questions)), _li_burst(ours, questions))

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
        ratio=metrics["throughput_ratio"],
        ratio_label=f"LlamaIndex query engine answers/s, {_LI_CONCURRENCY} concurrent aquery",
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


# ============================================================================ lc-retriever (LangChain)
_LC_CALLERS = 32


def _lc_stock_retriever(documents: list[Any], k: int) -> Any:
    """The stock LangChain retriever on the bundled embedder: HuggingFaceEmbeddings (normalised, so
    FAISS's default L2 ranks like cosine) and community FAISS, as in their docs."""
    from langchain_community.vectorstores import FAISS
    from langchain_huggingface import HuggingFaceEmbeddings

    from gpuprompt.device import resolve_device
    from gpuprompt.models import resolve_embedding_model

    embeddings = HuggingFaceEmbeddings(
        model_name=resolve_embedding_model(None),
        model_kwargs={"device": resolve_device("auto")},
        encode_kwargs={"normalize_embeddings": True},
    )
    return FAISS.from_documents(documents, embeddings).as_retriever(search_kwargs={"k": k})


def _lc_our_retriever(documents: list[Any], k: int) -> tuple[Any, Any]:
    from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptVectorStore

    embeddings = GPUPromptEmbeddings()
    store = GPUPromptVectorStore.from_documents(documents, embeddings)
    return store.as_retriever(search_kwargs={"k": k}), store


def _lc_threads(retriever: Any, questions: list[str], callers: int) -> tuple[dict[str, float], list[list[str]]]:
    """``callers`` threads, each calling ``retriever.invoke`` with one question at a time."""
    load = thread_load(lambda question: [doc.id for doc in retriever.invoke(question)], questions, callers)
    return {"qps": load.per_s, "p50_ms": load.p50_s * 1000, "p95_ms": load.p95_s * 1000}, load.results


def _lc_tasks(retriever: Any, questions: list[str], callers: int) -> float:
    """``callers`` asyncio tasks at a time calling ``retriever.ainvoke``; returns queries/s."""
    return task_load(retriever.ainvoke, questions, callers).per_s


@scenario(
    "lc-retriever",
    "LangChain retriever over the e-commerce catalogue under 32 concurrent callers (threads calling "
    "invoke, and asyncio tasks calling ainvoke), k=4: stock HuggingFaceEmbeddings + community FAISS vs "
    "GPUPromptEmbeddings + GPUPromptVectorStore, same bundled all-MiniLM-L6-v2.",
)
def lc_retriever(ctx: BenchContext) -> ScenarioResult:
    from langchain_core.documents import Document

    from gpuprompt._corpus import catalogue, customer_questions

    products, per_run, k = (500, 256, 4) if ctx.quick else (2000, 1024, 4)
    documents = [Document(id=p["id"], page_content=p["text"], metadata=p["metadata"]) for p in catalogue(products)]

    started = time.perf_counter()
    stock = in_thread(lambda: _lc_stock_retriever(documents, k))  # its torch work off the main thread
    stock_build = time.perf_counter() - started
    started = time.perf_counter()
    ours, store = _lc_our_retriever(documents, k)
    ours_build = time.perf_counter() - started

    # Same answers: both rank by cosine over the same model's vectors, exactly.
    check = customer_questions(32, seed=4242)
    _, stock_ids = _lc_threads(stock, check, _LC_CALLERS)
    _, our_ids = _lc_threads(ours, check, _LC_CALLERS)
    agreement = statistics.mean(len(set(a) & set(b)) / k for a, b in zip(stock_ids, our_ids))
    if agreement < 0.95:
        raise AssertionError(f"GPUPromptVectorStore disagrees with community FAISS: top-{k} overlap {agreement:.3f}")
    run_id = iter(range(10**6))

    def measure() -> dict[str, float]:
        # Fresh, distinct questions every run, so our embedding cache never answers from a warm-up.
        run = next(run_id)
        questions = [f"{q} (ticket {run}-{i})" for i, q in enumerate(customer_questions(per_run, seed=5000 + run))]
        asked = [f"{q} (async)" for q in questions[: per_run // 2]]
        stock_fig, _ = _lc_threads(stock, questions, _LC_CALLERS)
        batches = store.embeddings.embedder.stats().batcher
        ours_fig, _ = _lc_threads(ours, questions, _LC_CALLERS)
        after = store.embeddings.embedder.stats().batcher
        stock_async = _lc_tasks(stock, asked, _LC_CALLERS)
        ours_async = _lc_tasks(ours, asked, _LC_CALLERS)
        # The ceiling on this machine now: every question embedded and searched in one batched call.
        started = time.perf_counter()
        store.index.search(store.embeddings.embed_tensor([f"{q} (batch)" for q in questions]), k)
        ceiling = len(questions) / (time.perf_counter() - started)
        return {
            "stock_qps": stock_fig["qps"],
            "ours_qps": ours_fig["qps"],
            "throughput_ratio": ours_fig["qps"] / stock_fig["qps"],
            "stock_p50_ms": stock_fig["p50_ms"],
            "ours_p50_ms": ours_fig["p50_ms"],
            "stock_p95_ms": stock_fig["p95_ms"],
            "ours_p95_ms": ours_fig["p95_ms"],
            "stock_async_qps": stock_async,
            "ours_async_qps": ours_async,
            "async_ratio": ours_async / stock_async,
            "ours_mean_embed_batch": (after.items - batches.items) / max(1, after.batches - batches.batches),
            "ceiling_qps": ceiling,
            "ours_share_of_ceiling": ours_fig["qps"] / ceiling,
            "ceiling_ratio": ceiling / stock_fig["qps"],
        }

    metrics, runs = ctx.repeat(measure)
    metrics["topk_agreement"] = agreement
    metrics["stock_index_build_s"] = stock_build
    metrics["ours_index_build_s"] = ours_build
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal=f"ours >= 4x stock queries/s with {_LC_CALLERS} concurrent retriever.invoke callers",
        goal_met=metrics["throughput_ratio"] >= 4.0,
        ratio=metrics["throughput_ratio"],
        ratio_label=f"LangChain retriever queries/s, {_LC_CALLERS} concurrent invoke",
        chart=Chart(
            kind="bar",
            title=f"LangChain retriever.invoke, {_LC_CALLERS} threads ({products} products, k={k})",
            ylabel="queries / s",
            labels=["stock HF + FAISS", "gpuprompt", "ceiling (one batch)"],
            values=[metrics["stock_qps"], metrics["ours_qps"], metrics["ceiling_qps"]],
        ),
        notes=(
            f"{products} products, k={k}, {per_run} distinct questions per run ({per_run // 2} for the async "
            "burst); each retriever call embeds its question and searches. Stock: HuggingFaceEmbeddings "
            "(normalised) + community FAISS (IndexFlatL2), one model call per query; its ainvoke runs the sync "
            "search in the default thread pool. Ours: concurrent calls are coalesced into batched embedder "
            "forward passes and batched index searches. Top-k agreement with the stock retriever is checked "
            "before timing. ceiling_qps: all questions embedded and searched in one batched call, the most any "
            "concurrent front end can reach on this machine at this moment (ceiling_ratio = ceiling / stock)."
        ),
    )
