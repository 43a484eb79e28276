"""The e-commerce knowledge base as a LlamaIndex query engine and chat engine -- stock LlamaIndex
code, with only the embedding, vector store and LLM classes swapped for gpuprompt's.

The stock version of this script would import::

    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.llms.huggingface import HuggingFaceLLM
    from llama_index.vector_stores.faiss import FaissVectorStore

and build ``HuggingFaceEmbedding(model_name=...)``, ``FaissVectorStore(faiss_index=...)`` and
``HuggingFaceLLM(model_name=...)``. Everything below the three constructors is unchanged.

Run (offline, bundled models)::

    HF_HUB_OFFLINE=1 .venv/bin/python examples/llamaindex_query_engine.py --products 300
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from llama_index.core import Document, Settings, StorageContext, VectorStoreIndex
from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

from gpuprompt.apps.demo import SCRIPT, catalogue, customer_questions
from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptLLM, GPUPromptVectorStore

SYSTEM_PROMPT = (
    "You are a helpful shop assistant. Answer in one or two sentences, using only the product "
    "information you are given."
)


def build_index(products: int, backend: str, max_tokens: int) -> VectorStoreIndex:
    # --- the only lines that differ from a stock LlamaIndex app -----------------------------
    Settings.embed_model = GPUPromptEmbedding()  # bundled all-MiniLM-L6-v2, batched + cached
    Settings.llm = GPUPromptLLM(backend=backend, max_tokens=max_tokens, system_prompt=SYSTEM_PROMPT)
    Settings.tokenizer = Settings.llm.tokenize  # LlamaIndex packs chunks counting the model's own tokens
    vector_store = GPUPromptVectorStore()  # keeps text, filters, deletes, persists safely
    # -----------------------------------------------------------------------------------------
    documents = [Document(text=p["text"], metadata=p["metadata"], doc_id=p["id"]) for p in catalogue(products)]
    storage_context = StorageContext.from_defaults(vector_store=vector_store)
    return VectorStoreIndex.from_documents(documents, storage_context=storage_context)


async def serve_customers(index: VectorStoreIndex, customers: int) -> None:
    query_engine = index.as_query_engine(similarity_top_k=3)
    questions = customer_questions(customers)
    started = time.perf_counter()
    answers = await asyncio.gather(*(query_engine.aquery(q) for q in questions))
    elapsed = time.perf_counter() - started
    print(f"\n{customers} concurrent customers answered in {elapsed:.1f} s ({customers / elapsed:.2f} answers/s)")
    for question, answer in list(zip(questions, answers))[:4]:
        print(f"  Q: {question}\n  A: {str(answer).strip()}\n     (source: {answer.source_nodes[0].node.ref_doc_id})")


def chat(index: VectorStoreIndex) -> None:
    chat_engine = index.as_chat_engine(chat_mode="condense_plus_context", similarity_top_k=3)
    print("\nChat engine, one customer:")
    for turn in SCRIPT:
        reply = chat_engine.chat(turn)
        print(f"  customer: {turn}\n  shop:     {reply.response.strip()}")


def filtered_question(index: VectorStoreIndex) -> None:
    cheap_dresses = MetadataFilters(
        filters=[MetadataFilter(key="type", value="dress"), MetadataFilter(key="price", value=100, operator="<")]
    )
    engine = index.as_query_engine(similarity_top_k=3, filters=cheap_dresses)
    answer = engine.query("Which dress would you recommend for a summer wedding?")
    print("\nFiltered (dresses under 100 EUR):", str(answer).strip())
    print("  sources:", [(s.node.ref_doc_id, s.node.metadata["price"]) for s in answer.source_nodes])


def persist_and_reload(index: VectorStoreIndex) -> None:
    with tempfile.TemporaryDirectory() as folder:
        index.storage_context.persist(persist_dir=folder)
        reloaded = VectorStoreIndex.from_vector_store(GPUPromptVectorStore.from_persist_dir(folder))
        nodes = reloaded.as_retriever(similarity_top_k=1).retrieve("wool coat that does not shrink")
        print(f"\nReloaded from {folder}: top hit {nodes[0].node.ref_doc_id} (score {nodes[0].score:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=300, help="catalogue size")
    parser.add_argument("--customers", type=int, default=16, help="concurrent customer questions")
    parser.add_argument("--backend", default="auto", choices=["auto", "vllm", "transformers"])
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()

    started = time.perf_counter()
    index = build_index(args.products, args.backend, args.max_tokens)
    print(f"Indexed {args.products} products in {time.perf_counter() - started:.1f} s")
    asyncio.run(serve_customers(index, args.customers))
    chat(index)
    filtered_question(index)
    persist_and_reload(index)


if __name__ == "__main__":  # vLLM starts its engine core with spawn: keep the guard
    main()
