"""RemoteIndex against a live ``gpuprompt serve``: the same answers as an in-process VectorIndex on the
same records (search, filters, MMR, grouped search, get, ids, delete, upsert-replace), the server's
caps and data dir durability on vector upserts, embedder records carried over HTTP, typed errors."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from gpuprompt import VectorIndex
from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    DimensionMismatchError,
    EmbedderMismatchError,
    EngineDeadError,
    EngineError,
    FilterError,
    InputTypeError,
    InvalidInputError,
)
from gpuprompt.index import load_index
from gpuprompt.remote import RemoteIndex

FILTERS = [
    {"type": "dress"},
    {"price": {"$lt": 60}},
    {"$or": [{"type": "coat"}, {"material": "wool"}]},
    {"colour": {"$in": ["red", "teal"]}, "price": {"$gte": 40}},
    {"wash": {"$contains": "hand"}},
    {"$not": {"type": "jeans"}},
    {"name": {"$icontains": "AURORA"}},
    # operands past int64 are compared exactly in process (no stored int can equal one): the same here
    {"price": {"$lt": 2**70}},
    {"price": {"$in": [2**70, 40, 55]}},
    {"$not": {"price": -(2**70)}},
]


def _name() -> str:
    return f"t-{uuid.uuid4().hex}"


def _same(got: Any, want: Any) -> bool:
    """Hit lists (nested any depth) with the same records in the same order, scores equal to float32
    rounding (a search batched with others may round its last bit differently)."""
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return (got.id, got.document, got.metadata) == (want.id, want.document, want.metadata) and abs(
        got.score - want.score) < 1e-5


@pytest.fixture(scope="module")
def catalogue(embedder):
    """60 products: ids, texts, metadata and their vectors (the server's model)."""
    from gpuprompt.apps.demo import catalogue

    products = catalogue(60)
    texts = [p["text"] for p in products]
    return [p["id"] for p in products], embedder.embed(texts), texts, [p["metadata"] for p in products]


@pytest.fixture
def pair(live: Any, catalogue, embedder) -> Iterator[tuple[RemoteIndex, VectorIndex]]:
    """A fresh server collection and an in-process index holding the same records."""
    ids, vectors, texts, metadatas = catalogue
    remote = RemoteIndex(live.url, collection=_name())
    local = VectorIndex(384)
    for index in (remote, local):
        assert index.add(ids, vectors, texts, metadatas, embedder=embedder.identity) == ids
    yield remote, local
    remote.clear()
    remote.close()
    local.close()


@pytest.fixture
def queries(embedder) -> np.ndarray:
    return embedder.embed(["a warm wool coat for winter", "red summer dress", "cheap jeans", "silk shirt"])


def test_search_filters_mmr_and_groups_equal_an_in_process_index(pair, queries) -> None:
    remote, local = pair
    assert remote.count == local.count == len(remote) == 60
    for k in (1, 5, 100):
        assert _same(remote.search(queries, k), local.search(queries, k))
    for filter in FILTERS:
        found = remote.search(queries, 7, filter=filter)
        assert _same(found, local.search(queries, 7, filter=filter))
        assert all(len(hits) == min(7, len(local.ids(filter))) for hits in found)  # never short
        assert remote.ids(filter) == local.ids(filter)
    for lambda_mult, fetch_k in ((0.0, 20), (0.3, 10), (1.0, 60)):
        assert _same(remote.mmr(queries[0], 4, fetch_k, lambda_mult), local.mmr(queries[0], 4, fetch_k, lambda_mult))
    assert _same(remote.mmr(queries[1], 3, filter={"type": "dress"}), local.mmr(queries[1], 3, filter={"type": "dress"}))
    assert _same(remote.search_groups(queries[2], 4, group_by="type"), local.search_groups(queries[2], 4, group_by="type"))
    assert _same(remote.search(queries[:1], 2**62), local.search(queries[:1], 2**62))  # k past the collection: all
    assert remote.search(np.empty((0, 384)), 3) == [] and _same(remote.search(queries[0], 2), local.search(queries[0], 2))


def test_get_ids_delete_and_upsert_replace_equal_an_in_process_index(pair, queries, embedder) -> None:
    remote, local = pair
    wanted = ["P000007", "missing", "P000003", "P000007"]
    assert remote.get(wanted) == local.get(wanted)  # order asked, missing skipped, repeats kept
    [record] = remote.get(["P000003"])
    assert record.vector.dtype == np.float32 and record.metadata["type"] == local.get(["P000003"])[0].metadata["type"]
    assert remote.ids() == local.ids()
    for index in (remote, local):
        assert index.delete(["P000001", "P000001", "nope", "P000002"]) == 2
    replacement = embedder.embed(["a renamed product", "a brand new product"])
    args = (["P000005", "new-1"], replacement, ["renamed", "new"], [{"type": "renamed"}, None])
    for index in (remote, local):
        assert index.add(*args, embedder=embedder.identity) == ["P000005", "new-1"]
        # an id repeated within one add: its last record wins
        assert index.add(["dup", "dup"], replacement, ["first", "second"]) == ["dup", "dup"]
    assert remote.count == local.count == 60
    assert remote.get(["P000005", "new-1", "dup"]) == local.get(["P000005", "new-1", "dup"])
    assert remote.ids() == local.ids()
    assert _same(remote.search(queries, 10, filter={"type": {"$ne": "dress"}}),
                 local.search(queries, 10, filter={"type": {"$ne": "dress"}}))
    generated = remote.add([None], replacement[:1])
    assert len(generated[0]) == 32 and remote.get(generated)[0].document is None


async def test_async_twins_and_concurrent_searches_share_requests(pair, queries) -> None:
    remote, local = pair
    await remote.asearch(queries[:1], 3)  # start the search queue
    before = remote.stats().batcher
    answers = await asyncio.gather(*(remote.asearch(queries[i % 4], 3, filter=FILTERS[i % 3]) for i in range(16)))
    assert _same(answers, [local.search(queries[i % 4], 3, filter=FILTERS[i % 3]) for i in range(16)])
    after = remote.stats().batcher
    assert after.batches - before.batches < 16 and after.max_batch_size > 1  # fewer requests than searches
    assert _same(await remote.ammr(queries[0], 3, 12, 0.4), local.mmr(queries[0], 3, 12, 0.4))
    assert _same(await remote.asearch_groups(queries[1], 3, group_by=["type"]),
                 local.search_groups(queries[1], 3, group_by=["type"]))
    assert await remote.aids({"type": "coat"}) == local.ids({"type": "coat"})
    assert await remote.aget(["P000010"]) == local.get(["P000010"])
    assert await remote.adelete(["P000010", "P000011"]) == 2
    assert await remote.aadd(["P000010"], queries[:1], ["back"]) == ["P000010"]
    assert await remote.acount() == 59
    await remote.aclear()
    assert await remote.acount() == 0


def test_bad_input_raises_the_in_process_errors(pair, queries) -> None:
    remote, local = pair
    for index in (remote, local):
        with pytest.raises(DimensionMismatchError) as info:
            index.add(["x"], np.ones((1, 5)))
        assert (info.value.expected, info.value.got) == (384, 5)
        with pytest.raises(DimensionMismatchError):
            index.search(np.ones((1, 10)), 3)
        with pytest.raises(FilterError, match=r"\$bogus"):
            index.search(queries, 3, filter={"price": {"$bogus": 1}})
        with pytest.raises(InvalidInputError, match="'k' must be an int >= 1"):
            index.search(queries, 0)
        with pytest.raises(InvalidInputError, match="must be finite"):
            index.add(["x"], np.full((1, 384), np.nan))
        with pytest.raises(InvalidInputError, match="'query' must be one vector"):
            index.mmr(queries, 2)
        with pytest.raises(InputTypeError, match="'ids' must be a list of str"):
            index.get("P000001")
        with pytest.raises(InvalidInputError, match="same length"):
            index.add(["a", "b"], queries[:1])
    assert remote.count == 60


def test_a_bad_filter_fails_before_any_request(dead_url) -> None:
    index = RemoteIndex(dead_url, collection="anything", max_retries=0)
    with pytest.raises(FilterError):
        index.ids({"$or": "not a list"})
    with pytest.raises(InputTypeError):
        index.delete("one-id")
    with pytest.raises(EngineDeadError, match="could not connect"):
        index.count  # noqa: B018 - the property makes the request


def test_another_dimension_or_metric_is_refused_at_first_use(live: Any) -> None:
    wide = RemoteIndex(live.url, collection=_name(), dim=512)  # constructing connects to nothing
    assert wide.dim == 512
    with pytest.raises(ConfigurationError, match=r"dim=384.*asked for dim=512"):
        wide.add(["a"], np.ones((1, 512)))
    l2 = RemoteIndex(live.url, collection=_name(), metric="l2")
    with pytest.raises(ConfigurationError, match=r"metric='cosine'.*metric='l2'"):
        l2.search(np.ones((1, 384)), 1)
    assert RemoteIndex(live.url, collection=_name()).dim == 384
    with pytest.raises(ConfigurationError, match="'collection' must be a collection name"):
        RemoteIndex(live.url, collection="no/slashes")
    with pytest.raises(ConfigurationError, match="needs a server"):
        RemoteIndex(collection="kb")
    with pytest.raises(ConfigurationError, match="'metric' must be one of"):
        RemoteIndex(live.url, collection="kb", metric="dot")


def test_embedder_records_travel_and_mismatches_are_refused(live: Any, catalogue, embedder) -> None:
    ids, vectors, texts, _ = catalogue
    served = embedder.identity
    fresh = RemoteIndex(live.url, collection=_name())
    # A new collection belongs to the server's embedder: others are refused, and nothing is created.
    with pytest.raises(EmbedderMismatchError) as info:
        fresh.add(ids[:2], vectors[:2], embedder="another-model")
    assert (info.value.expected, info.value.got) == (served, "another-model")
    assert fresh.count == 0 and fresh.embedder is None
    # The server refuses it too (a client that skipped the check): 400, and still nothing stored.
    with httpx.Client(base_url=live.url) as http:
        raw = http.post(f"/v1/collections/{fresh.collection}/records", json={
            "ids": ["x"], "vectors": [vectors[0].tolist()], "embedder": "another-model"})
        assert raw.status_code == 400 and "another-model" in raw.json()["error"]["message"]
        assert fresh.collection not in {c["name"] for c in http.get("/v1/collections").json()["data"]}
    assert fresh.add(ids[:2], vectors[:2], texts[:2], embedder=served) == ids[:2]
    assert fresh.embedder == served
    with pytest.raises(EmbedderMismatchError):
        fresh.add(["other"], vectors[:1], embedder="another-model")
    assert fresh.add(["other"], vectors[:1], embedder="another-model", allow_other_embedder=True) == ["other"]
    assert fresh.count == 3 and fresh.embedder == served  # mixing allowed, the record kept
    fresh.add(["plain"], vectors[:1])  # vectors of no named embedder: taken, as in process
    # The server's own /documents route still embeds into it (the same embedder).
    with httpx.Client(base_url=live.url) as http:
        assert http.post(f"/v1/collections/{fresh.collection}/documents",
                         json={"documents": ["served text"], "ids": ["served"]}).status_code == 200
    assert fresh.count == 5
    fresh.clear()  # drops the collection: its embedder record goes too
    assert fresh.embedder is None and fresh.count == 0


def test_an_absent_collection_reads_empty_and_clear_drops_it(live: Any, queries) -> None:
    index = RemoteIndex(live.url, collection=_name())
    assert (index.count, index.ids(), index.get(["a"]), index.delete(["a"])) == (0, [], [], 0)
    assert index.search(queries, 3) == [[], [], [], []] and index.mmr(queries[0], 2) == []
    index.add(["a", "b"], queries[:2])
    with httpx.Client(base_url=live.url) as http:
        listed = {c["name"]: c["count"] for c in http.get("/v1/collections").json()["data"]}
        assert listed[index.collection] == 2
        index.clear()
        assert index.collection not in {c["name"] for c in http.get("/v1/collections").json()["data"]}
    index.clear()  # clearing nothing is fine
    index.close()
    with pytest.raises(ClosedError):
        index.search(queries, 1)


def test_save_writes_a_local_snapshot_that_load_index_reopens(pair, queries, tmp_path) -> None:
    remote, local = pair
    remote.delete(["P000000"])
    local.delete(["P000000"])
    remote.save(tmp_path / "copy")
    copy = load_index(tmp_path / "copy", device="cpu")
    assert isinstance(copy, VectorIndex) and copy.count == 59 and copy.config.embedder == remote.embedder
    assert _same(copy.search(queries, 5, filter={"price": {"$lt": 100}}),
                 local.search(queries, 5, filter={"price": {"$lt": 100}}))
    assert copy.get(["P000004"]) == local.get(["P000004"])


@pytest.fixture(scope="session")
def start_server(live: Any) -> Callable[..., Any]:
    """``create_app(**options)`` served on a free loopback port (conftest's server class)."""
    from gpuprompt.server import create_app

    return lambda **options: type(live)(create_app(**options)).start()


@pytest.fixture(scope="module")
def capped(embedder, remote_llm_engine, start_server) -> Iterator[Any]:
    server = start_server(embedder=embedder, llm=remote_llm_engine, max_collection_records=5, max_collections=2)
    yield server
    server.stop()


def test_vector_upserts_keep_the_servers_caps(capped: Any, queries) -> None:
    vectors = np.concatenate([queries, queries[:2]])
    first = RemoteIndex(capped.url, collection="first")
    assert first.add([f"r{i}" for i in range(5)], vectors[:5]) == [f"r{i}" for i in range(5)]
    with pytest.raises(InvalidInputError, match="limit of 5 records"):
        first.add(["r5"], vectors[5:6])
    assert first.count == 5
    first.add(["r0", "r1"], vectors[4:6], ["replaced", "replaced"])  # replacing takes no room
    assert [r.document for r in first.get(["r0", "r1"])] == ["replaced", "replaced"] and first.count == 5
    with pytest.raises(InvalidInputError, match="limit of 5 records"):
        RemoteIndex(capped.url, collection="second").add([f"s{i}" for i in range(6)], vectors)
    RemoteIndex(capped.url, collection="second").add(["s0"], vectors[:1])
    with pytest.raises(InvalidInputError, match="limit of 2 collections"):
        RemoteIndex(capped.url, collection="third").add(["t0"], vectors[:1])


def test_vector_upserts_and_deletes_outlive_a_data_dir_server(embedder, remote_llm_engine, catalogue, queries,
                                                              start_server, tmp_path) -> None:
    ids, vectors, texts, metadatas = catalogue
    options = {"embedder": embedder, "llm": remote_llm_engine, "data_dir": str(tmp_path / "data"), "checkpoint_every": 7}
    server = start_server(**options)
    try:
        index = RemoteIndex(server.url, collection="durable")
        for start in range(0, 60, 10):  # several logged writes, a checkpoint among them
            index.add(ids[start:start + 10], vectors[start:start + 10], texts[start:start + 10],
                      metadatas[start:start + 10], embedder=embedder.identity)
        index.delete(ids[:5])
        index.add(["mixed"], queries[:1], embedder="another-model", allow_other_embedder=True)
        before = (index.ids(), index.get(ids[5:9]), index.search(queries, 6, filter={"type": "coat"}))
    finally:
        server.stop()
    server = start_server(**options)  # replays the log over the last snapshot
    try:
        again = RemoteIndex(server.url, collection="durable")
        assert (again.ids(), again.get(ids[5:9])) == before[:2]
        assert _same(again.search(queries, 6, filter={"type": "coat"}), before[2])
        assert again.count == 56 and again.embedder == embedder.identity
    finally:
        server.stop()


def test_the_raw_routes_validate_their_bodies(live: Any) -> None:
    name = _name()
    with httpx.Client(base_url=live.url) as http:
        def error(path: str, body: dict) -> dict:
            reply = http.post(f"/v1/collections/{name}/records{path}", json=body)
            assert reply.status_code == 400, reply.text
            return reply.json()["error"]

        assert "repeat an id" in error("", {"ids": ["a", "a"], "vectors": [[0.0] * 384] * 2})["message"]
        assert "dimension 384" in error("", {"ids": ["a"], "vectors": [[0.0] * 3]})["message"]
        assert "dimension 384" in error("", {"ids": ["a"], "vectors": "AAAAAA=="})["message"]
        assert "not base64" in error("", {"ids": ["a"], "vectors": "***"})["message"]
        assert error("", {"ids": ["a"], "vectors": [["0.5"] * 384]})["param"] == "vectors"  # no numbers as text
        assert error("", {"ids": ["a"], "vectors": [[0.0] * 384], "allow_other_embedder": "yes"})["param"] == (
            "allow_other_embedder")
        assert error("", {"ids": ["a"], "vectors": [[0.0] * 384], "extra": 1})["param"] == "extra"
        assert error("/search", {"searches": [{"queries": [[0.0] * 384], "k": 0}]})["param"] == "searches[0].k"
        assert error("/ids", {"filter": {"$bogus": 1}})["code"] == "invalid_filter"
        assert "one vector for MMR" in error("/search", {"searches": [{
            "queries": [[0.0] * 384] * 2, "k": 3, "mmr": {"k": 1, "lambda_mult": 0.5}}]})["message"]
        info = http.get(f"/v1/collections/{name}/records/info").json()
        assert info == {"object": "collection.records.info", "collection": name, "exists": False, "count": 0,
                        "dim": 384, "metric": "cosine", "embedder": None, "server_embedder": info["server_embedder"]}
        assert http.get("/v1/collections/bad name/records/info").status_code in (400, 404, 422)


def test_api_key_is_sent_and_a_wrong_one_is_refused(live_keyed: Any, queries) -> None:
    index = RemoteIndex(live_keyed.url, api_key="sesame", collection=_name())
    index.add(["a"], queries[:1])
    assert index.search(queries[:1], 1)[0][0].id == "a"
    index.clear()
    with pytest.raises(EngineError, match="api_key"):
        RemoteIndex(live_keyed.url, api_key="wrong", collection="x").count  # noqa: B018


def test_the_collection_name_pattern_is_the_servers() -> None:
    from gpuprompt.remote._index import COLLECTION_NAME_PATTERN
    from gpuprompt.wire import COLLECTION_NAME_PATTERN as SERVER_PATTERN

    assert COLLECTION_NAME_PATTERN == SERVER_PATTERN
