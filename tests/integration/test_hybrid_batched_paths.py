"""The fast paths of hybrid search give the answers of the plain ones: the lexical leg's MaxScore
pruning against a full scan of the postings (through writes, under filters), and a hybrid search
that hands the index its embedding function (embedded in the search batch, one call for concurrent
searches) against the same search with the vectors embedded first."""

from __future__ import annotations

import asyncio
import random
import threading

import numpy as np
import pytest
from gpuprompt import VectorIndex
from gpuprompt._corpus import sku_catalogue, sku_questions
from gpuprompt.errors import DimensionMismatchError, InvalidInputError
from gpuprompt.index._search import FilterCache

DIM = 8


@pytest.fixture(scope="module")
def products() -> list[dict]:
    return sku_catalogue(400)


# ---------------------------------------------------------------------- MaxScore against a full scan
def test_maxscore_gives_the_full_scan_scores_and_rows_through_writes_and_filters() -> None:
    rng = random.Random(7)
    catalogue = sku_catalogue(3000)
    index = VectorIndex(DIM, device="cpu", max_wait_ms=0)
    vectors = np.random.default_rng(7).standard_normal((len(catalogue), DIM)).astype(np.float32)
    index.add([p["id"] for p in catalogue], vectors, documents=[p["text"] for p in catalogue],
              metadatas=[p["metadata"] for p in catalogue])
    index.lexical_search(["wool"], 1)  # the leg exists: the writes below keep it in step
    words = ["price", "wool", "dress", "size", "s", "m", "xl", "wash", "cold", "article", "sku", "eur", "48",
             "cotton", "red", "aurora", "30", "restocked"]
    filters = [None, {"size": "M"}, {"price": {"$gt": 60}}]
    pruned_answers = 0

    def check() -> int:
        lexical, store, cache = index._lexical, index._store, FilterCache()
        segments = lexical._frozen()
        queries = [q for q, _ in sku_questions(catalogue, 25, seed=rng.randrange(1000))]
        queries += [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 4))) for _ in range(10)]
        pruned = 0
        for query in queries:
            for flt in filters:
                allowed = cache.allowed(store, None if flt is None else repr(flt), flt)
                for k in (1, 5, 20):
                    scores, rows = lexical.search(query, k, allowed, store.size)
                    terms = sorted({lexical._vocab[t] for t in lexical_terms(query) if t in lexical._vocab})
                    idfs = {t: lexical_idf(lexical, segments, t) for t in terms}
                    idfs = {t: idf for t, idf in idfs.items() if idf is not None}
                    if not idfs:
                        assert scores.size == 0
                        continue
                    average = lexical._total_length / lexical._live
                    full_scores, full_rows = lexical._scan(segments, idfs, allowed, average, store.size)
                    want = np.lexsort((full_rows, -full_scores))[:k]  # score descending, ties by row
                    assert np.array_equal(scores, full_scores[want].astype(np.float32)), (query, flt, k)
                    assert np.array_equal(rows, full_rows[want]), (query, flt, k)
                    pruned += lexical._pruned(segments, idfs, k, allowed, average) is not None and k < len(full_rows)
        return pruned

    pruned_answers += check()
    for _ in range(3):
        moved = rng.sample(range(len(catalogue)), 150)
        index.add([catalogue[i]["id"] for i in moved], vectors[moved],
                  documents=[f"wool dress {rng.choice(words)} restocked" for _ in moved])
        index.delete([catalogue[i]["id"] for i in rng.sample(range(len(catalogue)), 80)])
        pruned_answers += check()
    assert pruned_answers > 100  # the code questions were answered by the pruned path, not the scan
    index.close()


def lexical_terms(query: str) -> list[str]:
    from gpuprompt.index._lexical_text import tokenize

    return tokenize(query)


def lexical_idf(lexical, segments, term: int) -> float | None:
    """The term's idf over its live postings counted here (not through the leg's cached counts)."""
    import math

    labels, _ = lexical._postings(segments, term)
    if labels.size == 0:
        return None
    return math.log(1.0 + (lexical._live - labels.size + 0.5) / (labels.size + 0.5))


# ---------------------------------------------------------------------- the embedding in the search batch
class CountingEmbed:
    """The real embedder's query embedding, counting its calls (one object: equal between calls)."""

    def __init__(self, embedder) -> None:
        self.embedder = embedder
        self.calls: list[int] = []
        self.threads: set[str] = set()

    def __call__(self, texts: list[str]):
        self.calls.append(len(texts))
        self.threads.add(threading.current_thread().name)
        return self.embedder.embed_tensor(texts)


@pytest.fixture(scope="module")
def sku_index(embedder, products):
    index = VectorIndex(embedder.dim, device="cpu")
    index.add([p["id"] for p in products], embedder.embed([p["text"] for p in products]),
              documents=[p["text"] for p in products], metadatas=[p["metadata"] for p in products])
    yield index
    index.close()


async def test_an_embedding_function_is_called_once_per_batch_and_equals_vectors(sku_index, embedder,
                                                                                   products) -> None:
    asked = [q for q, _ in sku_questions(products, 24, seed=21)]
    vectors = embedder.embed(asked)
    embed = CountingEmbed(embedder)
    for options in ({}, {"alpha": 0.4}, {"filter": {"size": "M"}}):
        want = [sku_index.hybrid_search(vectors[i:i + 1], [q], 4, **options)[0] for i, q in enumerate(asked)]
        embed.calls.clear()
        got = await asyncio.gather(*(sku_index.ahybrid_search(embed, [q], 4, **options) for q in asked))
        # The texts are embedded in batches whose make-up depends on arrival (fp32 sums in another
        # order: ~1e-6 per cosine), and the fused scores rescale those differences.
        assert [[(h.id, h.score) for h in r[0]] for r in got] == [
            [(h.id, pytest.approx(h.score, rel=1e-4, abs=1e-5)) for h in hits] for hits in want]
        assert sum(embed.calls) == len(asked) and len(embed.calls) < len(asked)  # whole batches of texts
    assert embed.threads == {"gpuprompt-index-search"}  # on the index's search thread, never the loop
    sync = sku_index.hybrid_search(embed, asked[:3], 4)
    assert [[h.id for h in hits] for hits in sync] == [
        [h.id for h in hits] for hits in sku_index.hybrid_search(vectors[:3], asked[:3], 4)]


async def test_a_failing_embedding_function_fails_its_own_searches_only(sku_index, embedder, products) -> None:
    asked = [q for q, _ in sku_questions(products, 6, seed=22)]
    good = CountingEmbed(embedder)

    def broken(texts: list[str]):
        raise RuntimeError("the embedding service is down")

    def short(texts: list[str]):
        return embedder.embed(texts)[:-1]

    def narrow(texts: list[str]):
        return np.ones((len(texts), 3), dtype=np.float32)

    results = await asyncio.gather(
        *(sku_index.ahybrid_search(good, [q], 3) for q in asked),
        sku_index.ahybrid_search(broken, [asked[0]], 3),
        sku_index.ahybrid_search(short, asked[:2], 3),
        sku_index.ahybrid_search(narrow, [asked[0]], 3),
        return_exceptions=True,
    )
    assert all(isinstance(r, list) and len(r[0]) == 3 for r in results[: len(asked)])
    assert isinstance(results[-3], RuntimeError) and "down" in str(results[-3])
    assert isinstance(results[-2], InvalidInputError) and "one row per text" in str(results[-2])
    assert isinstance(results[-1], DimensionMismatchError)
    assert sku_index.hybrid_search(good, [asked[0]], 3)[0]  # the index serves on


def test_an_index_that_cannot_batch_the_embedding_calls_it_at_once(tmp_path, embedder, products) -> None:
    pytest.importorskip("pymilvus")
    from gpuprompt.index import MilvusIndex

    milvus = MilvusIndex(embedder.dim, uri=str(tmp_path / "kb.db"), index_type="FLAT")
    texts = [p["text"] for p in products[:60]]
    milvus.add([p["id"] for p in products[:60]], embedder.embed(texts), documents=texts)
    asked = [q for q, _ in sku_questions(products[:60], 4, seed=23)]
    embed = CountingEmbed(embedder)
    got = milvus.hybrid_search(embed, asked, 3)
    assert embed.calls == [len(asked)]
    assert [[h.id for h in hits] for hits in got] == [
        [h.id for h in hits] for hits in milvus.hybrid_search(embedder.embed(asked), asked, 3)]
    milvus.close()
