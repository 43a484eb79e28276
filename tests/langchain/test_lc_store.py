"""GPUPromptStore: differential tests against LangGraph's InMemoryStore, TTL, async, LangGraph use."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from gpuprompt.errors import ConfigurationError, FilterError, InputTypeError, InvalidInputError
from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptStore

MEMORIES: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
    (("users", "42", "memories"), "m1", {"text": "prefers cotton dresses in size M", "kind": "preference", "weight": 3}),
    (("users", "42", "memories"), "m2", {"text": "lives in Oslo, Norway", "kind": "fact", "weight": 1}),
    (("users", "42", "memories"), "m3", {"text": "returned a pair of boots last winter", "kind": "event", "weight": 2}),
    (("users", "42", "orders"), "o1", {"text": "order 1001: red dress, delivered", "kind": "order", "weight": 0, "meta": {"status": "done"}}),
    (("users", "43", "memories"), "m1", {"text": "likes wool scarves and knitwear", "kind": "preference", "weight": 5}),
    (("users", "43", "memories"), "m2", {"text": "allergic to latex", "kind": "fact", "weight": 4}),
    (("users", "43", "orders"), "o7", {"text": "order 1007: running shoes, in transit", "kind": "order", "weight": 6, "meta": {"status": "open"}}),
    (("shop", "faq"), "returns", {"text": "items can be returned within 30 days", "tags": ["returns", "policy"]}),
    (("shop", "faq"), "shipping", {"text": "we ship to all EU countries and Norway", "tags": ["shipping"]}),
]


# Every item under ("users",) has a numeric "weight": InMemoryStore's $gt/$lt raise on a missing
# field (float(None)), where the core's filter simply does not match it.


def _norm(result: Any) -> Any:
    """Comparable form of a store result (timestamps differ between stores by construction)."""
    if result is None:
        return None
    if isinstance(result, list):
        return [_norm(r) for r in result]
    if isinstance(result, tuple):
        return result
    return (tuple(result.namespace), result.key, result.value)


def _scores(results: list[Any]) -> list[float | None]:
    return [getattr(r, "score", None) for r in results]


def _pair(lc_embeddings: GPUPromptEmbeddings, fields: list[str]) -> tuple[InMemoryStore, GPUPromptStore]:
    reference = InMemoryStore(index={"dims": 384, "embed": lc_embeddings, "fields": fields})
    ours = GPUPromptStore(index={"embed": lc_embeddings, "fields": fields})
    return reference, ours


READ_OPS: list[Any] = [
    GetOp(("users", "42", "memories"), "m1"),
    GetOp(("users", "42", "memories"), "missing"),
    SearchOp(("users",), limit=20),
    SearchOp(("users", "42"), limit=2, offset=1),
    SearchOp(("users",), filter={"kind": "preference"}),
    SearchOp(("users",), filter={"weight": {"$gt": 2}}),
    SearchOp(("users",), filter={"weight": {"$gte": 2, "$lt": 5}}),
    SearchOp(("users",), filter={"kind": {"$ne": "fact"}}, limit=20),
    SearchOp((), filter={"meta": {"status": "open"}}),
    SearchOp((), filter={"tags": ["shipping"]}),
    SearchOp(("users",), query="what fabric does the customer like?", limit=3),
    SearchOp(("users", "42"), query="where does the customer live?", limit=2),
    SearchOp((), query="can I send something back?", limit=4, offset=1),
    SearchOp(("users",), query="clothes", filter={"kind": "preference"}, limit=5),
    SearchOp(("users",), query="delivery", filter={"weight": {"$lte": 3}}, limit=10),
    SearchOp(("nobody",), query="anything", limit=3),
    ListNamespacesOp(),
    ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("users",)),)),
    ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("memories",)),)),
    ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("users", "*", "orders")),)),
    ListNamespacesOp(max_depth=2),
    ListNamespacesOp(limit=2, offset=1),
]


def _assert_same(reference: list[Any], ours: list[Any], ops: list[Any]) -> None:
    for op, expected, got in zip(ops, reference, ours):
        assert _norm(got) == _norm(expected), op
        if isinstance(op, SearchOp) and op.query:
            assert _scores(got) == pytest.approx(_scores(expected), abs=1e-4), op


@pytest.mark.parametrize("fields", [["$"], ["text"], ["text", "tags[*]"]])
def test_same_items_and_order_as_inmemorystore(lc_embeddings: GPUPromptEmbeddings, fields: list[str]) -> None:
    reference, ours = _pair(lc_embeddings, fields)
    for store in (reference, ours):
        for namespace, key, value in MEMORIES:
            store.put(namespace, key, value)
        store.put(("users", "43", "memories"), "secret", {"text": "not searchable", "kind": "fact", "weight": 0}, index=False)
    _assert_same(reference.batch(READ_OPS), ours.batch(READ_OPS), READ_OPS)

    # Updates, re-indexing on another field, and deletes, then the same reads again.
    writes = [
        PutOp(("users", "42", "memories"), "m2", {"text": "moved to Bergen", "kind": "fact", "weight": 2}),
        PutOp(("users", "43", "memories"), "m1", {"text": "likes wool and knits scarves", "weight": 5}),
        PutOp(("users", "42", "memories"), "m3", None),
        PutOp(("shop", "faq"), "shipping", None),
    ]
    reference.batch(writes)
    ours.batch(writes)
    after = [op for op in READ_OPS if not isinstance(op, ListNamespacesOp)]  # InMemoryStore keeps emptied namespaces
    after.append(SearchOp(("users",), query="who knits?", limit=2))
    _assert_same(reference.batch(after), ours.batch(after), after)


def test_reindexing_drops_the_old_vectors(lc_embeddings: GPUPromptEmbeddings) -> None:
    # (InMemoryStore keeps an item's old "$" vector after a re-put indexed on another field, so it
    # would still rank the item by its old text; here the old vectors go with the old value.)
    store = GPUPromptStore(index={"embed": lc_embeddings})
    store.put(("u",), "a", {"text": "likes wool scarves and knitwear"})
    store.put(("u",), "b", {"text": "orders running shoes"})
    store.put(("u",), "a", {"text": "moved to Bergen", "note": "new address"}, index=["note"])
    assert len(store._vectors.index) == 2
    scores = {item.key: item.score for item in store.search(("u",), query="wool knitwear", limit=2)}
    query, note = lc_embeddings.embed_documents(["wool knitwear", "new address"])
    assert scores["a"] == pytest.approx(sum(q * n for q, n in zip(query, note)), abs=1e-4)


def test_a_batch_reads_before_it_writes(lc_embeddings: GPUPromptEmbeddings) -> None:
    reference, ours = _pair(lc_embeddings, ["text"])
    ops = [
        PutOp(("a",), "k", {"text": "first"}),
        GetOp(("a",), "k"),
        SearchOp(("a",), query="first"),
        PutOp(("a",), "k", {"text": "second"}),
    ]
    _assert_same(reference.batch(ops), ours.batch(ops), ops)
    assert ours.get(("a",), "k").value == {"text": "second"}
    assert _norm(ours.get(("a",), "k")) == _norm(reference.get(("a",), "k"))


async def test_async_batch_matches_sync(lc_embeddings: GPUPromptEmbeddings) -> None:
    reference, ours = _pair(lc_embeddings, ["text"])
    for namespace, key, value in MEMORIES:
        await reference.aput(namespace, key, value)
        await ours.aput(namespace, key, value)
    _assert_same(await reference.abatch(READ_OPS), await ours.abatch(READ_OPS), READ_OPS)
    queries = [f"question {i} about {topic}" for i, topic in enumerate(["fabric", "orders", "returns", "Oslo"] * 4)]
    index = ours._vectors.index
    before = index.stats().batcher.batches
    found = await asyncio.gather(*(ours.asearch(("users",), query=q, limit=2) for q in queries))
    assert index.stats().batcher.batches - before < len(queries)  # concurrent searches were coalesced
    for q, result in zip(queries, found):
        assert _norm(result) == _norm(ours.search(("users",), query=q, limit=2))
    item = await ours.aget(("users", "42", "memories"), "m1")
    assert item is not None and item.value["kind"] == "preference"
    await ours.adelete(("users", "42", "memories"), "m1")
    assert await ours.aget(("users", "42", "memories"), "m1") is None


def test_semantic_search_ranks_the_relevant_memory_first(lc_embeddings: GPUPromptEmbeddings) -> None:
    store = GPUPromptStore(index={"embed": lc_embeddings, "fields": ["text"]})
    for namespace, key, value in MEMORIES:
        store.put(namespace, key, value)
    assert store.search(("users", "42"), query="which city does the customer live in?", limit=1)[0].key == "m2"
    assert store.search(("users", "43"), query="knitted accessories", limit=1)[0].key == "m1"
    assert [i.key for i in store.search(("shop",), query="refund window", limit=1)] == ["returns"]


def test_default_store_embeds_with_the_core_embedder() -> None:
    store = GPUPromptStore()
    assert isinstance(store.embeddings, GPUPromptEmbeddings)
    assert store._vectors.index is None  # nothing built before the first put
    plain = GPUPromptStore(index=False)
    plain.put(("a",), "k", {"text": "x"})
    assert plain.embeddings is None
    assert [i.key for i in plain.search(("a",), query="ignored without an index")] == ["k"]


def test_ttl_expires_and_refreshes(lc_embeddings: GPUPromptEmbeddings) -> None:
    now = [1000.0]
    store = GPUPromptStore(index={"embed": lc_embeddings, "fields": ["text"]}, ttl={"default_ttl": 1.0}, clock=lambda: now[0])
    store.put(("s",), "a", {"text": "expires soon"})
    store.put(("s",), "b", {"text": "kept alive by reads"})
    store.put(("s",), "c", {"text": "never expires"}, ttl=None)
    now[0] += 45
    assert store.get(("s",), "b") is not None  # refreshes b's TTL
    assert store.get(("s",), "a", refresh_ttl=False) is not None
    now[0] += 30  # a: 75 s since its put; b: 30 s since its read
    assert store.get(("s",), "a") is None
    assert {i.key for i in store.search(("s",), query="expires")} == {"b", "c"}
    assert len(store._vectors.index) == 2  # a's vector went with it
    now[0] += 3600
    assert [i.key for i in store.search(("s",))] == ["c"]
    assert store.sweep_ttl() == 0


def test_bad_input_is_typed_and_changes_nothing(lc_embeddings: GPUPromptEmbeddings) -> None:
    store = GPUPromptStore(index={"embed": lc_embeddings, "fields": ["text"]})
    store.put(("a",), "k", {"text": "kept"})
    with pytest.raises(InvalidInputError, match="JSON-representable"):
        store.batch([PutOp(("a",), "k", {"text": "new"}), PutOp(("a",), "bad", {"x": object()})])
    assert store.get(("a",), "k").value == {"text": "kept"}
    assert store.get(("a",), "bad") is None
    with pytest.raises(FilterError):
        store.search(("a",), filter={"text": {"$regex": "k.*"}})
    with pytest.raises(InvalidInputError, match="'limit' must be an int"):
        store.search(("a",), limit=-1)
    with pytest.raises(InputTypeError):
        store.batch(["not an op"])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError):
        GPUPromptStore(index="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        GPUPromptStore(ttl={"default_ttl": -1})


def test_works_as_langgraph_long_term_memory(lc_embeddings: GPUPromptEmbeddings) -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.runtime import Runtime

    class State(TypedDict):
        user: str
        message: str
        recalled: list[str]

    def remember(state: State, runtime: Runtime) -> dict[str, Any]:
        runtime.store.put(("users", state["user"], "memories"), str(len(state["message"])), {"text": state["message"]})
        return {}

    def recall(state: State, runtime: Runtime) -> dict[str, Any]:
        found = runtime.store.search(("users", state["user"], "memories"), query="clothing size", limit=1)
        return {"recalled": [item.value["text"] for item in found]}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    graph = builder.compile(store=GPUPromptStore(index={"embed": lc_embeddings, "fields": ["text"]}))
    graph.invoke({"user": "7", "message": "I wear size 38 shoes and size M shirts", "recalled": []})
    out = graph.invoke({"user": "7", "message": "Please ship to Oslo", "recalled": []})
    assert out["recalled"] == ["I wear size 38 shoes and size M shirts"]
