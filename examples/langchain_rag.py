"""The e-commerce support chain in stock LangChain style, with only the imports (and the three
constructors) changed to gpuprompt's.

The stock version of this script would import::

    from langchain_community.vectorstores import FAISS
    from langchain_huggingface import ChatHuggingFace, HuggingFaceEmbeddings, HuggingFacePipeline

and build ``HuggingFaceEmbeddings(model_name=...)``, ``FAISS.from_documents(...)`` and
``ChatHuggingFace(llm=HuggingFacePipeline.from_model_id(...))``. Everything else -- the retriever,
the prompt, the LCEL chain, ``batch``/``abatch``, ``RunnableWithMessageHistory``, saving and
loading the index -- is unchanged LangChain code.

Run (offline, bundled models)::

    HF_HUB_OFFLINE=1 .venv/bin/python examples/langchain_rag.py --products 500 --customers 16
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnablePassthrough
from langchain_core.runnables.history import RunnableWithMessageHistory

from gpuprompt.apps.demo import SCRIPT, catalogue, customer_questions
from langchain_gpuprompt import ChatGPUPrompt, GPUPromptChatMessageHistory, GPUPromptEmbeddings, GPUPromptVectorStore

SYSTEM = (
    "You are a helpful shop assistant. Answer in one or two sentences, using only this product "
    "information:\n{context}"
)


def format_docs(docs: list[Document]) -> str:
    return "\n".join(doc.page_content for doc in docs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=500)
    parser.add_argument("--customers", type=int, default=16)
    parser.add_argument("--backend", default="auto", choices=["auto", "vllm", "transformers"])
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()

    # --- the only lines that differ from a stock LangChain app ---------------------------------
    embeddings = GPUPromptEmbeddings()  # bundled all-MiniLM-L6-v2, batched across callers + cached
    llm = ChatGPUPrompt(backend=args.backend, max_tokens=args.max_tokens)  # bundled SmolLM2-135M-Instruct
    documents = [Document(id=p["id"], page_content=p["text"], metadata=p["metadata"]) for p in catalogue(args.products)]
    started = time.perf_counter()
    vectorstore = GPUPromptVectorStore.from_documents(documents, embeddings)
    # ---------------------------------------------------------------------------------------------
    print(f"indexed {len(documents)} products in {time.perf_counter() - started:.1f} s")

    retriever = vectorstore.as_retriever(search_kwargs={"k": 3})
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", "{question}")])
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()

    # A burst of concurrent customers: batch() sends every question through the chain at once.
    questions = customer_questions(args.customers)
    chain.invoke(questions[0])  # warm-up: loads the models
    started = time.perf_counter()
    answers = chain.batch(questions)
    elapsed = time.perf_counter() - started
    print(f"\n{len(questions)} customers answered in {elapsed:.1f} s ({len(questions) / elapsed:.2f} answers/s)")
    for question, answer in list(zip(questions, answers))[:4]:
        print(f"  Q: {question}\n  A: {answer.strip()}")

    # The same chain from async code.
    started = time.perf_counter()
    answers = asyncio.run(chain.abatch(customer_questions(args.customers, seed=12)))
    print(f"abatch: {len(answers)} answers in {time.perf_counter() - started:.1f} s")

    # Metadata filters, MMR and relevance thresholds through the standard retriever API.
    dresses = vectorstore.as_retriever(search_kwargs={"k": 3, "filter": {"type": "dress", "price": {"$lt": 100}}})
    print("\ndresses under 100 EUR closest to 'a red dress for a summer wedding':")
    for doc in dresses.invoke("a red dress for a summer wedding"):
        print(f"  {doc.page_content}")
    varied = vectorstore.as_retriever(search_type="mmr", search_kwargs={"k": 3, "fetch_k": 20})
    print("\nthree varied answers to 'a warm wool sweater' (MMR):")
    for doc in varied.invoke("a warm wool sweater"):
        print(f"  {doc.page_content}")
    close = vectorstore.as_retriever(
        search_type="similarity_score_threshold", search_kwargs={"k": 3, "score_threshold": 0.5}
    )
    print(f"\nproducts with relevance >= 0.5 to 'linen shorts': {len(close.invoke('linen shorts'))}")

    # A multi-turn conversation with history.
    chat_prompt = ChatPromptTemplate.from_messages(
        [("system", SYSTEM), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    rag_chat = RunnableWithMessageHistory(
        RunnablePassthrough.assign(context=lambda x: format_docs(retriever.invoke(x["question"])))
        | chat_prompt
        | llm
        | StrOutputParser(),
        lambda session_id: GPUPromptChatMessageHistory(session_id=session_id),
        input_messages_key="question",
        history_messages_key="history",
    )
    print("\nconversation:")
    for turn in SCRIPT:
        reply = rag_chat.invoke({"question": turn}, config={"configurable": {"session_id": "customer-1"}})
        print(f"  customer: {turn}\n  assistant: {reply.strip()}")

    # Save and load the index: no pickle, so no allow_dangerous_deserialization needed.
    with tempfile.TemporaryDirectory() as folder:
        vectorstore.save_local(folder)
        reloaded = GPUPromptVectorStore.load_local(folder, embeddings)
        print(f"\nreloaded index: {len(reloaded.index)} products, top hit for 'wool coat': "
              f"{reloaded.similarity_search('wool coat', k=1)[0].id}")


if __name__ == "__main__":  # a real entry point: vLLM starts its engine core with spawn
    main()
