"""Hostile input at the LangChain adapters' public methods: every refusal is a typed gpuprompt
error naming the argument, and nothing already stored changes.

Covers the reliability issue: path traversal through ``save_local`` / ``load_local``'s
``index_name``, silent coercions (non-dict metadata, str or bool "numbers" in embeddings, a bare str
embedded character by character, a str namespace taken label by character), builtin exceptions on
odd values (None, wrong types, extreme numbers, odd unicode, deep or cyclic values, malformed
filters) across the vector store, embeddings, LangGraph store, cache and chat history, and a property
test: random metadata either round-trips exactly or is refused with the store unchanged.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import date
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage
from langchain_core.outputs import Generation
from langgraph.store.base import GetOp, InvalidNamespaceError, ListNamespacesOp, MatchCondition, PutOp, SearchOp

from gpuprompt import ContextCache
from gpuprompt.errors import ConfigurationError, FilterError, GPUPromptError, InputTypeError, InvalidInputError
from langchain_gpuprompt import (
    GPUPromptChatMessageHistory,
    GPUPromptEmbeddings,
    GPUPromptSemanticCache,
    GPUPromptStore,
    GPUPromptVectorStore,
)

TEXTS = ["red summer dress", "blue denim jeans", "leather hiking boots", "steel water bottle", "wool winter coat"]
DIM = 384


def _state(store: GPUPromptVectorStore) -> list[tuple[str, str | None, dict]]:
    index = store.index
    if index is None:
        return []
    return sorted((r.id, r.document, r.metadata) for r in index.get(index.ids()))


@pytest.fixture
def store(lc_embeddings: GPUPromptEmbeddings) -> GPUPromptVectorStore:
    store = GPUPromptVectorStore(lc_embeddings)
    store.add_texts(TEXTS, [{"i": i, "colour": ["red", "blue"][i % 2]} for i in range(len(TEXTS))], ids=list("abcde"))
    return store


def _cyclic() -> dict:
    value: dict = {"a": 1}
    value["self"] = value
    return value


def _deep(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"d": value}
    return value


def _ids(values: list) -> list[str]:
    return [f"case{i}" for i in range(len(values))]


# ----------------------------------------------------------------------------- vector store: writes
BAD_METADATAS = [
    (["not a dict"], InputTypeError, r"'metadatas\[0\]' must be a dict"),
    ([[("a", 1)]], InputTypeError, r"'metadatas\[0\]' must be a dict"),
    ([5], InputTypeError, r"'metadatas\[0\]' must be a dict"),
    ({"a": 1}, InputTypeError, "'metadatas' must be a list"),
    ("metadata", InputTypeError, "'metadatas' must be a list"),
    ([{"a": math.nan}], InvalidInputError, r"'metadatas\[0\]\.a'"),
    ([{"a": -math.inf}], InvalidInputError, r"'metadatas\[0\]\.a'"),
    ([{"a": 2**63}], InvalidInputError, r"'metadatas\[0\]\.a'"),
    ([{"a": "lone \udc00"}], InvalidInputError, r"'metadatas\[0\]\.a'"),
    ([{"k\ud800": 1}], InvalidInputError, r"'metadatas\[0\]"),
    ([{1: "a"}], InvalidInputError, r"'metadatas\[0\]' must have str keys"),
    ([{"a": object()}], InputTypeError, r"'metadatas\[0\]\.a'"),
    ([{"a": b"bytes"}], InputTypeError, r"'metadatas\[0\]\.a'"),
    ([{"a": {1, 2}}], InputTypeError, r"'metadatas\[0\]\.a'"),
    ([{"a": date(2020, 1, 1)}], InputTypeError, r"'metadatas\[0\]\.a'"),
    ([_cyclic()], InvalidInputError, r"'metadatas\[0\]\.self' must not contain itself"),
    ([_deep(40)], InvalidInputError, "nested at most"),
    ([_deep(5000)], InvalidInputError, "nested at most"),
    ([{}, {}], InvalidInputError, "one entry per text"),
]


@pytest.mark.parametrize(("metadatas", "error", "match"), BAD_METADATAS, ids=_ids(BAD_METADATAS))
async def test_bad_metadatas_are_typed_and_store_nothing(store, metadatas, error, match) -> None:
    before = _state(store)
    with pytest.raises(error, match=match):
        store.add_texts(["new text"], metadatas, ids=["new"])
    with pytest.raises(error, match=match):
        await store.aadd_texts(["new text"], metadatas, ids=["new"])
    assert _state(store) == before


@pytest.mark.parametrize(
    ("metadata", "error"),
    [
        ("not a dict", InputTypeError),
        ([("a", 1)], InputTypeError),
        ({"a": object()}, InputTypeError),
        (_cyclic(), InvalidInputError),
    ],
    ids=["str", "pairs", "object", "cycle"],
)
async def test_documents_with_odd_metadata_are_typed(store, metadata, error) -> None:
    before = _state(store)
    document = Document(page_content="new", id="new")
    object.__setattr__(document, "__dict__", {**document.__dict__, "metadata": metadata})
    with pytest.raises(error, match=r"'metadatas\[1\]"):
        store.add_documents([Document(page_content="fine", id="fine"), document])
    with pytest.raises(error, match=r"'metadatas\[0\]"):
        await store.aadd_documents([document])
    with pytest.raises(error, match=r"'metadatas\[0\]"):
        GPUPromptVectorStore.from_documents([document], store.embeddings)
    assert _state(store) == before


BAD_TEXTS_AND_IDS = [
    ({"texts": "just one"}, InputTypeError, "'texts' must be a list of str"),
    ({"texts": b"bytes"}, InputTypeError, "'texts'"),
    ({"texts": None}, InputTypeError, "'texts'"),
    ({"texts": 5}, InputTypeError, "'texts'"),
    ({"texts": {"a": "b"}}, InputTypeError, "'texts'"),
    ({"texts": ["ok", None]}, InputTypeError, r"'texts\[1\]'"),
    ({"texts": ["lone \ud800"]}, InvalidInputError, r"'texts\[0\]'"),
    ({"texts": ["x"], "ids": "x"}, InputTypeError, "'ids'"),
    ({"texts": ["x"], "ids": [5]}, InputTypeError, r"'ids\[0\]'"),
    ({"texts": ["x"], "ids": [""]}, InvalidInputError, r"'ids\[0\]'"),
    ({"texts": ["x"], "ids": ["\ud800"]}, InvalidInputError, r"'ids\[0\]'"),
    ({"texts": ["x"], "ids": ["a", "b"]}, InvalidInputError, "one entry per text"),
    ({"texts": ["x"], "ids": 5}, InputTypeError, "'ids'"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD_TEXTS_AND_IDS, ids=_ids(BAD_TEXTS_AND_IDS))
def test_bad_texts_and_ids_are_typed_and_store_nothing(store, kwargs, error, match) -> None:
    before = _state(store)
    texts = kwargs.pop("texts")
    with pytest.raises(error, match=match):
        store.add_texts(texts, **kwargs)
    assert _state(store) == before


def test_iterables_and_tuples_are_accepted(store) -> None:
    ids = store.add_texts((t for t in ["gen one", "gen two"]), ({"n": n} for n in range(2)), ids=("g1", "g2"))
    assert ids == ["g1", "g2"]
    assert [d.metadata for d in store.get_by_ids(["g1", "g2"])] == [{"n": 0}, {"n": 1}]


def test_metadata_is_copied_at_the_boundary(store) -> None:
    metadata = {"tags": ["a"]}
    store.add_texts(["copied"], [metadata], ids=["copy"])
    metadata["tags"].append("changed later")
    assert store.get_by_ids(["copy"])[0].metadata == {"tags": ["a"]}


# ----------------------------------------------------------------------------- vector store: reads
BAD_VECTORS = [
    (["1"] * DIM, InputTypeError),
    ([True] * DIM, InputTypeError),
    ([[0.1] * DIM], InputTypeError),
    ([[0.1] * DIM, [0.1]], InputTypeError),
    ("abc", InputTypeError),
    (None, InputTypeError),
    ({"a": 1.0}, InputTypeError),
    ([object()] * DIM, InputTypeError),
    ([math.nan] * DIM, InvalidInputError),
    ([1e39] * DIM, InvalidInputError),
    ([0.1] * 3, InvalidInputError),
    (5, InputTypeError),
]


@pytest.mark.parametrize(("embedding", "error"), BAD_VECTORS, ids=_ids(BAD_VECTORS))
async def test_bad_query_vectors_are_typed(store, embedding, error) -> None:
    with pytest.raises(error):
        store.similarity_search_by_vector(embedding)
    with pytest.raises(error):
        await store.asimilarity_search_by_vector(embedding)
    with pytest.raises(error):
        store.max_marginal_relevance_search_by_vector(embedding)
    with pytest.raises(error):
        await store.amax_marginal_relevance_search_by_vector(embedding)


@pytest.mark.parametrize("k", [0, -1, True, 1.5, None, "3", -(2**70)], ids=repr)
async def test_bad_k_is_typed(store, k) -> None:
    with pytest.raises(InvalidInputError, match="'k'"):
        store.similarity_search("dress", k=k)
    with pytest.raises(InvalidInputError, match="'k'"):
        await store.asimilarity_search("dress", k=k)
    with pytest.raises(InvalidInputError, match="'k'"):
        store.max_marginal_relevance_search("dress", k=k)


@pytest.mark.parametrize("k", [1, 5, 10**30, 2**63 - 1], ids=repr)
async def test_extreme_k_gives_every_match(store, k) -> None:
    assert len(store.similarity_search("dress", k=k)) == min(k, 5)
    assert len(await store.asimilarity_search("dress", k=k)) == min(k, 5)
    assert len(store.max_marginal_relevance_search("dress", k=k, fetch_k=max(k, 20))) == min(k, 5)
    assert len(store.similarity_search("dress", k=k, filter={"colour": "red"})) == min(k, 3)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"fetch_k": 0}, "fetch_k"),
        ({"fetch_k": -1}, "fetch_k"),
        ({"fetch_k": True}, "fetch_k"),
        ({"fetch_k": None}, "fetch_k"),
        ({"fetch_k": 2.5}, "fetch_k"),
        ({"lambda_mult": math.nan}, "lambda_mult"),
        ({"lambda_mult": 2}, "lambda_mult"),
        ({"lambda_mult": -0.5}, "lambda_mult"),
        ({"lambda_mult": True}, "lambda_mult"),
        ({"lambda_mult": None}, "lambda_mult"),
        ({"lambda_mult": "0.5"}, "lambda_mult"),
    ],
    ids=repr,
)
async def test_bad_mmr_options_are_typed(store, kwargs, name) -> None:
    with pytest.raises(InvalidInputError, match=f"'{name}'"):
        store.max_marginal_relevance_search("dress", k=2, **kwargs)
    with pytest.raises(InvalidInputError, match=f"'{name}'"):
        await store.amax_marginal_relevance_search("dress", k=2, **kwargs)


def test_fetch_k_smaller_than_k_still_returns_k(store) -> None:
    assert len(store.max_marginal_relevance_search("dress", k=4, fetch_k=1)) == 4


def _cyclic_filter() -> dict:
    node: dict = {"colour": "red"}
    node["$and"] = [node]
    return node


def _deep_filter(depth: int) -> dict:
    node: dict = {"colour": "red"}
    for _ in range(depth):
        node = {"$not": node}
    return node


BAD_FILTERS = [
    [1],
    "colour == red",
    5,
    {"colour": {"$regex": "r.*"}},
    {"$and": "x"},
    {"$or": []},
    {"$where": "1"},
    {1: "a"},
    {"colour": object()},
    {"colour": math.nan},
    {"colour": {"$in": "red"}},
    {"colour": {}},
    _deep_filter(40),
    _deep_filter(5000),
    _cyclic_filter(),
]


@pytest.mark.parametrize("filter", BAD_FILTERS, ids=_ids(BAD_FILTERS))
async def test_malformed_filters_are_filter_errors(store, filter) -> None:
    with pytest.raises(FilterError):
        store.similarity_search("dress", k=2, filter=filter)
    with pytest.raises(FilterError):
        await store.asimilarity_search("dress", k=2, filter=filter)
    with pytest.raises(FilterError):
        store.max_marginal_relevance_search("dress", k=2, filter=filter)


@pytest.mark.parametrize("filter", [{"i": {"$gt": 2**64}}, {"colour\ud800": "red"}, {"i": {"$in": []}}], ids=repr)
def test_odd_filters_are_refused_or_answered(store, filter) -> None:
    # The core decides whether these are malformed; either way it is typed or a correct answer.
    try:
        found = store.similarity_search("dress", k=5, filter=filter)
    except FilterError:
        return
    assert found == []


@pytest.mark.parametrize(
    ("query", "error"),
    [
        (None, InputTypeError),
        (5, InputTypeError),
        (b"dress", InputTypeError),
        (["dress"], InputTypeError),
        ("\ud800", InvalidInputError),
    ],
    ids=repr,
)
async def test_bad_queries_are_typed(store, query, error) -> None:
    with pytest.raises(error, match="'query'"):
        store.similarity_search(query)
    with pytest.raises(error, match="'query'"):
        await store.asimilarity_search(query)
    with pytest.raises(error, match="'query'"):
        store.max_marginal_relevance_search(query)
    with pytest.raises(error, match="'query'"):
        store.similarity_search_with_relevance_scores(query)


@pytest.mark.parametrize("query", ["", " ", "e\u0301", "\U0001f600", "\u202eevil", "\x00", "dress " * 2000])
def test_odd_but_valid_unicode_queries_answer(store, query) -> None:
    assert len(store.similarity_search(query, k=2)) == 2


@pytest.mark.parametrize("threshold", [math.nan, math.inf, "0.5", True], ids=repr)
async def test_bad_score_threshold_is_typed(store, threshold) -> None:
    with pytest.raises(InvalidInputError, match="'score_threshold'"):
        store.similarity_search_with_relevance_scores("dress", score_threshold=threshold)
    with pytest.raises(InvalidInputError, match="'score_threshold'"):
        await store.asimilarity_search_with_relevance_scores("dress", score_threshold=threshold)
    assert len(store.similarity_search_with_relevance_scores("dress", k=2, score_threshold=0.0)) == 2


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda s: s.delete("a"), InputTypeError, "'ids'"),
        (lambda s: s.delete(5), InputTypeError, "'ids'"),
        (lambda s: s.delete([None]), InputTypeError, r"'ids\[0\]'"),
        (lambda s: s.delete(["\ud800"]), InvalidInputError, r"'ids\[0\]'"),
        (lambda s: s.delete(["a"], cascade=True), InvalidInputError, "unexpected keyword"),
        (lambda s: s.get_by_ids(None), InputTypeError, "'ids'"),
        (lambda s: s.get_by_ids("a"), InputTypeError, "'ids'"),
        (lambda s: s.get_by_ids([1]), InputTypeError, r"'ids\[0\]'"),
        (lambda s: s.similarity_search("x", k=2, fliter={}), InvalidInputError, "unexpected search keyword"),
    ],
    ids=[f"call{i}" for i in range(9)],
)
def test_odd_arguments_elsewhere_are_typed_and_change_nothing(store, call, error, match) -> None:
    before = _state(store)
    with pytest.raises(error, match=match):
        call(store)
    assert _state(store) == before


# ----------------------------------------------------------------------------- persistence paths
BAD_NAMES = [
    ("../escape", InvalidInputError),
    ("..", InvalidInputError),
    (".", InvalidInputError),
    ("", InvalidInputError),
    ("a/b", InvalidInputError),
    ("a\\b", InvalidInputError),
    ("/tmp/escape", InvalidInputError),
    ("x\x00y", InvalidInputError),
    ("\ud800", InvalidInputError),
    (None, InputTypeError),
    (5, InputTypeError),
]


@pytest.mark.parametrize(("name", "error"), BAD_NAMES, ids=repr)
def test_index_name_cannot_leave_the_folder(store, tmp_path, name, error) -> None:
    folder = tmp_path / "kb"
    store.save_local(folder)
    store.save_local(tmp_path, index_name="escape")  # what "../escape" would otherwise read
    before = sorted(p.name for p in tmp_path.parent.iterdir())
    with pytest.raises(error, match="'index_name'"):
        store.save_local(folder, index_name=name)
    with pytest.raises(error, match="'index_name'"):
        GPUPromptVectorStore.load_local(folder, store.embeddings, index_name=name)
    assert sorted(p.name for p in tmp_path.parent.iterdir()) == before
    assert [p.name for p in folder.iterdir() if not p.name.startswith(".")] == ["index"]  # (and a lock file)


@pytest.mark.parametrize(
    ("folder", "error"),
    [
        (None, InputTypeError),
        (5, InputTypeError),
        ("", InvalidInputError),
        ("a\x00", InvalidInputError),
        ("\ud800", InvalidInputError),
    ],
    ids=repr,
)
def test_folder_path_is_checked(store, folder, error) -> None:
    with pytest.raises(error, match="'folder_path'"):
        store.save_local(folder)
    with pytest.raises(error, match="'folder_path'"):
        GPUPromptVectorStore.load_local(folder, store.embeddings)


def test_a_unique_escape_name_is_never_written(store, tmp_path) -> None:
    name = f"escape-{uuid.uuid4().hex}"
    with pytest.raises(InvalidInputError):
        store.save_local(tmp_path / "kb", index_name=f"../{name}")
    assert not (tmp_path / name).exists()
    store.save_local(tmp_path / "kb", index_name=name)  # a plain name is fine
    assert _state(GPUPromptVectorStore.load_local(tmp_path / "kb", store.embeddings, index_name=name)) == _state(store)


# ----------------------------------------------------------------------------- embeddings
async def test_embeddings_refuse_a_bare_str(lc_embeddings) -> None:
    with pytest.raises(InputTypeError, match="wrap it in a list"):
        lc_embeddings.embed_documents("abc")
    with pytest.raises(InputTypeError, match="wrap it in a list"):
        await lc_embeddings.aembed_documents("abc")
    assert len(lc_embeddings.embed_documents(["abc"])) == 1


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda e: e.embed_documents(None), InputTypeError, "'texts'"),
        (lambda e: e.embed_documents([None]), InputTypeError, r"'texts\[0\]'"),
        (lambda e: e.embed_documents(["\ud800"]), InvalidInputError, r"'texts\[0\]'"),
        (lambda e: e.embed_documents({"a": 1}), InputTypeError, "'texts'"),
        (lambda e: e.embed_query(None), InputTypeError, "'text'"),
        (lambda e: e.embed_query(["a"]), InputTypeError, "'text'"),
        (lambda e: e.embed_query("\udfff"), InvalidInputError, "'text'"),
    ],
    ids=[f"call{i}" for i in range(7)],
)
def test_embedding_refusals_are_typed(lc_embeddings, call, error, match) -> None:
    with pytest.raises(error, match=match):
        call(lc_embeddings)


# ----------------------------------------------------------------------------- chat history
@pytest.fixture
def history(lc_embeddings) -> GPUPromptChatMessageHistory:
    history = GPUPromptChatMessageHistory(f"s-{uuid.uuid4().hex}", context_cache=ContextCache(lc_embeddings.embedder))
    history.add_messages([HumanMessage("kept question"), AIMessage("kept answer")])
    return history


BAD_MESSAGES = [
    (None, InputTypeError, "'messages'"),
    ("hello", InputTypeError, "'messages'"),
    (HumanMessage("bare"), InputTypeError, "'messages'"),
    ([None], InputTypeError, r"'messages\[0\]'"),
    ([HumanMessage("ok"), {"role": "user", "content": "x"}], InputTypeError, r"'messages\[1\]'"),
    ([("user", "x")], InputTypeError, r"'messages\[0\]'"),
    ([HumanMessage("ok"), HumanMessage("lone \ud800")], InvalidInputError, r"'messages\[1\]\.content'"),
    ([HumanMessage(content=[{"type": "image_url", "image_url": {"url": "x"}}])], InvalidInputError, r"'messages\[0\]'"),
    ([ChatMessage(role="robot", content="x")], InvalidInputError, r"'messages\[0\]'"),
]


@pytest.mark.parametrize(("messages", "error", "match"), BAD_MESSAGES, ids=_ids(BAD_MESSAGES))
async def test_add_messages_refusals_store_nothing(history, messages, error, match) -> None:
    with pytest.raises(error, match=match):
        history.add_messages(messages)
    with pytest.raises(error, match=match):
        await history.aadd_messages(messages)
    assert [m.content for m in history.messages] == ["kept question", "kept answer"]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda h: h.add_user_message(5), InputTypeError, "'message'"),
        (lambda h: h.add_user_message(None), InputTypeError, "'message'"),
        (lambda h: h.add_ai_message(["x"]), InputTypeError, "'message'"),
        (lambda h: h.add_user_message("lone \ud800"), InvalidInputError, "content"),
        (lambda h: h.relevant_messages("x", k=True), InvalidInputError, "'k'"),
        (lambda h: h.relevant_messages("x", k=-1), InvalidInputError, "'k'"),
        (lambda h: h.relevant_messages("x", k=10**30), InvalidInputError, "'k'"),
        (lambda h: h.relevant_messages("x", k="2"), InvalidInputError, "'k'"),
        (lambda h: h.relevant_messages("x", k=None), InvalidInputError, "'k'"),
        (lambda h: h.relevant_messages(None), InputTypeError, "'query'"),
        (lambda h: h.relevant_messages("\ud800"), InvalidInputError, "'query'"),
    ],
    ids=[f"call{i}" for i in range(11)],
)
def test_other_history_refusals_store_nothing(history, call, error, match) -> None:
    with pytest.raises(error, match=match):
        call(history)
    assert [m.content for m in history.messages] == ["kept question", "kept answer"]


def test_history_takes_str_and_messages_and_odd_valid_unicode(history) -> None:
    history.add_user_message("e\u0301 \U0001f600")
    history.add_ai_message(AIMessage("answer"))
    history.add_messages([SystemMessage("\u202esystem")])
    assert [m.content for m in history.messages][2:] == ["e\u0301 \U0001f600", "answer", "\u202esystem"]
    assert len(history.relevant_messages("question", k=0)) == 0
    assert len(history.relevant_messages("question", k=2**62)) == 5


@pytest.mark.parametrize("session_id", [None, 5, "", "\ud800"], ids=repr)
def test_bad_session_ids(session_id) -> None:
    with pytest.raises(InvalidInputError, match="'session_id'"):
        GPUPromptChatMessageHistory(session_id)


# ----------------------------------------------------------------------------- LangGraph store
@pytest.fixture
def kv(lc_embeddings) -> GPUPromptStore:
    store = GPUPromptStore(index={"embed": lc_embeddings, "fields": ["text"]})
    store.put(("users", "1"), "a", {"text": "likes red dresses", "n": 1})
    store.put(("users", "2"), "b", {"text": "lives in Oslo", "n": 2})
    store.put(("docs",), "c", {"text": "unindexed"}, index=False)
    return store


def _kv_state(store: GPUPromptStore) -> tuple:
    items = sorted(
        (namespace, key, json.dumps(entry.item.value, sort_keys=True), tuple(entry.record_ids))
        for namespace, keys in store._data.items()
        for key, entry in keys.items()
    )
    index = store._vectors.index
    return items, sorted(index.ids()) if index is not None else []


BAD_NAMESPACES = [
    ((), InvalidInputError),
    ("users", InputTypeError),
    (None, InputTypeError),
    (5, InputTypeError),
    (("users", 5), InputTypeError),
    (("users", None), InputTypeError),
    (("users", ""), InvalidInputError),
    (("a.b",), InvalidInputError),
    (("a\x00",), InvalidInputError),
    (("\ud800",), InvalidInputError),
    (("langgraph", "x"), InvalidInputError),
]


@pytest.mark.parametrize(("namespace", "error"), BAD_NAMESPACES, ids=repr)
async def test_put_refuses_hostile_namespaces(kv, namespace, error) -> None:
    before = _kv_state(kv)
    for call in (
        lambda: kv.put(namespace, "k", {"text": "x"}),
        lambda: kv.batch([PutOp(namespace, "k", {"text": "x"})]),
    ):
        with pytest.raises(error, match="namespace") as info:
            call()
        assert isinstance(info.value, InvalidNamespaceError)  # LangGraph's documented error too
    with pytest.raises(error, match="namespace"):
        await kv.aput(namespace, "k", {"text": "x"})
    assert _kv_state(kv) == before


@pytest.mark.parametrize(
    ("namespace", "error"), [n for n in BAD_NAMESPACES if n[0] != () and n[0] != ("langgraph", "x")], ids=repr
)
async def test_reads_refuse_hostile_namespaces(kv, namespace, error) -> None:
    with pytest.raises(error, match="namespace"):
        kv.get(namespace, "a")
    with pytest.raises(error, match="namespace"):
        await kv.aget(namespace, "a")
    with pytest.raises(error, match="namespace_prefix"):
        kv.search(namespace, query="red")
    with pytest.raises(error, match="namespace_prefix"):
        await kv.asearch(namespace)
    with pytest.raises(error, match="namespace"):
        kv.delete(namespace, "a")
    if namespace is not None:  # prefix=None means "every namespace"
        with pytest.raises(error, match="prefix"):
            kv.list_namespaces(prefix=namespace)


BAD_PUTS = [
    ({"key": None}, InputTypeError, "'key'"),
    ({"key": 5}, InputTypeError, "'key'"),
    ({"key": "\ud800"}, InvalidInputError, "'key'"),
    ({"value": [1]}, InputTypeError, "'value'"),
    ({"value": "text"}, InputTypeError, "'value'"),
    ({"value": {"text": math.nan}}, InvalidInputError, "'value.text'"),
    ({"value": {"text": 2**64}}, InvalidInputError, "'value.text'"),
    ({"value": {"text": "lone \udc00"}}, InvalidInputError, "'value.text'"),
    ({"value": {1: "x"}}, InvalidInputError, "'value' must have str keys"),
    ({"value": {"text": object()}}, InputTypeError, "'value.text'"),
    ({"value": _cyclic()}, InvalidInputError, "'value.self'"),
    ({"value": _deep(31)}, InvalidInputError, "'value' must be nested"),
    ({"value": _deep(5000)}, InvalidInputError, "'value' must be nested"),
    ({"index": "text"}, InputTypeError, "'index'"),
    ({"index": [1]}, InputTypeError, r"'index\[0\]'"),
    ({"index": [""]}, InvalidInputError, r"'index\[0\]'"),
    ({"ttl": math.nan}, InvalidInputError, "'ttl'"),
    ({"ttl": math.inf}, InvalidInputError, "'ttl'"),
    ({"ttl": -1}, InvalidInputError, "'ttl'"),
    ({"ttl": 0}, InvalidInputError, "'ttl'"),
    ({"ttl": True}, InvalidInputError, "'ttl'"),
    ({"ttl": "5"}, InvalidInputError, "'ttl'"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD_PUTS, ids=_ids(BAD_PUTS))
async def test_put_refusals_change_nothing(kv, kwargs, error, match) -> None:
    before = _kv_state(kv)
    args = {"key": "a", "value": {"text": "replaced"}, **kwargs}
    extra = {k: v for k, v in args.items() if k in ("index", "ttl")}
    with pytest.raises(error, match=match):
        kv.put(("users", "1"), args["key"], args["value"], **extra)
    with pytest.raises(error, match=match):
        await kv.aput(("users", "1"), args["key"], args["value"], **extra)
    op = PutOp(("users", "1"), args["key"], args["value"], extra.get("index"), extra.get("ttl"))
    with pytest.raises(error, match=match.replace("'", "'ops\\[1\\]\\.", 1)):
        kv.batch([PutOp(("users", "1"), "fine", {"text": "would be added"}), op])
    assert _kv_state(kv) == before


def test_a_value_at_the_depth_limit_is_stored_and_searchable(kv) -> None:
    kv.put(("deep",), "k", {"text": "deep value", "nest": _deep(29)})
    assert kv.get(("deep",), "k").value["nest"] == _deep(29)
    assert [i.key for i in kv.search(("deep",), query="deep value")] == ["k"]


BAD_SEARCHES = [
    ({"limit": -1}, "'limit'"),
    ({"limit": True}, "'limit'"),
    ({"limit": 2**63}, "'limit'"),
    ({"limit": 1.5}, "'limit'"),
    ({"limit": None}, "'limit'"),
    ({"offset": -1}, "'offset'"),
    ({"offset": False}, "'offset'"),
    ({"offset": 10**30}, "'offset'"),
    ({"query": 5}, "'query'"),
    ({"query": "\ud800"}, "'query'"),
    ({"filter": [1]}, "'filter'"),
    ({"filter": "text"}, "'filter'"),
    ({"filter": {1: 2}}, "'filter'"),
    ({"filter": _cyclic()}, "'filter"),
    ({"filter": _deep(5000)}, "'filter'"),
    ({"filter": {"n": math.nan}}, "'filter.n'"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD_SEARCHES, ids=_ids(BAD_SEARCHES))
async def test_search_refusals_are_typed(kv, kwargs, match) -> None:
    before = _kv_state(kv)
    with pytest.raises(InvalidInputError, match=match):
        kv.search(("users",), **kwargs)
    with pytest.raises(InvalidInputError, match=match):
        await kv.asearch(("users",), **kwargs)
    with pytest.raises(InvalidInputError, match=match.replace("'", "'ops\\[0\\]\\.", 1)):
        kv.batch(
            [
                SearchOp(
                    ("users",),
                    kwargs.get("filter"),
                    kwargs.get("limit", 10),
                    kwargs.get("offset", 0),
                    kwargs.get("query"),
                )
            ]
        )
    assert _kv_state(kv) == before


def test_unknown_filter_operators_are_filter_errors(kv) -> None:
    with pytest.raises(FilterError):
        kv.search(("users",), filter={"n": {"$regex": "1"}})
    with pytest.raises(FilterError):
        kv.search(("users",), query="red", filter={"n": {"$gt": [1]}})


@pytest.mark.parametrize("limit", [0, 1, 2**62, 2**63 - 1], ids=repr)
@pytest.mark.parametrize("offset", [0, 1, 2**62], ids=repr)
async def test_huge_limits_and_offsets_answer_correctly(kv, limit, offset) -> None:
    expected = max(0, min(limit, 2 - offset))
    assert len(kv.search(("users",), limit=limit, offset=offset)) == expected
    assert len(kv.search(("users",), query="red dress", limit=limit, offset=offset)) == expected
    assert len(await kv.asearch(("users",), query="red dress", limit=limit, offset=offset)) == expected
    assert len(kv.list_namespaces(limit=limit, offset=offset)) == max(0, min(limit, 3 - offset))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda s: s.batch("ops"), InputTypeError, "'ops'"),
        (lambda s: s.batch(None), InputTypeError, "'ops'"),
        (lambda s: s.batch([object()]), InputTypeError, r"'ops\[0\]'"),
        (lambda s: s.batch([GetOp(("users", "1"), 5)]), InputTypeError, r"'ops\[0\]\.key'"),
        (lambda s: s.batch([GetOp(None, "a")]), InputTypeError, r"'ops\[0\]\.namespace'"),
        (
            lambda s: s.batch([ListNamespacesOp(match_conditions=(MatchCondition("middle", ("a",)),))]),
            InvalidInputError,
            "match_type",
        ),
        (
            lambda s: s.batch([ListNamespacesOp(match_conditions=(MatchCondition("prefix", (5,)),))]),
            InputTypeError,
            r"path\[0\]",
        ),
        (lambda s: s.batch([ListNamespacesOp(match_conditions="prefix")]), InputTypeError, "match_conditions"),
        (lambda s: s.get(("users", "1"), 5), InputTypeError, "'key'"),
        (lambda s: s.get(("users", "1"), ["a"]), InputTypeError, "'key'"),
        (lambda s: s.delete(("users", "1"), None), InputTypeError, "'key'"),
        (lambda s: s.list_namespaces(max_depth=-1), InvalidInputError, "'max_depth'"),
        (lambda s: s.list_namespaces(max_depth=True), InvalidInputError, "'max_depth'"),
        (lambda s: s.list_namespaces(limit=-1), InvalidInputError, "'limit'"),
        (lambda s: s.list_namespaces(offset=1.5), InvalidInputError, "'offset'"),
        (lambda s: s.list_namespaces(suffix="users"), InputTypeError, "'suffix'"),
    ],
    ids=[f"call{i}" for i in range(16)],
)
def test_other_store_refusals_are_typed_and_change_nothing(kv, call, error, match) -> None:
    before = _kv_state(kv)
    with pytest.raises(error, match=match):
        call(kv)
    assert _kv_state(kv) == before


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ttl": {"default_ttl": math.nan}},
        {"ttl": {"default_ttl": True}},
        {"ttl": {"default_ttl": math.inf}},
        {"index": {"fields": "text"}},
        {"index": {"fields": [1]}},
        {"index": {"embed": 5}},
        {"device": None},
        {"device": "gpu"},
        {"index": False, "device": None},
        {"clock": object()},
        {"clock": lambda: "x"},
        {"clock": lambda: math.nan},
    ],
    ids=repr,
)
def test_store_configuration_is_typed(kwargs) -> None:
    with pytest.raises(ConfigurationError):
        GPUPromptStore(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"index_factory": False}, "'index_factory'"),
        ({"device": None}, "'device'"),
        ({"device": ""}, "'device'"),
        ({"nonsense": 1}, "'nonsense'"),
        ({"max_queue": 0}, "'max_queue'"),
        ({"dim": 4}, "'dim'"),
        ({"metric": np.array(["cosine", "ip"])}, "'metric'"),
        ({"backend": np.array(["faiss"])}, "'backend'"),
        ({"index": "not an index"}, "'index'"),
    ],
    ids=repr,
)
def test_vector_store_options_fail_at_construction(lc_embeddings, kwargs, match) -> None:
    """Every option the core index would refuse at the first add is refused at construction."""
    with pytest.raises(ConfigurationError, match=match):
        GPUPromptVectorStore(lc_embeddings, **kwargs)


@pytest.mark.parametrize("texts", [np.array(1.5), np.array("text")], ids=repr)
def test_zero_dimensional_arrays_are_typed(store, texts) -> None:
    before = _state(store)
    with pytest.raises(InputTypeError, match="'texts'"):
        store.add_texts(texts)
    assert _state(store) == before


# ----------------------------------------------------------------------------- semantic cache
LLM = "fake-llm-settings"


@pytest.fixture
def cache(lc_embeddings) -> GPUPromptSemanticCache:
    cache = GPUPromptSemanticCache(lc_embeddings, score_threshold=0.9)
    cache.update("What is your return policy?", LLM, [Generation(text="30 days")])
    return cache


@pytest.mark.parametrize(
    ("prompt", "llm_string", "error", "match"),
    [
        (None, LLM, InputTypeError, "'prompt'"),
        (5, LLM, InputTypeError, "'prompt'"),
        ("lone \ud800", LLM, InvalidInputError, "'prompt'"),
        ("p", None, InputTypeError, "'llm_string'"),
        ("p", "lone \udc00", InvalidInputError, "'llm_string'"),
    ],
    ids=repr,
)
async def test_cache_refuses_bad_prompts(cache, prompt, llm_string, error, match) -> None:
    with pytest.raises(error, match=match):
        cache.lookup(prompt, llm_string)
    with pytest.raises(error, match=match):
        await cache.alookup(prompt, llm_string)
    with pytest.raises(error, match=match):
        cache.update(prompt, llm_string, [Generation(text="x")])
    assert len(cache.answer_cache) == 1


@pytest.mark.parametrize("return_val", ["text", None, [None], ["text"], [Generation(text="ok"), 5]], ids=repr)
def test_cache_refuses_bad_return_values(cache, return_val) -> None:
    with pytest.raises(InputTypeError, match="'return_val"):
        cache.update("another prompt", LLM, return_val)
    assert cache.lookup("another prompt", LLM) is None
    assert len(cache.answer_cache) == 1


@pytest.mark.parametrize(
    "prompt",
    [
        "[" * 100_000 + "]" * 100_000,  # JSON nested past the parser's stack
        json.dumps([{"kwargs": 5}]),
        json.dumps([{"kwargs": {"content": [{"type": "text", "text": 5}, "odd", None]}}]),
        json.dumps([{"kwargs": {"content": "lone \ud800"}}]),  # an escape that decodes to a lone surrogate
        json.dumps({"not": "a list"}),
        "[not json",
    ],
    ids=["deep-json", "kwargs-int", "odd-blocks", "escaped-surrogate", "dict", "not-json"],
)
def test_cache_handles_odd_chat_prompts(cache, prompt) -> None:
    assert cache.lookup(prompt, LLM) is None
    cache.update(prompt, LLM, [Generation(text="odd")])
    assert cache.lookup(prompt, LLM) == [Generation(text="odd")]


@pytest.mark.parametrize("threshold", [math.nan, True, "0.9", 1.5, None], ids=repr)
def test_cache_threshold_is_checked(threshold) -> None:
    with pytest.raises(ConfigurationError, match="'score_threshold'"):
        GPUPromptSemanticCache(score_threshold=threshold)


# ----------------------------------------------------------------------------- property tests

GENERATED: dict[str, dict[str, int]] = {
    "vector store": {"round_trip": 0, "refused": 0},
    "langgraph store": {"round_trip": 0, "refused": 0},
}

_text = st.text(st.characters(codec="utf-8"), max_size=8)
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_key = st.one_of(_text, st.sampled_from(["a.b", "$x", "", " "]))
_value = st.recursive(
    _leaf,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(_key, children, max_size=3)),
    max_leaves=10,
)
_hostile_leaf = st.one_of(
    st.integers(min_value=2**63, max_value=2**80),
    st.integers(min_value=-(2**80), max_value=-(2**63) - 1),
    st.sampled_from([math.nan, math.inf, -math.inf, b"bytes", object(), {1, 2}, (1, object()), date(2020, 1, 1)]),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2),
)


@st.composite
def _metadata(draw: Any) -> dict:
    """Clean JSON metadata two times in three; otherwise one hostile part planted in it."""
    metadata = draw(st.dictionaries(_key, _value, max_size=5))
    if draw(st.sampled_from(["clean", "clean", "hostile"])) == "clean":
        return metadata
    kind = draw(st.sampled_from(["leaf", "key", "cycle", "deep"]))
    if kind == "leaf":
        poison: Any = draw(_hostile_leaf)
    elif kind == "key":
        poison = {draw(st.sampled_from([1, None, 2.5, "\ud800", ("t",)])): 1}
    elif kind == "cycle":
        poison = {"a": 1}
        poison["me"] = poison
    else:
        poison = _deep(draw(st.integers(min_value=33, max_value=200)))
    where = draw(st.sampled_from(["top", "list", "dict"]))
    metadata[draw(_text)] = poison if where == "top" else ([0, poison] if where == "list" else {"in": poison})
    return metadata


def _same(a: Any, b: Any) -> bool:
    """Equality that also tells 1 from 1.0 from True (what a round trip must keep)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def property_store(lc_embeddings) -> GPUPromptVectorStore:
    store = GPUPromptVectorStore(lc_embeddings)
    store.add_texts(TEXTS, ids=list("abcde"))
    return store


@pytest.fixture(scope="module")
def property_kv(lc_embeddings) -> GPUPromptStore:
    store = GPUPromptStore(index={"embed": lc_embeddings, "fields": ["text"]})
    store.put(("users", "1"), "a", {"text": "likes red dresses"})
    return store


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(metadata=_metadata())
def test_vector_store_metadata_round_trips_exactly_or_is_refused_unchanged(property_store, metadata) -> None:
    store = property_store
    before = _state(store)
    try:
        store.add_texts(["property probe"], [metadata], ids=["h"])
    except GPUPromptError:
        GENERATED["vector store"]["refused"] += 1
        assert _state(store) == before
        return
    GENERATED["vector store"]["round_trip"] += 1
    [got] = store.get_by_ids(["h"])
    assert _same(got.metadata, metadata)
    [(hit, _)] = store.similarity_search_with_score("property probe", k=1, filter={"$not": {"colour": "none"}})
    assert hit.id == "h" and _same(hit.metadata, metadata)
    store.delete(["h"])
    assert _state(store) == before


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(value=_metadata())
def test_langgraph_store_values_round_trip_exactly_or_are_refused_unchanged(property_kv, value) -> None:
    store = property_kv
    before = _kv_state(store)
    value = {"text": "property probe", **value}
    try:
        store.put(("probe",), "p", value)
    except GPUPromptError:
        GENERATED["langgraph store"]["refused"] += 1
        assert _kv_state(store) == before
        return
    GENERATED["langgraph store"]["round_trip"] += 1
    assert _same(store.get(("probe",), "p").value, value)
    [found] = store.search(("probe",), query="property probe", limit=1)
    assert found.key == "p" and _same(found.value, value)
    store.delete(("probe",), "p")
    assert _kv_state(store) == before


def test_property_cases_cover_both_branches(property_store, property_kv) -> None:
    # Runs the property tests on their own counters: a generator that only ever produced clean
    # (or only hostile) values would pass them while checking one branch.
    for counts in GENERATED.values():
        counts.update(round_trip=0, refused=0)
    test_vector_store_metadata_round_trips_exactly_or_is_refused_unchanged(property_store)
    test_langgraph_store_values_round_trip_exactly_or_are_refused_unchanged(property_kv)
    print(f"\nLangChain property tests: {GENERATED}")
    for counts in GENERATED.values():
        assert counts["round_trip"] > 0 and counts["refused"] > 0
