"""``rag-e2e`` and ``rag-rerank``: one LCEL RAG chain (retriever | prompt | chat model | parser) built
from the stock LangChain classes and from gpuprompt's, serving the same concurrent users on the same
models; ``rag-rerank`` retrieves 20, reranks them with a cross-encoder and keeps 4
(``ContextualCompressionRetriever`` over ``CrossEncoderReranker`` vs over ``GPUPromptReranker``)."""

from __future__ import annotations

from typing import Any

from gpuprompt.apps.bench._load import Load, compare, in_thread, thread_load
from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario

__all__: list[str] = []

_SYSTEM = (
    "You are a helpful customer-support assistant for an online clothing shop. Answer in one or two "
    "sentences using only these product facts:\n{context}"
)


def _chain(retriever: Any, llm: Any) -> Any:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough

    def format_docs(docs: list[Any]) -> str:
        return "\n".join(f"- {d.page_content}" for d in docs)

    prompt = ChatPromptTemplate.from_messages([("system", _SYSTEM), ("human", "{question}")])
    return {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()


_K = 4
_FETCH_K = 20


def _retriever(store: Any, compressor: Any | None) -> Any:
    """``k`` nearest, or ``_FETCH_K`` nearest reranked by ``compressor`` down to its ``top_n``."""
    if compressor is None:
        return store.as_retriever(search_kwargs={"k": _K})
    from langchain_classic.retrievers import ContextualCompressionRetriever

    return ContextualCompressionRetriever(base_compressor=compressor,
                                          base_retriever=store.as_retriever(search_kwargs={"k": _FETCH_K}))


def _stock_chain(texts: list[str], metadatas: list[dict], max_tokens: int, rerank_model: str | None = None) -> Any:
    """HuggingFaceEmbeddings + community FAISS + ChatHuggingFace over HuggingFacePipeline (and
    CrossEncoderReranker over HuggingFaceCrossEncoder when ``rerank_model`` is given)."""
    from langchain_community.vectorstores import FAISS
    from langchain_huggingface import ChatHuggingFace, HuggingFaceEmbeddings, HuggingFacePipeline

    from gpuprompt.device import resolve_device
    from gpuprompt.models import resolve_chat_model, resolve_embedding_model

    device = resolve_device("auto")
    embeddings = HuggingFaceEmbeddings(
        model_name=resolve_embedding_model(None),
        model_kwargs={"device": device},
        encode_kwargs={"normalize_embeddings": True},
    )
    store = FAISS.from_texts(texts, embeddings, metadatas=metadatas)
    folder = resolve_chat_model(None)
    pipeline = HuggingFacePipeline.from_model_id(
        model_id=folder,
        task="text-generation",
        device_map=device,
        pipeline_kwargs={"max_new_tokens": max_tokens, "do_sample": False, "return_full_text": False},
    )
    llm = ChatHuggingFace(llm=pipeline, model_id=folder)
    compressor = None
    if rerank_model is not None:
        from langchain_classic.retrievers.document_compressors import CrossEncoderReranker
        from langchain_community.cross_encoders import HuggingFaceCrossEncoder

        compressor = CrossEncoderReranker(
            model=HuggingFaceCrossEncoder(model_name=rerank_model, model_kwargs={"device": device}), top_n=_K)
    return _chain(_retriever(store, compressor), llm)


def _our_chain(texts: list[str], metadatas: list[dict], max_tokens: int, rerank_model: str | None = None) -> Any:
    from langchain_gpuprompt import ChatGPUPrompt, GPUPromptEmbeddings, GPUPromptReranker, GPUPromptVectorStore

    embeddings = GPUPromptEmbeddings()
    store = GPUPromptVectorStore.from_texts(texts, embeddings, metadatas=metadatas)
    llm = ChatGPUPrompt(max_tokens=max_tokens)
    compressor = None if rerank_model is None else GPUPromptReranker(model=rerank_model, top_n=_K)
    return _chain(_retriever(store, compressor), llm)


def _users(chain: Any, questions: list[str]) -> Load:
    """One thread per user, each calling ``chain.invoke`` (the stock ChatHuggingFace over a local
    pipeline has no async path, so both stacks are driven the same, synchronous way)."""
    return thread_load(chain.invoke, questions, len(questions))


def _run(ctx: BenchContext, rerank_model: str | None) -> tuple[dict[str, float], list[dict[str, float]], int, int, int]:
    """(median metrics, runs, products, users, new tokens) of the stock chain vs ours."""
    from gpuprompt._corpus import catalogue, customer_questions

    products, users, max_tokens = (500, 8, 32) if ctx.quick else (2000, 16, 64)
    items = catalogue(products)
    texts = [p["text"] for p in items]
    metadatas = [p["metadata"] for p in items]
    # the stock side's torch work off the main thread
    stock = in_thread(lambda: _stock_chain(texts, metadatas, max_tokens, rerank_model))
    ours = _our_chain(texts, metadatas, max_tokens, rerank_model)
    warm = customer_questions(2, seed=99)
    stock.batch(warm)
    ours.batch(warm)
    run_id = iter(range(10**6))

    def measure() -> dict[str, float]:
        questions = customer_questions(users, seed=1000 + next(run_id))
        return compare(_users(stock, questions), _users(ours, questions))

    metrics, runs = ctx.repeat(measure)
    return metrics, runs, products, users, max_tokens


@scenario(
    "rag-e2e",
    "The same LCEL RAG chain (retriever | prompt | chat model | parser) over the product catalogue, "
    "16 concurrent users: stock HuggingFaceEmbeddings + community FAISS + ChatHuggingFace vs "
    "GPUPromptEmbeddings + GPUPromptVectorStore + ChatGPUPrompt, same bundled models.",
)
def rag_e2e(ctx: BenchContext) -> ScenarioResult:
    metrics, runs, products, users, max_tokens = _run(ctx, None)
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal=f"ours >= 4x stock answers/s and p95 <= 0.5x stock, {users} concurrent users",
        goal_met=metrics["throughput_ratio"] >= 4.0 and metrics["p95_ratio"] <= 0.5,
        ratio=metrics["throughput_ratio"],
        ratio_label=f"LCEL RAG chain answers/s, {users} concurrent users",
        chart=Chart(
            kind="bar",
            title=f"LCEL RAG chain, {users} concurrent users ({max_tokens} new tokens)",
            ylabel="answers / second",
            labels=["stock LangChain classes", "gpuprompt classes"],
            values=[metrics["stock_answers_per_s"], metrics["ours_answers_per_s"]],
        ),
        notes=f"{products} products, k={_K}, greedy decoding, {max_tokens} new tokens per answer.",
    )


@scenario(
    "rag-rerank",
    "rag-e2e with a rerank stage: retrieve 20, rerank with a cross-encoder, keep 4 "
    "(ContextualCompressionRetriever over CrossEncoderReranker(HuggingFaceCrossEncoder) vs over "
    "GPUPromptReranker), 16 concurrent users, same bundled models and cross-encoder.",
)
def rag_rerank(ctx: BenchContext) -> ScenarioResult:
    from gpuprompt.apps.bench.rerank import model_path

    metrics, runs, products, users, max_tokens = _run(ctx, model_path())
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal=f"ours >= 6x stock answers/s, {users} concurrent users, retrieve {_FETCH_K} -> rerank -> {_K}",
        goal_met=metrics["throughput_ratio"] >= 6.0,
        ratio=metrics["throughput_ratio"],
        ratio_label=f"LCEL RAG chain with a rerank stage, answers/s, {users} concurrent users",
        chart=Chart(
            kind="bar",
            title=f"LCEL RAG chain + rerank ({_FETCH_K} -> {_K}), {users} users ({max_tokens} new tokens)",
            ylabel="answers / second",
            labels=["stock (CrossEncoderReranker)", "gpuprompt (GPUPromptReranker)"],
            values=[metrics["stock_answers_per_s"], metrics["ours_answers_per_s"]],
        ),
        notes=(f"{products} products, retrieve {_FETCH_K}, rerank to {_K}, greedy decoding, {max_tokens} new "
               f"tokens per answer; cross-encoder: $GPUPROMPT_BENCH_RERANK_MODEL or the random-head MiniLM-L6."),
    )
