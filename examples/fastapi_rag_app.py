"""A small FastAPI RAG app that runs under ``uvicorn --workers 4``: the same LangChain code as in
process, with every gpuprompt class in remote mode (it reads ``GPUPROMPT_URL``), so the four
worker processes load no model and import no torch, and one ``gpuprompt serve`` batches all of
their requests together.

Run::

    gpuprompt serve --port 8000 &                      # holds the models once
    GPUPROMPT_URL=http://127.0.0.1:8000 uvicorn examples.fastapi_rag_app:app --workers 4 --port 8080
    curl -s localhost:8080/ask -H 'Content-Type: application/json' -d '{"question": "Is the dress red?"}'

The knowledge base is the server collection named by ``GPUPROMPT_COLLECTION`` (default ``kb``);
fill it once with ``POST /index`` (or with ``GPUPromptVectorStore(..., collection="kb").add_texts``
from any process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from pydantic import BaseModel

from langchain_gpuprompt import ChatGPUPrompt, GPUPromptEmbeddings, GPUPromptVectorStore

SYSTEM = "Answer in one sentence, using only these facts:\n{context}"
COLLECTION = os.environ.get("GPUPROMPT_COLLECTION", "kb")
MAX_TOKENS = int(os.environ.get("GPUPROMPT_MAX_TOKENS", "24"))


def build_chain(store: GPUPromptVectorStore, llm: ChatGPUPrompt):
    """retriever -> prompt -> chat model -> text: plain LCEL, the same in process and remote."""
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", "{question}")])

    def join(docs) -> str:
        return "\n".join(doc.page_content for doc in docs)

    retriever = store.as_retriever(search_kwargs={"k": 3})
    return {"context": retriever | join, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()


state: dict[str, Any] = {}


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Each worker builds its classes at start. Remote mode: base_url comes from GPUPROMPT_URL (and
    GPUPROMPT_API_KEY) in the environment, so nothing here loads a model."""
    store = GPUPromptVectorStore(GPUPromptEmbeddings(), collection=COLLECTION)
    state["store"] = store
    state["chain"] = build_chain(store, ChatGPUPrompt(max_tokens=MAX_TOKENS, temperature=0.0))
    yield
    state.clear()


app = FastAPI(title="RAG app on gpuprompt (remote mode)", lifespan=lifespan)
# Most questions one worker sends to the server at once (0: no limit). The test sets 1, so any server
# batch of two or more requests necessarily holds requests of different workers.
_LIMIT = int(os.environ.get("GPUPROMPT_APP_CONCURRENCY", "0"))
_gate = asyncio.Semaphore(_LIMIT) if _LIMIT > 0 else None
_in_flight = 0
_peak = 0


class Question(BaseModel):
    question: str


class Texts(BaseModel):
    texts: list[str]
    ids: list[str] | None = None


@contextlib.asynccontextmanager
async def _no_gate():
    yield


@app.post("/ask")
async def ask(body: Question) -> dict:
    """Answer one question; also says which worker answered and its peak of requests in flight."""
    global _in_flight, _peak
    async with _gate if _gate is not None else _no_gate():
        _in_flight += 1
        _peak = max(_peak, _in_flight)
        try:
            answer = await state["chain"].ainvoke(body.question)
        finally:
            _in_flight -= 1
    return {"answer": answer, "worker": os.getpid(), "peak_in_flight": _peak}


@app.post("/index")
async def index(body: Texts) -> dict:
    """Add texts to the knowledge base (embedded by the server's embedder)."""
    ids = await state["store"].aadd_texts(body.texts, ids=body.ids)
    return {"ids": ids}


@app.get("/worker")
async def worker() -> dict:
    """This worker's pid and whether it holds a model (it never should in remote mode)."""
    import sys

    await asyncio.sleep(0)
    return {"worker": os.getpid(), "torch_imported": "torch" in sys.modules, "peak_in_flight": _peak}
