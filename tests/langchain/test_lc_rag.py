"""An LCEL RAG chain (retriever | prompt | chat model | parser) end to end on the bundled models."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough

from gpuprompt.apps.demo import catalogue, customer_questions
from langchain_gpuprompt import ChatGPUPrompt, GPUPromptEmbeddings, GPUPromptVectorStore

PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "You are a helpful shop assistant. Answer in one sentence using only this product information:\n{context}"),
        ("human", "{question}"),
    ]
)


def _format(docs: list[Document]) -> str:
    return "\n".join(doc.page_content for doc in docs)


class _PromptRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.prompts: list[list[BaseMessage]] = []

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any) -> None:
        self.prompts.extend(messages)


class _InFlight:
    def __init__(self, engine: Any) -> None:
        self.original, self.now, self.peak = engine.agenerate, 0, 0

    async def __call__(self, request: Any, **options: Any) -> Any:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self.original(request, **options)
        finally:
            self.now -= 1


@pytest.fixture(scope="module")
def shop(lc_embeddings: GPUPromptEmbeddings) -> GPUPromptVectorStore:
    products = catalogue(300)
    return GPUPromptVectorStore.from_documents(
        [Document(id=p["id"], page_content=p["text"], metadata=p["metadata"]) for p in products], lc_embeddings
    )


def _chain(store: GPUPromptVectorStore, chat: ChatGPUPrompt, **search_kwargs: Any) -> Any:
    retriever = store.as_retriever(search_kwargs={"k": 2, **search_kwargs})
    return {"context": retriever | _format, "question": RunnablePassthrough()} | PROMPT | chat | StrOutputParser()


def test_rag_chain_batch_over_8_questions(shop: GPUPromptVectorStore, lc_chat: ChatGPUPrompt, monkeypatch: pytest.MonkeyPatch) -> None:
    questions = customer_questions(8)
    spy = _InFlight(lc_chat.engine)
    monkeypatch.setattr(lc_chat.engine, "agenerate", spy)
    recorder = _PromptRecorder()
    answers = _chain(shop, lc_chat).batch(questions, config={"callbacks": [recorder]})
    assert len(answers) == 8 and all(isinstance(a, str) and a.strip() for a in answers)
    assert spy.peak == 8  # the chat step sent the 8 prompts to the engine together
    # Each prompt carried the two products the retriever found for its own question.
    by_question = {p[-1].content: p[0].content for p in recorder.prompts}
    for question in questions:
        expected = _format(shop.similarity_search(question, k=2))
        assert expected in by_question[question]


async def test_rag_chain_abatch_with_a_metadata_filter(shop: GPUPromptVectorStore, lc_chat: ChatGPUPrompt) -> None:
    recorder = _PromptRecorder()
    questions = ["Do you have something in wool?", "What costs under 50 EUR?", "Anything red?", "Which one is linen?"]
    answers = await _chain(shop, lc_chat, filter={"type": "dress"}).abatch(questions, config={"callbacks": [recorder]})
    assert len(answers) == 4 and all(a.strip() for a in answers)
    for prompt in recorder.prompts:
        context_lines = prompt[0].content.split("information:\n", 1)[1].splitlines()
        assert len(context_lines) == 2 and all(" dress (SKU " in line for line in context_lines)
