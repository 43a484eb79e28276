"""One IndexLike suite, run against every implementation: VectorIndex (torch, faiss), MilvusIndex
(Milvus Lite) and RemoteIndex (a gpuprompt serve collection, in process over ASGI). Every case runs
the same calls on the implementation and on the reference (an exact torch VectorIndex) and expects
the same answers: the protocol means one thing everywhere."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
from support.asgi import InProcessServer

from gpuprompt import VectorIndex, get_runtime
from gpuprompt.errors import DimensionMismatchError, FilterError, InvalidInputError
from gpuprompt.protocols import HybridSearchLike, IndexLike

DIM = 384  # the served embedder's: a remote collection takes its dimension
KINDS = ["torch", "faiss", "milvus", "remote"]
_NAMES = itertools.count()
WORDS = "red blue green dress shirt coat cotton wool linen SKU-100-AA SKU-200-BB SKU-300-CC".split()


@pytest.fixture(scope="module")
def server(embedder) -> InProcessServer:
    from gpuprompt.server import create_app

    served = InProcessServer(create_app(embedder=embedder, llm=get_runtime().llm(backend="transformers"),
                                        preload=False)).start()
    yield served
    served.stop()


@pytest.fixture(params=KINDS)
def pair(request, tmp_path, server):
    """(the implementation under test, the reference), both empty."""
    kind = request.param
    if kind in ("torch", "faiss"):
        index = VectorIndex(DIM, backend=kind, device="cpu")
    elif kind == "milvus":
        pytest.importorskip("pymilvus")
        from gpuprompt.index import MilvusIndex

        index = MilvusIndex(DIM, uri=str(tmp_path / "c.db"), index_type="FLAT")
    else:
        index = server.connect().index(collection=f"contract{next(_NAMES)}")
    reference = VectorIndex(DIM, backend="torch", device="cpu")
    yield index, reference
    if kind == "remote":
        index.clear()
    index.close()
    reference.close()


def _data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    ids = [f"r{i}" for i in range(n)]
    documents = [" ".join(rng.choice(WORDS, size=4)) for _ in range(n)]
    metadatas = [{"i": i, "colour": ["red", "blue", "green"][i % 3], "price": float(10 * (i % 7))} for i in range(n)]
    return ids, vectors, documents, metadatas


def _both(pair, method: str, *args, **kwargs):
    index, reference = pair
    return getattr(index, method)(*args, **kwargs), getattr(reference, method)(*args, **kwargs)


def _ids(results):
    return [[h.id for h in hits] for hits in results]


def test_it_is_an_index_and_has_a_lexical_leg(pair) -> None:
    index, _ = pair
    assert isinstance(index, IndexLike) and isinstance(index, HybridSearchLike)


def test_upsert_get_ids_delete_count(pair) -> None:
    index, reference = pair
    ids, vectors, documents, metadatas = _data(40)
    for target in pair:
        assert target.add(ids, vectors, documents, metadatas) == ids
        target.add(["r3"], vectors[4:5], ["replaced"], [{"i": 3, "colour": "red", "price": 0.0}])  # an upsert
        assert target.delete(["r5", "r6", "nope"]) == 2
    assert index.count == reference.count == 38 and len(index) == 38
    got, want = _both(pair, "get", ["r3", "r5", "r7"])
    assert [(r.id, r.document, r.metadata) for r in got] == [(r.id, r.document, r.metadata) for r in want]
    assert np.allclose(got[0].vector, want[0].vector)
    got, want = _both(pair, "ids", {"colour": "red"})
    assert sorted(got) == sorted(want)


def test_search_filters_and_mmr(pair) -> None:
    ids, vectors, documents, metadatas = _data(60, seed=1)
    for target in pair:
        target.add(ids, vectors, documents, metadatas)
    queries = np.random.default_rng(2).standard_normal((5, DIM)).astype(np.float32)
    got, want = _both(pair, "search", queries, 6)
    assert _ids(got) == _ids(want)
    assert np.allclose([h.score for h in got[0]], [h.score for h in want[0]], atol=1e-4)
    flt = {"$and": [{"colour": {"$in": ["red", "green"]}}, {"price": {"$lt": 40}}]}
    got, want = _both(pair, "search", queries, 6, flt)
    assert _ids(got) == _ids(want)
    got, want = _both(pair, "mmr", queries[0], 4, 12, 0.5, {"colour": "blue"})
    assert [h.id for h in got] == [h.id for h in want]


def test_lexical_and_hybrid(pair) -> None:
    ids, vectors, documents, metadatas = _data(60, seed=3)
    for target in pair:
        target.add(ids, vectors, documents, metadatas)
    texts = ["SKU-200-BB", "red cotton dress"]
    got, want = _both(pair, "lexical_search", texts, 5)
    for g, w in zip(got, want):
        assert [h.score for h in g] == pytest.approx([h.score for h in w], rel=1e-4)
    queries = np.random.default_rng(4).standard_normal((2, DIM)).astype(np.float32)
    got, want = _both(pair, "hybrid_search", queries, texts, 4, {"colour": "red"}, alpha=0.5)
    assert [h.score for h in got[0]] == pytest.approx([h.score for h in want[0]], rel=1e-3)
    assert all(h.metadata["colour"] == "red" for hits in got for h in hits)


async def test_async_twins(pair) -> None:
    index, reference = pair
    ids, vectors, documents, metadatas = _data(30, seed=5)
    await index.aadd(ids, vectors, documents, metadatas)
    reference.add(ids, vectors, documents, metadatas)
    queries = np.random.default_rng(6).standard_normal((8, DIM)).astype(np.float32)
    together = await asyncio.gather(*(index.asearch(queries[i:i + 1], 3) for i in range(8)))
    assert [_ids(r)[0] for r in together] == _ids(reference.search(queries, 3))
    assert await index.adelete(["r1"]) == 1
    assert sorted(await index.aids()) == sorted(i for i in ids if i != "r1")


def test_the_same_typed_errors(pair) -> None:
    index, _ = pair
    ids, vectors, documents, metadatas = _data(4, seed=7)
    index.add(ids, vectors, documents, metadatas)
    with pytest.raises(DimensionMismatchError):
        index.search(np.zeros((1, DIM + 1), dtype=np.float32), 2)
    with pytest.raises(InvalidInputError):
        index.search(np.zeros((1, DIM), dtype=np.float32), 0)
    with pytest.raises(FilterError):
        index.search(np.zeros((1, DIM), dtype=np.float32), 2, {"price": {"$near": 3}})
    with pytest.raises(InvalidInputError):
        index.hybrid_search(np.zeros((1, DIM), dtype=np.float32), ["red"], 2, alpha=float("nan"))
    with pytest.raises(InvalidInputError):
        index.add(["x"], np.full((1, DIM), np.nan, dtype=np.float32))
    assert index.count == 4  # nothing refused was stored
