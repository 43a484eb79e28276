"""GPUPromptStore in remote mode against a live ``gpuprompt serve``: the same answers as the store
in process (tests/langchain/test_lc_store.py's items and reads), two stores in two places sharing
one server collection, TTL on the wall clock, construction rules, and a worker that imports no torch."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from langgraph.store.base import ListNamespacesOp, PutOp, SearchOp

from gpuprompt.errors import ConfigurationError
from gpuprompt.remote import RemoteIndex
from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptStore


def _load(name: str, path: Path) -> ModuleType:
    """A test module loaded by path (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lc_store = _load("_lc_store_cases", Path(__file__).resolve().parents[1] / "langchain" / "test_lc_store.py")


@pytest.fixture
def fresh(live) -> Iterator[str]:
    """A new collection name; its two server collections are dropped after the test."""
    name = f"store-{uuid.uuid4().hex[:16]}"
    yield name
    for collection in (name, f"{name}.items"):
        RemoteIndex(live.url, collection=collection).clear()


@pytest.fixture(scope="module")
def local_embeddings() -> GPUPromptEmbeddings:
    """The in-process embeddings on the bundled MiniLM (the server's model)."""
    embeddings = GPUPromptEmbeddings()
    embeddings.embedder.load()
    return embeddings


def _assert_same(expected: list[Any], got: list[Any], ops: list[Any]) -> None:
    assert len(got) == len(expected)
    for op, want, have in zip(ops, expected, got):
        assert lc_store._norm(have) == lc_store._norm(want), op
        if isinstance(op, SearchOp) and op.query:
            assert lc_store._scores(have) == pytest.approx(lc_store._scores(want), abs=1e-4), op


# ---------------------------------------------------------------------- same answers as in process
@pytest.mark.parametrize("fields", [["text"], ["text", "tags[*]"]])
def test_same_answers_as_the_store_in_process(live, fresh, local_embeddings, fields: list[str]) -> None:
    ours = GPUPromptStore(index={"embed": local_embeddings, "fields": fields})
    remote = GPUPromptStore(index={"fields": fields}, base_url=live.url, collection=fresh)
    for store in (ours, remote):
        for namespace, key, value in lc_store.MEMORIES:
            store.put(namespace, key, value)
        store.put(("users", "43", "memories"), "secret", {"text": "not searchable", "kind": "fact", "weight": 0},
                  index=False)
    reads = [*lc_store.READ_OPS, SearchOp(("users",), query="who knits?", limit=3)]
    _assert_same(ours.batch(reads), remote.batch(reads), reads)

    writes = [
        PutOp(("users", "42", "memories"), "m2", {"text": "moved to Bergen", "kind": "fact", "weight": 2}),
        PutOp(("users", "43", "memories"), "m1", {"text": "likes wool and knits scarves", "weight": 5}),
        PutOp(("users", "42", "memories"), "m3", None),
        PutOp(("shop", "faq"), "shipping", None),
        PutOp(("shop", "faq"), "returns", None),  # the namespace goes with its last item
    ]
    ours.batch(writes)
    remote.batch(writes)
    _assert_same(ours.batch(reads), remote.batch(reads), reads)
    # Re-indexing dropped the old vectors on the server too: one vector per indexed text.
    vectors = RemoteIndex(live.url, collection=fresh)
    assert all(json.loads(i)[:2] != [["users", "42", "memories"], "m3"] for i in vectors.ids())


def test_listing_order_is_the_in_process_one(live, fresh) -> None:
    # Namespaces by creation (emptied and filled again: new), items by creation, also under a
    # filter that leaves out a namespace's first item.
    ours = GPUPromptStore(index=False)
    remote = GPUPromptStore(index=False, base_url=live.url, collection=fresh)
    batches = [
        [PutOp(("u", "a"), "1", {"kind": "x"})],
        [PutOp(("u", "b"), "1", {"kind": "fact"}), PutOp(("u", "c"), "1", {"kind": "fact"})],
        [PutOp(("u", "a"), "2", {"kind": "fact"}), PutOp(("u", "b"), "0", {"kind": "fact"})],
        [PutOp(("u", "c"), "1", None), PutOp(("u", "c"), "2", {"kind": "fact"})],  # c emptied, then new
        [PutOp(("u", "a"), "1", {"kind": "fact"})],  # an update keeps its place
    ]
    reads = [SearchOp(("u",), filter={"kind": "fact"}), SearchOp(("u",)), SearchOp(("u",), limit=2, offset=2),
             ListNamespacesOp()]
    for batch in batches:
        ours.batch(batch)
        remote.batch(batch)
        _assert_same(ours.batch(reads), remote.batch(reads), reads)


def test_async_answers_equal_the_sync_ones(live, fresh) -> None:
    store = GPUPromptStore(index={"fields": ["text"]}, base_url=live.url, collection=fresh)

    async def main() -> tuple[Any, Any, Any]:
        await asyncio.gather(*(store.aput(ns, key, value) for ns, key, value in lc_store.MEMORIES))
        found = await store.asearch(("users",), query="fabric they like", limit=2)
        item = await store.aget(("shop", "faq"), "returns")
        spaces = await store.alist_namespaces(prefix=("users",), max_depth=2)
        return found, item, spaces

    found, item, spaces = asyncio.run(main())
    assert [(r.key, r.score) for r in found] == [(r.key, r.score) for r in
                                                 store.search(("users",), query="fabric they like", limit=2)]
    assert item is not None and item.value["tags"] == ["returns", "policy"]
    assert spaces == [("users", "42"), ("users", "43")]


# ---------------------------------------------------------------------- sharing
def test_two_stores_share_one_server_collection(live, fresh) -> None:
    writer = GPUPromptStore(index={"fields": ["text"]}, base_url=live.url, collection=fresh)
    reader = GPUPromptStore(index={"fields": ["text"]}, base_url=live.url, collection=fresh)
    writer.put(("users", "42"), "m1", {"text": "prefers cotton dresses", "kind": "preference"})
    writer.put(("users", "42"), "m2", {"text": "lives in Oslo", "kind": "fact"})
    got = reader.get(("users", "42"), "m1")
    assert got is not None and got.value == {"text": "prefers cotton dresses", "kind": "preference"}
    assert [r.key for r in reader.search(("users",), query="what fabric?", limit=1)] == ["m1"]
    assert reader.search(("users",), filter={"kind": "fact"})[0].key == "m2"
    assert reader.list_namespaces() == [("users", "42")]

    reader.put(("users", "42"), "m1", {"text": "now prefers linen", "kind": "preference"})  # an update keeps created_at
    again = writer.get(("users", "42"), "m1")
    assert again is not None and again.value["text"] == "now prefers linen"
    assert again.created_at == got.created_at and again.updated_at > got.updated_at
    reader.delete(("users", "42"), "m2")
    assert writer.get(("users", "42"), "m2") is None
    assert [r.key for r in writer.search(("users",), query="where do they live?")] == ["m1"]
    assert "collection='" in repr(writer) and "items=1" in repr(writer)


def test_a_plain_key_value_store_on_the_server(live, fresh) -> None:
    store = GPUPromptStore(index=False, base_url=live.url, collection=fresh)
    store.put(("a",), "k", {"n": 1})
    store.put(("a", "b"), "k", {"n": 2})
    assert [r.value for r in GPUPromptStore(index=False, base_url=live.url, collection=fresh).search(("a",))] == [
        {"n": 1}, {"n": 2}]
    assert store.batch([ListNamespacesOp(max_depth=1)]) == [[("a",)]]


# ---------------------------------------------------------------------- TTL
def test_ttl_expires_for_every_store_on_the_server(live, fresh) -> None:
    now = [1_000_000.0]
    options = {"index": {"fields": ["text"]}, "ttl": {"default_ttl": 1.0, "refresh_on_read": True},
               "base_url": live.url, "collection": fresh, "clock": lambda: now[0]}
    one, two = GPUPromptStore(**options), GPUPromptStore(**options)
    one.put(("u",), "a", {"text": "short lived"})
    one.put(("u",), "b", {"text": "kept"}, ttl=None)
    now[0] += 50
    assert two.get(("u",), "a") is not None  # read with refresh: expires 60 s from now
    now[0] += 50
    assert one.get(("u",), "a", refresh_ttl=False) is not None
    now[0] += 11
    assert two.get(("u",), "a") is None
    assert [r.key for r in one.search(("u",), query="short lived")] == ["b"]
    assert len(RemoteIndex(live.url, collection=fresh)) == 1  # the expired item's vector went with it


# ---------------------------------------------------------------------- construction
def test_construction_rules(live, monkeypatch) -> None:
    monkeypatch.delenv("GPUPROMPT_URL", raising=False)
    with pytest.raises(ConfigurationError, match="no server"):
        GPUPromptStore(collection="kb")
    with pytest.raises(ConfigurationError, match="in-process option"):
        GPUPromptStore(base_url=live.url, device="cpu")
    with pytest.raises(ConfigurationError, match="collection"):
        GPUPromptStore(base_url=live.url, collection="bad name")
    assert GPUPromptStore(base_url=live.url).collection == "langgraph_store"
    monkeypatch.setenv("GPUPROMPT_URL", live.url)
    assert GPUPromptStore(index=False).collection is None  # the env alone keeps the items in process
    assert GPUPromptStore(index=False, collection="kb").collection == "kb"


# ---------------------------------------------------------------------- the worker process
def test_a_remote_store_worker_imports_no_torch(live, fresh) -> None:
    code = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from langchain_gpuprompt import GPUPromptStore

        store = GPUPromptStore(index={{"fields": ["text"]}}, collection={fresh!r})
        store.put(("users", "42"), "m1", {{"text": "prefers cotton dresses"}})
        asyncio.run(store.aput(("users", "42"), "m2", {{"text": "lives in Oslo"}}))
        out = {{"keys": [r.key for r in store.search(("users",), query="what fabric?", limit=2)]}}
        heavy = ("torch", "transformers", "sentence_transformers", "vllm", "faiss", "safetensors", "accelerate")
        out["heavy"] = sorted(m for m in heavy if m in sys.modules)
        print(json.dumps(out))
        """
    )
    env = {**os.environ, "GPUPROMPT_URL": live.url, "HF_HUB_OFFLINE": "1"}
    env.pop("GPUPROMPT_API_KEY", None)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"keys": ["m1", "m2"], "heavy": []}
    assert GPUPromptStore(base_url=live.url, collection=fresh).get(("users", "42"), "m2") is not None


def test_the_largest_value_accepted_round_trips_through_the_server(live, fresh) -> None:
    # The store bounds a value so that its records are never refused later; on the server the item
    # record carries two more metadata fields than the vector records: it must still fit.
    from gpuprompt.validation import MAX_NODES
    from gpuprompt.errors import InvalidInputError
    from langchain_gpuprompt._store import _check_put

    namespace = ("a", "b", "c")
    value: dict[str, Any] = {}
    for size in range(MAX_NODES - 20, MAX_NODES):
        candidate = {f"k{i}": i for i in range(size)}
        try:
            _check_put(PutOp(namespace, "big", candidate), "")
        except InvalidInputError:
            break
        value = candidate
    assert value and len(value) < MAX_NODES - 1, "no limit found near MAX_NODES"
    store = GPUPromptStore(index={"fields": ["k0"]}, base_url=live.url, collection=fresh)
    store.put(namespace, "big", value, index=["k0"])
    got = store.get(namespace, "big")
    assert got is not None and got.value == value
