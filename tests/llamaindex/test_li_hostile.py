"""Hostile input at the LlamaIndex adapters' public methods: every refusal is a typed gpuprompt
error naming the argument, and nothing already stored changes.

Covers the reliability issue: reserved-key spoofing of the vector store's bookkeeping, path
traversal through ``namespace`` / ``persist_path``, silent coercions (a bare str embedded character
by character, str or bool "numbers" in embeddings), builtin exceptions (TypeError, ValueError,
RecursionError...) on odd values, and a property test: random metadata either round-trips exactly
or is refused with the store unchanged.
"""

from __future__ import annotations

import math
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llama_index.core import StorageContext
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)
from pydantic import ValidationError

from gpuprompt import ContextCache
from gpuprompt.errors import ConfigurationError, FilterError, GPUPromptError, InputTypeError, InvalidInputError
from llamaindex_gpuprompt import GPUPromptContextMemoryBlock, GPUPromptVectorStore

DIM = 4
DOCS = {"n0": "A", "n1": "A", "n2": "B", "n3": "B", "n4": "C", "n5": "C"}


def _node(node_id: str, doc: str | None = None, *, metadata: dict | None = None, embedding: Any = None) -> TextNode:
    i = int(node_id[1:]) if node_id[1:].isdigit() else 0
    vector = embedding if embedding is not None else [1.0 if j == i % DIM else 0.1 * (i + 1) for j in range(DIM)]
    node = TextNode(id_=node_id, text=f"text of {node_id}", metadata=metadata or {}, embedding=vector)
    if doc is not None:
        node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=doc)
    return node


def _bypass(node: TextNode, **fields: Any) -> TextNode:
    """Set fields past pydantic's validation, as a caller can (model_construct, __dict__)."""
    object.__setattr__(node, "__dict__", {**node.__dict__, **fields})
    return node


def _state(store: GPUPromptVectorStore) -> list[tuple[str, str | None, dict]]:
    index = store.client
    if index is None:
        return []
    return sorted((r.id, r.document, r.metadata) for r in index.get(index.ids()))


@pytest.fixture
def store() -> GPUPromptVectorStore:
    store = GPUPromptVectorStore()
    store.add(
        [
            _node(node_id, doc, metadata={"colour": "red" if int(node_id[1]) % 2 else "blue", "rank": int(node_id[1])})
            for node_id, doc in DOCS.items()
        ]
    )
    return store


def _query(**kwargs: Any) -> VectorStoreQuery:
    kwargs.setdefault("query_embedding", [1.0, 0.0, 0.0, 0.0])
    kwargs.setdefault("similarity_top_k", 3)
    return VectorStoreQuery(**kwargs)


# ----------------------------------------------------------------------------- reserved-key spoofing
RESERVED = ["_llamaindex_node", "_llamaindex_node.ref_doc_id", "_llamaindex_node.id", "_llamaindex_node.content"]


@pytest.mark.parametrize("key", RESERVED)
def test_reserved_metadata_keys_are_refused_and_store_nothing(store, key: str) -> None:
    before = _state(store)
    spoof = _node("n9", "Z", metadata={key: "A"})
    with pytest.raises(InvalidInputError, match=f"reserved key '{key}'"):
        store.add([_node("n8", "Z"), spoof])
    assert _state(store) == before


def test_keys_near_the_reserved_prefix_are_the_users(store) -> None:
    node = _node("n9", "Z", metadata={"_llamaindex_nodes": 1, "_llamaindex_node_id": "x", "llamaindex_node.id": 2})
    store.add([node])
    [got] = store.get_nodes(["n9"])
    assert got.metadata == {"_llamaindex_nodes": 1, "_llamaindex_node_id": "x", "llamaindex_node.id": 2}
    hits = store.query(_query(filters=MetadataFilters(filters=[MetadataFilter(key="_llamaindex_node_id", value="x")])))
    assert hits.ids == ["n9"]


def _inject_legacy_spoof(store: GPUPromptVectorStore) -> None:
    """A record as a snapshot written before reserved keys were refused could hold: node n6 of
    document "C" whose own metadata claims to be node n0 of document "A"."""
    ids, vectors, documents, metadatas = store._records([_node("n6", "C")])
    metadatas[0]["_llamaindex_node.ref_doc_id"] = "A"
    metadatas[0]["_llamaindex_node.id"] = "n0"
    store.client.add(ids, np.stack(vectors), documents=documents, metadatas=metadatas)


def test_spoofed_bookkeeping_never_reaches_delete_or_id_restricted_queries(store, tmp_path) -> None:
    _inject_legacy_spoof(store)
    store.persist(str(tmp_path / "snap"))
    for current in (store, GPUPromptVectorStore.from_persist_path(str(tmp_path / "snap"))):
        assert current.query(_query(node_ids=["n0"], similarity_top_k=10)).ids == ["n0"]
        assert set(current.query(_query(doc_ids=["A"], similarity_top_k=10)).ids) == {"n0", "n1"}
        current.delete("A")
        assert sorted(current.client.ids()) == ["n2", "n3", "n4", "n5", "n6"]


def test_filters_on_user_metadata_work_and_reserved_fields_are_refused(store) -> None:
    red = MetadataFilters(filters=[MetadataFilter(key="colour", value="red")])
    assert sorted(store.query(_query(filters=red, similarity_top_k=10)).ids) == ["n1", "n3", "n5"]
    assert sorted(n.node_id for n in store.get_nodes(filters=red)) == ["n1", "n3", "n5"]
    for key in RESERVED:
        with pytest.raises(FilterError, match="reserved key"):
            store.query(_query(filters=MetadataFilters(filters=[MetadataFilter(key=key, value="A")])))


def test_snapshots_keep_their_format_and_load(store, tmp_path) -> None:
    storage = StorageContext.from_defaults(vector_store=store)
    storage.persist(persist_dir=str(tmp_path))
    loaded = GPUPromptVectorStore.from_persist_dir(str(tmp_path))
    assert _state(loaded) == _state(store)
    [node] = loaded.get_nodes(["n2"])
    assert node.ref_doc_id == "B" and node.metadata == {"colour": "blue", "rank": 2}


# ----------------------------------------------------------------------------- path traversal
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


@pytest.mark.parametrize(("namespace", "error"), BAD_NAMES, ids=repr)
def test_from_persist_dir_refuses_namespaces_that_leave_the_folder(store, tmp_path, namespace, error) -> None:
    inner = tmp_path / "inner"
    StorageContext.from_defaults(vector_store=store).persist(persist_dir=str(inner))
    # A snapshot one level up: what "../escape" would otherwise read.
    store.persist(str(tmp_path / "escape__vector_store.json"))
    with pytest.raises(error, match="'namespace'"):
        GPUPromptVectorStore.from_persist_dir(str(inner), namespace=namespace)


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("", InvalidInputError),
        ("a\x00b", InvalidInputError),
        ("snap/..", InvalidInputError),
        ("inner/../../escape", InvalidInputError),
        ("\ud800", InvalidInputError),
        (None, InputTypeError),
        (5, InputTypeError),
        (b"bytes", InputTypeError),
    ],
    ids=repr,
)
def test_persist_and_load_refuse_paths_that_escape(store, tmp_path, monkeypatch, path, error) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inner").mkdir()
    before = sorted(p.name for p in tmp_path.parent.iterdir())
    with pytest.raises(error, match="'persist_path'"):
        store.persist(path)
    with pytest.raises(error, match="'persist_path'"):
        GPUPromptVectorStore.from_persist_path(path)
    assert sorted(p.name for p in tmp_path.parent.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inner"]


def test_a_hostile_storage_context_namespace_cannot_write_outside(store, tmp_path) -> None:
    storage = StorageContext.from_defaults(vector_store=store)
    storage.add_vector_store(store, namespace="../../escape")
    with pytest.raises(InvalidInputError, match="'persist_path'"):
        storage.persist(persist_dir=str(tmp_path / "p" / "q"))
    assert not (tmp_path / "escape__vector_store.json").exists()
    assert not any(tmp_path.parent.glob("escape__vector_store.json*"))


def test_normal_relative_and_pathlike_paths_still_work(store, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    store.persist("../saved/default__vector_store.json")
    loaded = GPUPromptVectorStore.from_persist_dir(Path("../saved"))
    assert _state(loaded) == _state(store)


# ----------------------------------------------------------------------------- queries
BAD_EMBEDDINGS = [
    (["1", "0", "0", "0"], InputTypeError),
    ("abcd", InputTypeError),
    ([True, False, False, False], InputTypeError),
    ([[1.0, 0.0], [0.0, 1.0]], InvalidInputError),
    ([[1.0, 0.0, 0.0, 0.0], [0.0]], InputTypeError),
    ({"a": 1.0}, InputTypeError),
    ([object()] * 4, InputTypeError),
    ([None] * 4, InputTypeError),
    (5, InputTypeError),
    ([1.0, math.nan, 0.0, 0.0], InvalidInputError),
    ([1.0, math.inf, 0.0, 0.0], InvalidInputError),
    ([1e39, 0.0, 0.0, 0.0], InvalidInputError),
    ([1.0, 0.0, 0.0], InvalidInputError),
    ([], InvalidInputError),
]


@pytest.mark.parametrize(("embedding", "error"), BAD_EMBEDDINGS, ids=repr)
async def test_bad_query_embeddings_are_typed(store, embedding, error) -> None:
    with pytest.raises(error):
        store.query(_query(query_embedding=embedding))
    with pytest.raises(error):
        await store.aquery(_query(query_embedding=embedding))


def test_numpy_and_int_query_embeddings_are_numbers(store) -> None:
    assert store.query(_query(query_embedding=np.array([1, 0, 0, 0], dtype=np.int64))).ids[0] == "n0"
    assert store.query(_query(query_embedding=(1.0, 0, 0, 0))).ids[0] == "n0"


@pytest.mark.parametrize("k", [-1, True, 1.5, None, "3", 2**64 * -1], ids=repr)
def test_bad_similarity_top_k(store, k) -> None:
    with pytest.raises(InvalidInputError, match="'query.similarity_top_k'"):
        store.query(_query(similarity_top_k=k))


@pytest.mark.parametrize("k", [0, 1, 6, 10**30, np.int64(2)], ids=repr)
def test_extreme_but_valid_k_gives_min_k_matches(store, k) -> None:
    assert len(store.query(_query(similarity_top_k=k)).ids) == min(int(k), 6)
    mmr = store.query(_query(similarity_top_k=k, mode=VectorStoreQueryMode.MMR))
    assert len(mmr.ids) == min(int(k), 6)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"mmr_threshold": math.nan}, "mmr_threshold"),
        ({"mmr_threshold": 2.0}, "mmr_threshold"),
        ({"mmr_threshold": -0.1}, "mmr_threshold"),
        ({"mmr_threshold": True}, "mmr_threshold"),
        ({"mmr_threshold": "0.5"}, "mmr_threshold"),
        ({"mmr_prefetch_k": "abc"}, "mmr_prefetch_k"),
        ({"mmr_prefetch_k": 0}, "mmr_prefetch_k"),
        ({"mmr_prefetch_k": -1}, "mmr_prefetch_k"),
        ({"mmr_prefetch_k": True}, "mmr_prefetch_k"),
        ({"mmr_prefetch_factor": math.nan}, "mmr_prefetch_factor"),
        ({"mmr_prefetch_factor": math.inf}, "mmr_prefetch_factor"),
        ({"mmr_prefetch_factor": "x"}, "mmr_prefetch_factor"),
        ({"mmr_prefetch_factor": 0.5}, "mmr_prefetch_factor"),
    ],
    ids=repr,
)
def test_bad_mmr_options(store, kwargs, name) -> None:
    with pytest.raises(InvalidInputError, match=f"'{name}'"):
        store.query(_query(mode=VectorStoreQueryMode.MMR), **kwargs)


def test_mmr_with_fetch_smaller_than_k_still_returns_k(store) -> None:
    assert len(store.query(_query(mode=VectorStoreQueryMode.MMR, similarity_top_k=4), mmr_prefetch_k=1).ids) == 4


def _nested_filters(depth: int) -> MetadataFilters:
    filters = MetadataFilters(filters=[MetadataFilter(key="rank", value=1)])
    for _ in range(depth):
        filters = MetadataFilters(filters=[filters])
    return filters


def _cyclic_filters() -> MetadataFilters:
    filters = MetadataFilters(filters=[MetadataFilter(key="rank", value=1)])
    filters.filters.append(filters)
    return filters


BAD_FILTERS = [
    {"rank": 1},
    [MetadataFilter(key="rank", value=1)],
    "rank == 1",
    _nested_filters(40),
    _nested_filters(5000),
    _cyclic_filters(),
    MetadataFilters(filters=[MetadataFilter.model_construct(key="rank", value=1, operator="bogus")]),
    MetadataFilters.model_construct(
        filters=[MetadataFilter(key="rank", value=1), MetadataFilter(key="rank", value=2)], condition="xor"
    ),
    MetadataFilters(filters=[MetadataFilter.model_construct(key=5, value=1, operator="==")]),
    MetadataFilters(filters=[MetadataFilter.model_construct(key=None, value=1, operator="==")]),
    MetadataFilters(filters=[MetadataFilter(key="\ud800", value=1)]),
    MetadataFilters(filters=[MetadataFilter(key="$where", value=1)]),
    MetadataFilters(filters=[MetadataFilter(key="rank", value=1, operator="in")]),
    MetadataFilters(filters=[MetadataFilter.model_construct(key="rank", value=object(), operator="==")]),
    MetadataFilters(filters=[MetadataFilter.model_construct(key="rank", value=math.nan, operator="==")]),
    MetadataFilters.model_construct(filters="rank", condition="and"),
    MetadataFilters(filters=[MetadataFilters(filters=[])]),
]


@pytest.mark.parametrize("filters", BAD_FILTERS, ids=[f"filter{i}" for i in range(len(BAD_FILTERS))])
async def test_malformed_filters_are_filter_errors_everywhere(store, filters) -> None:
    before = _state(store)
    with pytest.raises(FilterError):
        store.query(_query(filters=filters))
    with pytest.raises(FilterError):
        await store.aquery(_query(filters=filters))
    with pytest.raises(FilterError):
        store.get_nodes(filters=filters)
    with pytest.raises(FilterError):
        store.delete_nodes(filters=filters)
    assert _state(store) == before


def test_moderately_nested_filters_still_work(store) -> None:
    assert store.query(_query(filters=_nested_filters(4))).ids == ["n1"]
    either = MetadataFilters(
        filters=[MetadataFilter(key="rank", value=1), MetadataFilter(key="rank", value=2)], condition=FilterCondition.OR
    )
    assert sorted(store.query(_query(filters=either)).ids) == ["n1", "n2"]


# ----------------------------------------------------------------------------- writes
def _cyclic() -> dict:
    value: dict = {"a": 1}
    value["self"] = value
    return value


def _deep(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"d": value}
    return value


BAD_METADATA = [
    {"x": math.nan},
    {"x": math.inf},
    {"x": 2**63},
    {"x": -(2**63) - 1},
    {"x": "lone \udc00 surrogate"},
    {"bad \ud800 key": 1},
    {1: "int key"},
    {None: "none key"},
    {"x": object()},
    {"x": b"bytes"},
    {"x": {1, 2}},
    {"x": date(2020, 1, 1)},
    {"x": [1, [2, [3, object()]]]},
    _cyclic(),
    _deep(40),
    _deep(5000),
    "not a dict",
    [("a", 1)],
]


@pytest.mark.parametrize("metadata", BAD_METADATA, ids=[f"metadata{i}" for i in range(len(BAD_METADATA))])
async def test_bad_node_metadata_is_typed_and_stores_nothing(store, metadata) -> None:
    before = _state(store)
    node = _bypass(_node("n9", "Z"), metadata=metadata)
    with pytest.raises(InvalidInputError, match=r"'nodes\[1\]\.metadata"):
        store.add([_node("n8", "Z"), node])
    with pytest.raises(InvalidInputError, match=r"'nodes\[0\]\.metadata"):
        await store.async_add([node])
    assert _state(store) == before


BAD_NODE_FIELDS = [
    ({"embedding": ["1", "0", "0", "0"]}, InputTypeError, r"'nodes\[0\]\.embedding'"),
    ({"embedding": [True, False, False, False]}, InputTypeError, r"'nodes\[0\]\.embedding'"),
    ({"embedding": [[1.0, 0.0], [0.0, 1.0]]}, InvalidInputError, r"'nodes\[0\]\.embedding'"),
    ({"embedding": [[1.0, 0.0, 0.0, 0.0], [0.0]]}, InputTypeError, r"'nodes\[0\]\.embedding'"),
    ({"embedding": 5}, InputTypeError, r"'nodes\[0\]\.embedding'"),
    ({"embedding": "abcd"}, InputTypeError, r"'nodes\[0\]\.embedding'"),
    ({"embedding": [math.nan, 0.0, 0.0, 0.0]}, InvalidInputError, "finite"),
    ({"embedding": [1.0, 0.0]}, InvalidInputError, "4 dimensions"),
    ({"text": "lone \ud800"}, InvalidInputError, r"'nodes\[0\]\.text'"),
    ({"text": None}, InvalidInputError, r"'nodes\[0\]"),
    ({"id_": "\ud800"}, InvalidInputError, r"'nodes\[0\]\.id_'"),
    ({"id_": ""}, InvalidInputError, r"'nodes\[0\]\.id_'"),
    ({"id_": 5}, InvalidInputError, r"'nodes\[0\]\.id_'"),
]


@pytest.mark.parametrize(("fields", "error", "match"), BAD_NODE_FIELDS, ids=repr)
def test_bad_node_fields_are_typed_and_store_nothing(store, fields, error, match) -> None:
    before = _state(store)
    with pytest.raises(error, match=match):
        store.add([_bypass(_node("n9", "Z"), **fields)])
    assert _state(store) == before


def test_unserialisable_relationships_are_typed(store) -> None:
    before = _state(store)
    node = _node("n9", "Z")
    node.relationships[NodeRelationship.NEXT] = RelatedNodeInfo(node_id="n10", metadata={"x": object()})
    with pytest.raises(InvalidInputError, match=r"'nodes\[0\]' \(id 'n9'\) must be JSON-serialisable"):
        store.add([node])
    odd = _node("n9", "Z")
    odd.relationships[NodeRelationship.NEXT] = RelatedNodeInfo(node_id="n\ud800")
    with pytest.raises(InvalidInputError, match=r"'nodes\[0\]"):
        store.add([odd])
    with pytest.raises(InvalidInputError, match=r"'nodes\[0\]\.ref_doc_id'"):
        store.add([_node("n9", "doc \udc00")])
    assert _state(store) == before


@pytest.mark.parametrize("nodes", [None, "abc", b"abc", 5, {"id": "x"}, [None], ["n1"], [{"text": "x"}]], ids=repr)
def test_add_refuses_what_is_not_a_list_of_nodes(store, nodes) -> None:
    before = _state(store)
    with pytest.raises(InputTypeError, match="'nodes"):
        store.add(nodes)
    assert _state(store) == before


def test_add_refuses_a_bare_node(store) -> None:
    with pytest.raises(InputTypeError, match="'nodes' must be a list of nodes"):
        store.add(_node("n9"))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda s: s.delete(None), InputTypeError, "'ref_doc_id'"),
        (lambda s: s.delete(5), InputTypeError, "'ref_doc_id'"),
        (lambda s: s.delete(["A"]), InputTypeError, "'ref_doc_id'"),
        (lambda s: s.delete("A\ud800"), InvalidInputError, "'ref_doc_id'"),
        (lambda s: s.delete_nodes("n1"), InputTypeError, "'node_ids'"),
        (lambda s: s.delete_nodes(["n1", 5]), InputTypeError, r"'node_ids\[1\]'"),
        (lambda s: s.delete_nodes(5), InputTypeError, "'node_ids'"),
        (lambda s: s.get_nodes("n1"), InputTypeError, "'node_ids'"),
        (lambda s: s.get_nodes([None]), InputTypeError, r"'node_ids\[0\]'"),
        (lambda s: s.query(_query(node_ids="n1")), InputTypeError, "'query.node_ids'"),
        (lambda s: s.query(_query(doc_ids=[1])), InputTypeError, r"'query.doc_ids\[0\]'"),
        (lambda s: s.query(_query(mode="bogus")), InvalidInputError, "'query.mode'"),
        (lambda s: s.query("not a query"), InputTypeError, "'query'"),
        (lambda s: s.query(None), InputTypeError, "'query'"),
        (lambda s: s.query(_query(query_embedding=None)), InvalidInputError, "'query.query_embedding'"),
        (lambda s: s.query(_query(), filter=[1]), FilterError, "filter"),
    ],
    ids=lambda v: getattr(v, "__name__", repr(v)),
)
def test_odd_arguments_elsewhere_are_typed_and_change_nothing(store, call, error, match) -> None:
    before = _state(store)
    with pytest.raises(error, match=match):
        call(store)
    assert _state(store) == before


def test_unknown_ids_and_documents_are_ignored(store) -> None:
    before = _state(store)
    store.delete("no such doc")
    store.delete_nodes(["no such node"])
    assert store.get_nodes(["no such node"]) == []
    assert store.query(_query(node_ids=["no such node"])).ids == []
    assert _state(store) == before


@pytest.mark.parametrize(
    "kwargs",
    [{"dim": True}, {"dim": 0}, {"dim": 1.5}, {"dim": "4"}, {"metric": "manhattan"}, {"mmr_prefetch_factor": math.nan}],
    ids=repr,
)
def test_constructor_fields_are_not_coerced(kwargs) -> None:
    field = next(iter(kwargs))
    with pytest.raises(ConfigurationError, match=f"'{field}'") as raised:
        GPUPromptVectorStore(**kwargs)
    assert isinstance(raised.value.__cause__, ValidationError)  # pydantic's refusal, re-raised typed


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"index_options": {"max_queue": 0}}, "'max_queue'"),
        ({"index_options": {"bogus": None}}, "'bogus'"),
        ({"index_options": {"index_factory": False}}, "'index_factory'"),
        ({"index_options": {1: 2}}, "'index_options'"),
        ({"device": ""}, "'device'"),
        ({"device": None}, "'device'"),
    ],
    ids=repr,
)
def test_index_options_fail_at_construction(kwargs, match) -> None:
    """What the core index would refuse when it is built (the first add) is refused now."""
    with pytest.raises(ConfigurationError, match=match):
        GPUPromptVectorStore(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 0}, "'max_tokens'"),
        ({"temperature": -1}, "'temperature'"),
        ({"top_p": 0}, "'top_p'"),
        ({"bogus": 1}, "'bogus' is not an option of GPUPromptLLM"),
        ({"device_map": "auto"}, "'device_map' is not an option"),
        ({"messages_to_prompt": lambda messages: "x"}, "'messages_to_prompt' would never be called"),
        ({"completion_to_prompt": lambda prompt: prompt}, "'completion_to_prompt' would never be called"),
        ({"model_name": "a", "model": "b"}, "both 'model_name' and 'model'"),
        ({"max_new_tokens": 8, "max_tokens": 9}, "both 'max_new_tokens' and 'max_tokens'"),
    ],
    ids=lambda value: repr(sorted(value)) if isinstance(value, dict) else value,
)
def test_llm_constructor_errors_are_typed(kwargs, match) -> None:
    """Loads nothing: the settings are checked at construction, with our typed error."""
    from llamaindex_gpuprompt import GPUPromptLLM

    with pytest.raises(ConfigurationError, match=match):
        GPUPromptLLM(**kwargs)


def test_llm_reads_huggingface_llm_argument_names() -> None:
    from llamaindex_gpuprompt import GPUPromptLLM

    llm = GPUPromptLLM(model_name=None, max_new_tokens=12, context_window=1024)
    assert (llm.model, llm.max_tokens, llm.max_model_len) == (None, 12, 1024)


# ----------------------------------------------------------------------------- embedding
async def test_a_bare_str_is_not_embedded_character_by_character(li_embed) -> None:
    with pytest.raises(InputTypeError, match="'texts' must be a list of str .*Wrap a single text in a list"):
        li_embed.get_text_embedding_batch("abc")
    with pytest.raises(InputTypeError, match="'texts' must be a list of str"):
        await li_embed.aget_text_embedding_batch("abc")
    with pytest.raises(InputTypeError, match="'queries' must be a list of str"):
        li_embed.get_agg_embedding_from_queries("ab")
    with pytest.raises(InputTypeError, match="'queries' must be a list of str"):
        await li_embed.aget_agg_embedding_from_queries("ab")
    assert len(li_embed.get_text_embedding_batch(["abc", "def"])) == 2


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda e: e.get_text_embedding_batch(None), InputTypeError, "'texts'"),
        (lambda e: e.get_text_embedding_batch([None]), InputTypeError, r"'texts\[0\]'"),
        (lambda e: e.get_text_embedding_batch(["ok", b"bytes"]), InputTypeError, r"'texts\[1\]'"),
        (lambda e: e.get_text_embedding_batch(["\ud800"]), InvalidInputError, r"'texts\[0\]'"),
        (lambda e: e.get_text_embedding_batch({"a": 1}), InputTypeError, "'texts'"),
        (lambda e: e.get_query_embedding(None), InputTypeError, "'query'"),
        (lambda e: e.get_query_embedding("\udfff"), InvalidInputError, "'query'"),
        (lambda e: e.get_text_embedding(5), InputTypeError, "'text'"),
        (lambda e: e.get_text_embedding("\ud800"), InvalidInputError, "'text'"),
        (lambda e: e.get_agg_embedding_from_queries([]), InvalidInputError, "'queries'"),
        (lambda e: e(None), InputTypeError, "'nodes'"),
        (lambda e: e([None]), InputTypeError, r"'nodes\[0\]'"),
    ],
    ids=lambda v: getattr(v, "__name__", repr(v)),
)
def test_embedding_refusals_are_typed(li_embed, call, error, match) -> None:
    with pytest.raises(error, match=match):
        call(li_embed)


def test_odd_but_valid_unicode_embeds(li_embed) -> None:
    texts = ["", "e\u0301", "\U0001f600", "\u202eevil", "\x00nul", "a" * 5000]
    vectors = li_embed.get_text_embedding_batch(texts)
    assert len(vectors) == len(texts) and all(len(v) == len(vectors[0]) for v in vectors)


# ----------------------------------------------------------------------------- memory block
@pytest.fixture
def block(li_embed) -> GPUPromptContextMemoryBlock:
    return GPUPromptContextMemoryBlock(context_cache=ContextCache(li_embed.embedder))


@pytest.mark.parametrize(
    ("messages", "kwargs", "error", "match"),
    [
        (None, {}, InputTypeError, "'messages'"),
        ("hello", {}, InputTypeError, "'messages'"),
        (ChatMessage(role="user", content="x"), {}, InputTypeError, "'messages'"),
        ([None], {}, InputTypeError, r"'messages\[0\]'"),
        ([{"role": "user", "content": "x"}], {}, InputTypeError, r"'messages\[0\]'"),
        (
            [ChatMessage(role="user", content="ok"), ChatMessage(role="user", content="\ud800")],
            {},
            InvalidInputError,
            r"'messages\[1\]\.content'",
        ),
        ([ChatMessage(role="user", content="x")], {"session_id": 5}, InputTypeError, "'session_id'"),
        ([ChatMessage(role="user", content="x")], {"session_id": ""}, InvalidInputError, "'session_id'"),
        ([ChatMessage(role="user", content="x")], {"session_id": "\ud800"}, InvalidInputError, "'session_id'"),
    ],
    ids=repr,
)
async def test_memory_block_put_refusals_store_nothing(block, messages, kwargs, error, match) -> None:
    await block.aput([ChatMessage(role="user", content="kept")], session_id="s")
    with pytest.raises(error, match=match):
        await block.aput(messages, **kwargs)
    assert [t.text for t in block.context_cache.turns("s")] == ["kept"]
    assert block.context_cache.sessions() == ["s"]


@pytest.mark.parametrize(
    ("messages", "kwargs", "error"),
    [
        ("hello", {}, InputTypeError),
        ([None], {}, InputTypeError),
        ([ChatMessage(role="user", content="x")], {"session_id": 5}, InputTypeError),
        ([ChatMessage(role="user", content="\ud800")], {}, InvalidInputError),
    ],
    ids=repr,
)
async def test_memory_block_get_refusals(block, messages, kwargs, error) -> None:
    with pytest.raises(error):
        await block.aget(messages, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"turn_template": "{foo}"},
        {"turn_template": "{0}"},
        {"turn_template": "{role.missing}"},
        {"turn_template": "{"},
        {"max_turns": True},
        {"max_turns": 2.0},
        {"max_turns": 2**64},
        {"recent": -1},
        {"max_tokens": True},
        {"default_session_id": ""},
        {"default_session_id": "\ud800"},
    ],
    ids=repr,
)
def test_memory_block_configuration_is_checked_at_construction(kwargs) -> None:
    field = next(iter(kwargs))
    with pytest.raises(GPUPromptError, match=f"'{field}'"):
        GPUPromptContextMemoryBlock(**kwargs)


# ----------------------------------------------------------------------------- property test

GENERATED: dict[str, int] = {"round_trip": 0, "refused": 0}

_text = st.text(st.characters(codec="utf-8"), max_size=8)
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_key = st.one_of(_text, st.sampled_from(["a.b", "$x", "_llamaindex_nodes", "", " "]))
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
    """Clean JSON metadata two times in three; otherwise the same with one hostile part planted
    (a value, a key, a reserved key, a cycle or nesting past the limit) somewhere in it."""
    metadata = draw(st.dictionaries(_key, _value, max_size=5))
    if draw(st.sampled_from(["clean", "clean", "hostile"])) == "clean":
        return metadata
    kind = draw(st.sampled_from(["leaf", "key", "reserved", "cycle", "deep"]))
    if kind == "leaf":
        poison: Any = draw(_hostile_leaf)
    elif kind == "key":
        poison = {draw(st.sampled_from([1, None, 2.5, "\ud800", ("t",)])): 1}
    elif kind == "reserved":
        metadata[draw(st.sampled_from(RESERVED + ["_llamaindex_node.x"]))] = draw(_leaf)
        return metadata
    elif kind == "cycle":
        poison = {"a": 1}
        poison["me"] = poison
    else:
        poison = _deep(draw(st.integers(min_value=33, max_value=200)))
    # Planted at the top, or inside a list or dict one level down.
    where = draw(st.sampled_from(["top", "list", "dict"]))
    key = draw(_text)
    metadata[key] = poison if where == "top" else ([0, poison] if where == "list" else {"in": poison})
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
def property_store() -> GPUPromptVectorStore:
    store = GPUPromptVectorStore()
    store.add([_node(node_id, doc, metadata={"rank": i}) for i, (node_id, doc) in enumerate(DOCS.items())])
    return store


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(metadata=_metadata())
def test_random_metadata_round_trips_exactly_or_is_refused_unchanged(property_store, metadata) -> None:
    store = property_store
    before = _state(store)
    try:
        store.add([_node("h0", "H", metadata=metadata)])
    except GPUPromptError:
        GENERATED["refused"] += 1
        assert _state(store) == before
        return
    GENERATED["round_trip"] += 1
    [got] = store.get_nodes(["h0"])
    assert _same(got.metadata, metadata)
    hits = store.query(_query(node_ids=["h0"], similarity_top_k=1))
    assert hits.ids == ["h0"] and _same(hits.nodes[0].metadata, metadata)
    store.delete("H")
    assert _state(store) == before


def test_property_cases_cover_both_branches(property_store) -> None:
    # Runs the property test on its own counters: a generator that only ever produced clean (or
    # only hostile) metadata would pass it while checking one branch.
    GENERATED.update(round_trip=0, refused=0)
    test_random_metadata_round_trips_exactly_or_is_refused_unchanged(property_store)
    print(f"\nLlamaIndex vector store property test: {GENERATED}")
    assert GENERATED["round_trip"] > 0 and GENERATED["refused"] > 0
