"""MilvusIndex conformance on Milvus Lite: the VectorIndex contract (upsert, delete, get, ids, search
scores per metric, MMR, groups, async twins, typed errors that change nothing), coalesced concurrent
searches, the save/load pointer, options and schema checks."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import socket
import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest

pytest.importorskip("pymilvus")
if importlib.util.find_spec("milvus_lite") is None:
    pytest.skip("milvus-lite is not installed", allow_module_level=True)

from gpuprompt import VectorIndex
from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    DimensionMismatchError,
    FilterError,
    InputTypeError,
    InvalidInputError,
    SnapshotError,
)
from gpuprompt.index import IndexLike, MilvusIndex, check_index, load_index
from index_helpers import check_mmr_batched_with_a_larger_search

DIM = 8


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One Milvus Lite file for the module; each test takes its own collection."""
    return str(tmp_path_factory.getbasetemp() / "milvus_index.db")


def fresh(uri: str, **options) -> MilvusIndex:
    return MilvusIndex(options.pop("dim", DIM), uri=uri, collection=f"c_{uuid.uuid4().hex}", **options)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((60, DIM)).astype(np.float32)
    metas = [{"i": i, "group": i % 5, "tags": [f"t{i % 3}"], "half": i % 2 == 0} for i in range(60)]
    return {
        "ids": [f"d{i}" for i in range(60)],
        "vectors": vectors,
        "docs": [f"doc {i}" for i in range(60)],
        "metas": metas,
        "queries": rng.standard_normal((4, DIM)).astype(np.float32),
    }


def test_construction_connects_to_nothing_and_importing_loads_no_pymilvus(tmp_path) -> None:
    code = (
        "import sys, gpuprompt\n"
        "from gpuprompt import MilvusIndex\n"
        f"MilvusIndex(4, uri={str(tmp_path / 'x.db')!r}, scalar_fields={{'a': 'str'}})\n"
        "print('pymilvus' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False False"
    assert not (tmp_path / "x.db").exists()


def test_both_indexes_are_index_like(uri) -> None:
    index = fresh(uri)
    assert check_index(index) is index and check_index(VectorIndex(DIM)) is not None
    assert isinstance(VectorIndex(DIM), IndexLike)
    with pytest.raises(ConfigurationError, match="'index' must be a gpuprompt.VectorIndex"):
        check_index("not an index")


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_search_matches_vector_index_scores_and_order(uri, data, metric: str) -> None:
    milvus = fresh(uri, metric=metric, index_type="FLAT")
    local = VectorIndex(DIM, metric=metric, backend="torch", device="cpu")
    for index in (milvus, local):
        assert index.add(data["ids"], data["vectors"], documents=data["docs"], metadatas=data["metas"]) == data["ids"]
    got, want = milvus.search(data["queries"], k=7), local.search(data["queries"], k=7)
    for g, w in zip(got, want):
        assert [h.id for h in g] == [h.id for h in w]
        np.testing.assert_allclose([h.score for h in g], [h.score for h in w], rtol=1e-4, atol=1e-4)
        assert [(h.document, h.metadata) for h in g] == [(h.document, h.metadata) for h in w]
    if metric == "l2":
        assert all(0 < h.score <= 1 for row in got for h in row)
    milvus.close()


def test_hnsw_default_finds_the_exact_neighbours_on_a_small_collection(uri, data) -> None:
    milvus = fresh(uri)
    assert milvus.options.index_type == "HNSW"
    milvus.add(data["ids"], data["vectors"])
    local = VectorIndex(DIM, backend="torch", device="cpu")
    local.add(data["ids"], data["vectors"])
    got = [[h.id for h in row] for row in milvus.search(data["queries"], k=10)]
    assert got == [[h.id for h in row] for row in local.search(data["queries"], k=10)]


def test_upsert_delete_get_ids_count(uri, data) -> None:
    index = fresh(uri)
    assert len(index) == 0 and index.search(data["queries"][0], k=3) == [[]]
    index.add(["a", "b", "a"], data["vectors"][:3], documents=["x", "y", "z"], metadatas=[{"n": 1}, None, {"n": 3}])
    assert index.count == 2 and sorted(index.ids()) == ["a", "b"]
    [a, b, a2] = index.get(["a", "b", "a"])
    assert a.document == "z" and a.metadata == {"n": 3} and b.metadata == {} and a2 == a
    np.testing.assert_array_equal(a.vector, data["vectors"][2])
    assert index.get(["missing"]) == [] and index.get([]) == []
    generated = index.add(None, data["vectors"][3:5])
    assert len(generated) == 2 and all(len(key) == 32 for key in generated)
    assert index.delete(["a", "a", "missing"]) == 1
    assert sorted(index.ids()) == sorted(["b", *generated])
    assert index.search(data["vectors"][:1], k=10)[0][0].id != "a"
    index.clear()
    assert len(index) == 0 and index.ids() == []
    index.add(["c"], data["vectors"][:1])
    assert index.ids() == ["c"]


def test_ids_with_quotes_and_backslashes_are_read_and_deleted_exactly(uri, data) -> None:
    """pymilvus's ``ids=`` pastes an id between quotes as it is: ``O'Brien`` broke the expression, and a
    crafted id (``x', 'victim``) selected, then deleted, other records. Ids are spelled as escaped
    literals now, so each selects itself only, as in the in-process index."""
    odd = ["cust-O'Brien", "C:\\orders\\7", 'q\\"', 'say "hi"', "{ids}", "unicodé 😀", "victim", "other"]
    index = fresh(uri)
    reference = VectorIndex(DIM)
    for target in (index, reference):
        target.add(odd, data["vectors"][: len(odd)], documents=[f"doc of {key}" for key in odd])
    assert [r.id for r in index.get(odd)] == odd
    assert [r.document for r in index.get(["cust-O'Brien", 'q\\"'])] == ["doc of cust-O'Brien", 'doc of q\\"']
    for crafted in (["nope', 'victim', 'other"], ['nope", "victim'], ["x'] or id != ['"]):
        assert index.get(crafted) == [] and index.delete(crafted) == 0 == reference.delete(crafted)
    assert sorted(index.ids()) == sorted(odd)
    gone = ["cust-O'Brien", "C:\\orders\\7", 'q\\"']
    assert index.delete(gone) == 3 == reference.delete(gone)
    assert sorted(index.ids()) == sorted(reference.ids())
    index.lexical_search(["doc"], k=2)  # after a lexical search an add reads the replaced rows first
    index.add(["it's-new", 'say "hi"'], data["vectors"][:2], documents=["new", "replaced"])
    assert [r.document for r in index.get(["it's-new", 'say "hi"'])] == ["new", "replaced"]
    assert len(index) == len(odd) - 3 + 1
    with pytest.raises(InvalidInputError, match=r"ids\[1\].*control character \(U\+000A\)"):
        index.add(["fine", "line\nbreak"], data["vectors"][:2])
    assert index.get(["fine"]) == [] and len(index) == len(odd) - 2


def test_reads_load_a_released_collection_again(uri, data) -> None:
    """A Milvus server that restarts brings collections back released; a long-lived handle (a server's)
    loads it again on its next read rather than failing every read until its process restarts."""
    index = fresh(uri)
    index.add(data["ids"][:5], data["vectors"][:5], documents=data["docs"][:5])
    expected = [hit.id for hit in index.search(data["queries"][0], k=3)[0]]
    raw = index._ensure()._client  # the pymilvus client under the typed proxy
    for read in (lambda: [hit.id for hit in index.search(data["queries"][0], k=3)[0]],
                 lambda: [record.id for record in index.get(data["ids"][:2])],
                 lambda: sorted(index.ids())):
        raw.release_collection(index.options.collection)
        assert read() in (expected, data["ids"][:2], sorted(data["ids"][:5]))
    raw.release_collection(index.options.collection)
    assert index.delete(data["ids"][:1]) == 1 and len(index) == 4


def test_k_larger_than_count_and_empty_queries(uri, data) -> None:
    index = fresh(uri)
    index.add(["a", "b"], data["vectors"][:2])
    assert [len(row) for row in index.search(data["queries"], k=50)] == [2, 2, 2, 2]
    assert [len(row) for row in index.search(data["queries"], k=5000)] == [2, 2, 2, 2]
    assert index.search(np.empty((0, DIM)), k=3) == []


@pytest.mark.parametrize(
    "flt",
    [{"group": 3}, {"group": {"$ne": 3}}, {"i": {"$lt": 3}}, {"tags": {"$contains": "t1"}}, {"$not": {"half": True}}],
)
def test_filtered_search_returns_exactly_min_k_matches(uri, data, flt: dict) -> None:
    milvus = fresh(uri, index_type="FLAT")
    local = VectorIndex(DIM, backend="torch", device="cpu")
    for index in (milvus, local):
        index.add(data["ids"], data["vectors"], metadatas=data["metas"])
    for k in (1, 5, 40):
        got, want = milvus.search(data["queries"], k=k, filter=flt), local.search(data["queries"], k=k, filter=flt)
        assert [[h.id for h in row] for row in got] == [[h.id for h in row] for row in want]


def test_a_filter_milvus_cannot_narrow_is_topped_up_exactly(uri, data) -> None:
    """`$not` of an ordering is not narrowed in Milvus: the re-check drops most of the window."""
    milvus = fresh(uri, index_type="FLAT")
    local = VectorIndex(DIM, backend="torch", device="cpu")
    for index in (milvus, local):
        index.add(data["ids"], data["vectors"], metadatas=data["metas"])
    flt = {"$not": {"i": {"$lt": 57}}}
    got = milvus.search(data["queries"], k=3, filter=flt)
    assert [[h.id for h in row] for row in got] == [[h.id for h in row] for row in local.search(data["queries"], k=3, filter=flt)]
    assert all(len(row) == 3 for row in got)


def test_mmr_and_groups_match_vector_index(uri, data) -> None:
    milvus = fresh(uri, index_type="FLAT")
    local = VectorIndex(DIM, backend="torch", device="cpu")
    for index in (milvus, local):
        index.add(data["ids"], data["vectors"], documents=data["docs"], metadatas=data["metas"])
    q = data["queries"][0]
    for kwargs in ({"k": 4, "fetch_k": 20}, {"k": 3, "fetch_k": 30, "lambda_mult": 0.2, "filter": {"group": {"$ne": 0}}}):
        assert [h.id for h in milvus.mmr(q, **kwargs)] == [h.id for h in local.mmr(q, **kwargs)]
    assert milvus.mmr(q, k=3, filter={"group": 99}) == []
    groups = milvus.search_groups(q, 3, group_by="group")
    assert [h.id for h in groups] == [h.id for h in local.search_groups(q, 3, group_by="group")]


async def test_async_twins(uri, data) -> None:
    index = fresh(uri, index_type="FLAT")
    assert await index.aadd(data["ids"][:10], data["vectors"][:10], metadatas=data["metas"][:10]) == data["ids"][:10]
    assert sorted(await index.aids({"group": 1})) == ["d1", "d6"]
    assert [r.id for r in await index.aget(["d3"])] == ["d3"]
    hits = await index.asearch(data["vectors"][:1], k=1)
    assert hits[0][0].id == "d0"
    assert len(await index.ammr(data["queries"][0], k=2)) == 2
    assert await index.adelete(["d0", "nope"]) == 1
    await index.aclear()
    assert len(index) == 0


def test_concurrent_searches_are_coalesced_into_multi_query_calls(uri, data) -> None:
    index = fresh(uri, index_type="FLAT", max_wait_ms=20)
    index.add(data["ids"], data["vectors"])
    local = VectorIndex(DIM, backend="torch", device="cpu")
    local.add(data["ids"], data["vectors"])
    results: dict[int, list[str]] = {}
    barrier = threading.Barrier(16)

    def one(i: int) -> None:
        barrier.wait()
        results[i] = [h.id for h in index.search(data["vectors"][i], k=3)[0]]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: [h.id for h in local.search(data["vectors"][i], k=3)[0]] for i in range(16)}
    assert index.stats().batcher.max_batch_size > 1

    async def many() -> list:
        return await asyncio.gather(*(index.asearch(data["vectors"][i], k=2) for i in range(16)))

    assert [row[0][0].id for row in asyncio.run(many())] == data["ids"][:16]


def test_bad_input_is_typed_and_changes_nothing(uri, data) -> None:
    index = fresh(uri, scalar_fields={"price": "float", "lang": "str"})
    index.add(["a"], data["vectors"][:1], metadatas=[{"price": 3, "lang": "en"}])
    bad_calls = [
        (lambda: index.add(["b"], np.ones((1, DIM + 1))), DimensionMismatchError),
        (lambda: index.add(["b"], np.full((1, DIM), np.nan)), InvalidInputError),
        (lambda: index.add(["b", "c"], data["vectors"][:1]), InvalidInputError),
        (lambda: index.add(["b"], data["vectors"][:1], metadatas=[{"price": "cheap"}]), InvalidInputError),
        (lambda: index.add(["b"], data["vectors"][:1], metadatas=[{"x": {1, 2}}]), InvalidInputError),
        (lambda: index.add(["b"], data["vectors"][:1], documents=["x" * 70_000]), InvalidInputError),
        (lambda: index.add(["b" * 5000], data["vectors"][:1]), InvalidInputError),
        (lambda: index.add("b", data["vectors"][:1]), InputTypeError),
        (lambda: index.search(data["queries"], k=0), InvalidInputError),
        (lambda: index.search(data["queries"], k=3, filter={"price": {"$gt": [1]}}), FilterError),
        (lambda: index.ids(filter={"$nope": 1}), FilterError),
        (lambda: index.mmr(data["queries"], k=2), InvalidInputError),
        (lambda: index.mmr(data["queries"][0], lambda_mult=2), InvalidInputError),
        (lambda: index.delete("a"), InputTypeError),
    ]
    for call, error in bad_calls:
        with pytest.raises(error):
            call()
    assert index.ids() == ["a"] and index.get(["a"])[0].metadata == {"price": 3, "lang": "en"}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"metric": "dot"}, "metric"),
        ({"uri": "kb.sqlite"}, "'.db'"),
        ({"collection": "1bad-name"}, "collection"),
        ({"index_type": "GPU_MAGIC"}, "GPU_CAGRA"),
        ({"scalar_fields": {"price": "decimal"}}, "scalar_fields"),
        ({"scalar_fields": {"vector": "str"}}, "scalar_fields key"),
        ({"index_params": {"M": [16]}}, "index_params"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"nope": 1}, "unknown MilvusIndex option"),
    ],
)
def test_bad_options_are_refused_at_construction(options: dict, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        MilvusIndex(DIM, **options)
    with pytest.raises(ConfigurationError):
        MilvusIndex.check_options(**options)


def test_gpu_index_types_are_named_and_accepted() -> None:
    for name in ("GPU_CAGRA", "GPU_IVF_FLAT", "GPU_IVF_PQ", "GPU_BRUTE_FORCE"):
        assert MilvusIndex(DIM, index_type=name, uri="x.db").options.index_type == name


def test_an_existing_collection_must_agree(uri, data) -> None:
    index = fresh(uri)
    index.add(["a"], data["vectors"][:1])
    name = index.options.collection
    again = MilvusIndex(DIM, uri=uri, collection=name)
    assert again.ids() == ["a"]
    with pytest.raises(ConfigurationError, match="dim=8"):
        MilvusIndex(DIM + 1, uri=uri, collection=name).ids()
    with pytest.raises(ConfigurationError, match="metric"):
        MilvusIndex(DIM, uri=uri, collection=name, metric="l2").ids()
    with pytest.raises(ConfigurationError, match="scalar_fields"):  # a column the collection does not type
        MilvusIndex(DIM, uri=uri, collection=name, scalar_fields={"lang": "str"}).ids()


def test_a_foreign_collection_with_our_field_names_but_other_types_is_refused(uri) -> None:
    """langchain_milvus with primary_field="id", text_field="document", metadata_field="metadata" and
    auto_id makes an INT64 'id': refused when opened, rather than failing each later read."""
    from pymilvus import DataType

    index = fresh(uri)
    client = index._ensure()
    name = f"foreign_{uuid.uuid4().hex}"
    schema = client.create_schema(auto_id=True)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("document", DataType.VARCHAR, max_length=100)
    schema.add_field("metadata", DataType.JSON)
    params = client.prepare_index_params()
    params.add_index("vector", index_type="FLAT", metric_type="COSINE")
    client.create_collection(name, schema=schema, index_params=params)
    with pytest.raises(ConfigurationError, match=r"not its layout.*'id': 'INT64'.*auto_id"):
        MilvusIndex(DIM, uri=uri, collection=name).ids()


def test_a_handle_naming_fewer_typed_fields_adopts_the_collections(uri, data) -> None:
    # A second writer (another process, index-bulk, a server) that does not repeat scalar_fields must
    # still fill the typed columns: a NULL column would hide its records from the typed filters.
    typed = fresh(uri, scalar_fields={"lang": "str", "price": "float"})
    typed.add(["a"], data["vectors"][:1], metadatas=[{"lang": "fr", "price": 5}])
    name = typed.options.collection
    for declared in ({}, {"lang": "str"}):
        other = MilvusIndex(DIM, uri=uri, collection=name, scalar_fields=declared)
        other.add([f"b{len(declared)}"], data["vectors"][1:2], metadatas=[{"lang": "fr", "price": 5}])
        assert other.options.scalar_fields == {"lang": "str", "price": "float"}
        with pytest.raises(InvalidInputError):  # and checks the column's kind like the creator does
            other.add(["c"], data["vectors"][2:3], metadatas=[{"price": "cheap"}])
    reader = MilvusIndex.load(uri, collection=name)
    for expression in ({"lang": "fr"}, {"price": {"$lt": 10}}, {"lang": {"$icontains": "FR"}}):
        assert sorted(reader.ids(expression)) == ["a", "b0", "b1"], expression
    hits = reader.search(data["vectors"][1], k=3, filter={"lang": "fr"})[0]
    assert sorted(h.id for h in hits) == ["a", "b0", "b1"]
    typed.drop()


def test_milvus_failures_are_typed(tmp_path, request) -> None:
    from gpuprompt.errors import VectorStoreError

    with socket.socket() as probe:  # a loopback port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(VectorStoreError, match=f"127.0.0.1:{port}"):
        _ = MilvusIndex(DIM, uri=f"http://127.0.0.1:{port}", collection="c").count
    path = tmp_path / "held.db"
    holder = MilvusIndex(DIM, uri=str(path), collection="c")
    request.addfinalizer(holder.close)  # releases the file's lock even when an assertion fails
    holder.add(["a"], np.ones((1, DIM), np.float32))
    code = (
        "from gpuprompt import MilvusIndex\n"
        "from gpuprompt.errors import ConfigurationError\n"
        "try:\n"
        f"    MilvusIndex({DIM}, uri={str(path)!r}, collection='c').count\n"
        "except ConfigurationError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert "refused:" in done.stdout and "one process" in done.stdout, done.stdout + done.stderr[-2000:]


def test_save_writes_a_pointer_and_load_reopens_the_collection(uri, data, tmp_path) -> None:
    index = fresh(uri, metric="ip", scalar_fields={"group": "int"})
    index.add(data["ids"][:5], data["vectors"][:5], metadatas=data["metas"][:5])
    index.save(tmp_path / "kb")
    assert (tmp_path / "kb" / "milvus.json").is_file()
    loaded = load_index(tmp_path / "kb")
    assert isinstance(loaded, MilvusIndex)
    assert (loaded.dim, loaded.metric, loaded.options.scalar_fields) == (DIM, "ip", {"group": "int"})
    assert sorted(loaded.ids({"group": {"$lt": 2}})) == ["d0", "d1"]
    direct = MilvusIndex.load(uri, collection=index.options.collection)
    assert direct.count == 5
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "milvus.json").write_text("{not json")
    with pytest.raises(SnapshotError):
        load_index(tmp_path / "bad")
    with pytest.raises(SnapshotError, match="no Milvus collection"):
        MilvusIndex.load(uri, collection="never_created")


def test_close_refuses_later_calls(uri, data) -> None:
    index = fresh(uri)
    index.add(["a"], data["vectors"][:1])
    index.close()
    with pytest.raises(ClosedError):
        index.search(data["queries"], k=1)
    with pytest.raises(ClosedError):
        index.ids()


def test_the_embedder_is_recorded_and_another_is_refused(uri, data) -> None:
    from gpuprompt.errors import EmbedderMismatchError

    index = fresh(uri)
    index.add(["a"], data["vectors"][:1], embedder="minilm@1")
    assert index.embedder == "minilm@1"
    with pytest.raises(EmbedderMismatchError):
        index.add(["b"], data["vectors"][1:2], embedder="other@2")
    index.add(["b"], data["vectors"][1:2], embedder="other@2", allow_other_embedder=True)
    assert index.embedder == "minilm@1" and sorted(index.ids()) == ["a", "b"]
    index.clear()
    assert index.embedder is None


def test_rag_pipeline_answers_over_a_milvus_index(uri, embedder, tf_engine) -> None:
    """RAGPipeline takes any IndexLike: the sources come from the Milvus collection."""
    from gpuprompt import ContextCache, RAGPipeline
    from gpuprompt.apps.demo import catalogue

    products = catalogue(20)
    texts = [p["text"] for p in products]
    vectors = embedder.embed(texts)
    milvus = fresh(uri, dim=embedder.dim, index_type="FLAT")
    local = VectorIndex(embedder.dim, backend="torch", device="cpu")
    for index in (milvus, local):
        index.add([p["id"] for p in products], vectors, documents=texts, metadatas=[p["metadata"] for p in products])
    rag = RAGPipeline(milvus, tf_engine, embedder=embedder, memory=ContextCache(embedder), k=3, max_tokens=4)
    question = "Will the red dress shrink after washing?"
    reply = rag.answer("milvus-user", question)
    assert reply.answer
    assert [h.id for h in reply.sources] == [h.id for h in local.search(embedder.embed([question]), 3)[0]]


def test_an_mmr_batched_with_a_larger_search_keeps_to_its_own_candidates(uri) -> None:
    index = fresh(uri, max_wait_ms=50)
    check_mmr_batched_with_a_larger_search(index, DIM)
    index.drop()


def test_milvus_lite_probes_do_not_log_errors(tmp_path, caplog, request) -> None:
    # pymilvus probes AllocTimestamp while an index builds; Milvus Lite does not implement it and
    # grpc used to log that at ERROR with a traceback although nothing failed.
    with caplog.at_level(logging.ERROR):
        index = MilvusIndex(DIM, uri=str(tmp_path / "quiet.db"), collection="c")
        request.addfinalizer(index.close)
        index.add(["a"], np.ones((1, DIM), np.float32))
        assert index.count == 1
    assert not [r for r in caplog.records if "Method not implemented" in (r.getMessage() + str(r.exc_info))]
