"""Hybrid search in the core: the tokenizer, BM25 against a brute-force reference through upserts and
deletes, both fusions against their definitions, filters on both legs, batching, hostile input,
and MilvusIndex's sparse leg against VectorIndex's."""

from __future__ import annotations

import asyncio
import math
import random
import unicodedata
from collections import Counter

import numpy as np
import pytest

from gpuprompt import VectorIndex
from gpuprompt._corpus import sku_catalogue, sku_questions
from gpuprompt.errors import ConfigurationError, FilterError, InputTypeError, InvalidInputError
from gpuprompt.index._lexical import B, K1
from gpuprompt.index._lexical_text import tokenize

DIM = 8
WORDS = "red blue cotton linen dress shirt wash shrink price size sku code model".split()


# ---------------------------------------------------------------------- helpers
def reference_bm25(documents: dict[str, str | None], query: str) -> dict[str, float]:
    """Lucene's BM25 written out by the definition, over the live documents (no shared code but the tokenizer)."""
    counted = {key: Counter(tokenize(text)) for key, text in documents.items() if text}
    counted = {key: c for key, c in counted.items() if c}
    n = len(counted)
    if not n:
        return {}
    average = sum(sum(c.values()) for c in counted.values()) / n
    scores: dict[str, float] = {}
    for term in set(tokenize(query)):
        df = sum(1 for c in counted.values() if term in c)
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for key, c in counted.items():
            tf = c.get(term, 0)
            if tf:
                length = sum(c.values())
                scores[key] = scores.get(key, 0.0) + idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / average))
    return scores


def random_text(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randrange(1, 12))]
    if rng.random() < 0.3:
        words.append(f"SKU-{rng.randrange(100, 999)}-{rng.choice('ABC')}{rng.choice('XY')},")
    return " ".join(words)


def assert_same_ranking(hits, expected: dict[str, float], k: int) -> None:
    """The hits hold the top-k reference scores (ties may come in any order) with equal scores."""
    want = sorted(expected.values(), reverse=True)[:k]
    assert [h.score for h in hits] == pytest.approx(want, rel=1e-5)
    for hit in hits:
        assert expected[hit.id] == pytest.approx(hit.score, rel=1e-5)


@pytest.fixture(scope="module")
def products() -> list[dict]:
    return sku_catalogue(400)


@pytest.fixture(scope="module")
def sku_index(embedder, products) -> VectorIndex:
    index = VectorIndex(embedder.dim, device="cpu")
    index.add([p["id"] for p in products], embedder.embed([p["text"] for p in products]),
              documents=[p["text"] for p in products], metadatas=[p["metadata"] for p in products])
    yield index
    index.close()


# ---------------------------------------------------------------------- the tokenizer
def test_codes_are_kept_whole_and_in_parts() -> None:
    assert tokenize("Article SKU-48213-QX, size M.") == ["article", "sku-48213-qx", "sku", "48213", "qx", "size", "m"]
    assert tokenize("error E_4021/b: see v2.3.1") == ["error", "e_4021/b", "e", "4021", "b", "see", "v2.3.1", "v2", "3", "1"]
    assert tokenize("ＳＫＵ－１２ Straße") == tokenize("sku-12 strasse")  # NFKC and case folding
    assert tokenize("the a of and") == []  # stopwords only
    assert "sku-48213-qx" in tokenize("Is SKU-48213-QX? (sku-48213-qx!)")


def test_scripts_without_spaces_give_characters_and_pairs() -> None:
    assert tokenize("東京タワー") == ["東", "東京", "京", "京タ", "タ", "タワ", "ワ", "ワー", "ー"]
    assert tokenize("iPhone手机壳, SKU-12") == ["iphone", "手", "手机", "机", "机壳", "壳", "sku-12", "sku", "12"]
    assert tokenize("한국어 텍스트") == ["한국어", "텍스트"]  # Korean is written with spaces: words
    thai = tokenize("ชุดเดรสสีแดง")
    assert "เด" in thai and "ดร" in thai and "รส" in thai  # the pairs of "เดรส" (dress)
    assert not any(len(t) == 1 and unicodedata.category(t).startswith("M") for t in thai)  # no lone marks


def test_a_word_inside_an_unspaced_run_is_found() -> None:
    index = VectorIndex(DIM, device="cpu", max_wait_ms=0)
    texts = ["東京タワーに行きました", "大阪城を見ました", "ชุดเดรสสีแดง ราคาถูก", "a plain English sentence"]
    index.add(["tokyo", "osaka", "thai", "english"], np.eye(DIM, dtype=np.float32)[:4], documents=texts)
    assert [h.id for h in index.lexical_search(["東京"], 1)[0]] == ["tokyo"]
    assert [h.id for h in index.lexical_search(["大阪"], 1)[0]] == ["osaka"]
    assert [h.id for h in index.lexical_search(["เดรส"], 1)[0]] == ["thai"]
    assert [h.id for h in index.lexical_search(["english sentence"], 1)[0]] == ["english"]
    index.close()


# ---------------------------------------------------------------------- BM25 against the definition
def test_bm25_equals_the_reference_through_upserts_deletes_and_clear() -> None:
    rng = random.Random(3)
    index = VectorIndex(DIM, device="cpu", max_wait_ms=0)
    live: dict[str, str | None] = {}
    vectors = np.random.default_rng(3).standard_normal((64, DIM)).astype(np.float32)

    def check() -> None:
        for _ in range(6):
            query = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))
            expected = reference_bm25(live, query)
            hits = index.lexical_search([query], 10)[0]
            assert len(hits) == min(10, len(expected))
            assert_same_ranking(hits, expected, 10)

    for step in range(30):
        action = rng.random()
        if action < 0.6 or not live:
            keys = [f"d{rng.randrange(60)}" for _ in range(rng.randrange(1, 8))]
            keys = list(dict.fromkeys(keys))
            texts = [None if rng.random() < 0.1 else random_text(rng) for _ in keys]
            index.add(keys, vectors[: len(keys)], documents=texts)
            live.update(zip(keys, texts))
        elif action < 0.9:
            gone = rng.sample(sorted(live), min(len(live), rng.randrange(1, 5)))
            index.delete(gone)
            for key in gone:
                live.pop(key)
        else:
            index.clear()
            live.clear()
        if step == 3:
            index.lexical_search(["red"], 1)  # the leg exists from here on: later writes keep it in step
        check()
    assert index.lexical_stats().documents == sum(1 for t in live.values() if t and tokenize(t))
    index.close()


def test_records_without_words_are_skipped_never_an_error() -> None:
    index = VectorIndex(DIM, device="cpu", max_wait_ms=0)
    vectors = np.eye(DIM, dtype=np.float32)[:4]
    index.add(["a", "b", "c", "d"], vectors, documents=["red dress", None, "", "the of and"])
    assert [h.id for h in index.lexical_search(["red"], 4)[0]] == ["a"]
    hybrid = index.hybrid_search(vectors[1:2], ["red"], 4)[0]  # b is found by the dense leg only
    assert {h.id for h in hybrid} == {"a", "b", "c", "d"} and hybrid[0].id in {"a", "b"}
    index.close()


# ---------------------------------------------------------------------- fusion against the definitions
def test_rrf_and_weighted_fusion_follow_their_definitions(sku_index, embedder, products) -> None:
    question, want = sku_questions(products, 1, seed=4)[0]
    vector = embedder.embed([question])
    dense = sku_index.search(vector, 20)[0]
    words = sku_index.lexical_search([question], 20)[0]
    rrf: dict[str, float] = {}
    for hits in (dense, words):
        for rank, hit in enumerate(hits, start=1):
            rrf[hit.id] = rrf.get(hit.id, 0.0) + 1 / (60 + rank)
    fused = sku_index.hybrid_search(vector, [question], 5, fetch_k=20)[0]
    assert [h.score for h in fused] == pytest.approx(sorted(rrf.values(), reverse=True)[:5], rel=1e-5)
    assert all(rrf[h.id] == pytest.approx(h.score, rel=1e-5) for h in fused)
    assert want in [h.id for h in fused]

    def normal(hits):
        low, high = min(h.score for h in hits), max(h.score for h in hits)
        return {h.id: (h.score - low) / (high - low) for h in hits}

    for alpha in (0.0, 0.3, 1.0):
        weighted: dict[str, float] = {}
        for weight, hits in ((alpha, dense), (1 - alpha, words)):
            if weight:
                for key, value in normal(hits).items():
                    weighted[key] = weighted.get(key, 0.0) + weight * value
        got = sku_index.hybrid_search(vector, [question], 5, alpha=alpha, fetch_k=20)[0]
        assert [h.score for h in got] == pytest.approx(sorted(weighted.values(), reverse=True)[:5], rel=1e-5)
    only_dense = sku_index.hybrid_search(vector, [question], 5, alpha=1.0)[0]
    assert [h.id for h in only_dense] == [h.id for h in sku_index.search(vector, 5)[0]]


def test_hybrid_finds_named_codes_that_dense_misses(sku_index, embedder, products) -> None:
    asked = sku_questions(products, 40, seed=6)
    texts = [q for q, _ in asked]
    vectors = embedder.embed(texts)

    def recall(results) -> float:
        return sum(want in [h.id for h in hits] for (_, want), hits in zip(asked, results)) / len(asked)

    dense = recall(sku_index.search(vectors, 5))
    assert recall(sku_index.lexical_search(texts, 5)) == 1.0
    assert recall(sku_index.hybrid_search(vectors, texts, 5)) >= max(0.95, dense)
    assert recall(sku_index.hybrid_search(vectors, texts, 5, alpha=0.3)) >= max(0.95, dense)
    assert dense < 0.5  # the premise: a dense embedder does not tell the codes apart


def test_the_filter_is_a_pre_filter_of_both_legs(sku_index, embedder, products) -> None:
    asked = sku_questions(products, 10, seed=8)
    texts = [q for q, _ in asked]
    flt = {"$and": [{"size": "M"}, {"price": {"$lt": 120}}]}
    matching = {p["id"] for p in products if p["metadata"]["size"] == "M" and p["metadata"]["price"] < 120}
    for hits in sku_index.hybrid_search(embedder.embed(texts), texts, 7, flt) + sku_index.lexical_search(texts, 7, flt):
        assert len(hits) == 7 and {h.id for h in hits} <= matching
    by_id = {p["id"]: p for p in products}
    for (question, want), hits in zip(asked, sku_index.lexical_search(texts, 3, flt)):
        if want in matching:
            assert hits[0].id == want
        assert all(by_id[h.id]["metadata"]["size"] == "M" for h in hits)


async def test_concurrent_hybrid_searches_are_batched_and_equal_sequential(embedder, products) -> None:
    index = VectorIndex(embedder.dim, device="cpu", max_wait_ms=5)
    index.add([p["id"] for p in products], embedder.embed([p["text"] for p in products]),
              documents=[p["text"] for p in products], metadatas=[p["metadata"] for p in products])
    asked = [q for q, _ in sku_questions(products, 24, seed=10)]
    vectors = embedder.embed(asked)
    sequential = [index.hybrid_search(vectors[i:i + 1], [q], 4, alpha=0.4)[0] for i, q in enumerate(asked)]
    before = index.stats().batcher.batches
    together = await asyncio.gather(
        *(index.ahybrid_search(vectors[i:i + 1], [q], 4, alpha=0.4) for i, q in enumerate(asked)),
        *(index.alexical_search([q], 4) for q in asked),
        *(index.asearch(vectors[i:i + 1], 4) for i in range(len(asked))),
    )
    assert [[h.id for h in r[0]] for r in together[:24]] == [[h.id for h in hits] for hits in sequential]
    assert index.stats().batcher.batches - before < 3 * len(asked) // 2  # coalesced, not one batch per call
    index.close()


# ---------------------------------------------------------------------- hostile input
@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda ix, v: ix.lexical_search([""], 3), InvalidInputError, "must hold words"),
        (lambda ix, v: ix.lexical_search(["  \n\t"], 3), InvalidInputError, "must hold words"),
        (lambda ix, v: ix.lexical_search(["bad \ud800 text"], 3), InvalidInputError, "surrogate"),
        (lambda ix, v: ix.lexical_search("red dress", 3), InputTypeError, "bare str"),
        (lambda ix, v: ix.lexical_search([7], 3), InputTypeError, "texts\\[0\\]"),
        (lambda ix, v: ix.lexical_search(["red"], 0), InvalidInputError, "'k'"),
        (lambda ix, v: ix.hybrid_search(v, ["red"], 3, alpha=float("nan")), InvalidInputError, "'alpha'"),
        (lambda ix, v: ix.hybrid_search(v, ["red"], 3, alpha=1.5), InvalidInputError, "'alpha'"),
        (lambda ix, v: ix.hybrid_search(v, ["red"], 3, alpha=-0.1), InvalidInputError, "'alpha'"),
        (lambda ix, v: ix.hybrid_search(v, ["red"], 3, alpha=True), InvalidInputError, "'alpha'"),
        (lambda ix, v: ix.hybrid_search(v, ["red"], 3, alpha=0.5, fusion="rrf"), InvalidInputError, "drop one"),
        (lambda ix, v: ix.hybrid_search(v, ["red"], 3, fusion="borda"), InvalidInputError, "'fusion'"),
        (lambda ix, v: ix.hybrid_search(v, ["red"], 5, fetch_k=2), InvalidInputError, "'fetch_k'"),
        (lambda ix, v: ix.hybrid_search(v, ["red", "blue"], 3), InvalidInputError, "one text per query vector"),
        (lambda ix, v: ix.hybrid_search(v, ["red"], 3, rrf_k=0), InvalidInputError, "'rrf_k'"),
        (lambda ix, v: ix.lexical_search(["red"], 3, {"price": {"$bogus": 2}}), FilterError, "bogus"),
    ],
)
def test_bad_input_is_a_typed_error_and_changes_nothing(call, error, words) -> None:
    index = VectorIndex(DIM, device="cpu", max_wait_ms=0)
    vectors = np.eye(DIM, dtype=np.float32)[:2]
    index.add(["a", "b"], vectors, documents=["red dress", "blue shirt"])
    with pytest.raises(error, match=words):
        call(index, vectors[:1])
    assert [h.id for h in index.lexical_search(["red"], 2)[0]] == ["a"] and index.count == 2
    index.close()


def test_an_index_after_load_searches_its_loaded_words(tmp_path) -> None:
    index = VectorIndex(DIM, device="cpu", max_wait_ms=0)
    vectors = np.eye(DIM, dtype=np.float32)[:3]
    index.add(["a", "b", "c"], vectors, documents=["SKU-1-A red", "SKU-2-B blue", "SKU-3-C green"])
    index.lexical_search(["red"], 1)
    index.add(["b"], vectors[1:2], documents=["SKU-9-Z replaced"])
    index.save(tmp_path / "kb")
    loaded = VectorIndex.load(tmp_path / "kb", device="cpu", max_wait_ms=0)
    for query in ("SKU-2-B", "SKU-9-Z", "green", "sku-1-a"):
        assert [h.id for h in loaded.lexical_search([query], 3)[0]] == [h.id for h in index.lexical_search([query], 3)[0]]
    assert all("SKU-2-B" not in h.document for h in loaded.lexical_search(["SKU-2-B"], 3)[0])
    index.close()
    loaded.close()


# ---------------------------------------------------------------------- Milvus against VectorIndex
@pytest.fixture()
def milvus_pair(tmp_path, embedder, products):
    pytest.importorskip("pymilvus")
    from gpuprompt.index import MilvusIndex

    texts = [p["text"] for p in products]
    vectors = embedder.embed(texts)
    milvus = MilvusIndex(embedder.dim, uri=str(tmp_path / "kb.db"), index_type="FLAT", scalar_fields={"size": "str"})
    local = VectorIndex(embedder.dim, device="cpu")
    for index in (milvus, local):
        index.add([p["id"] for p in products], vectors, documents=texts, metadatas=[p["metadata"] for p in products])
    yield milvus, local
    milvus.close()
    local.close()


def test_milvus_sparse_leg_scores_as_vector_index(milvus_pair, embedder, products) -> None:
    milvus, local = milvus_pair
    asked = sku_questions(products, 20, seed=12)
    texts = [q for q, _ in asked]
    for got, want in zip(milvus.lexical_search(texts, 6), local.lexical_search(texts, 6)):
        assert got[0].id == want[0].id
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-4)
    vectors = embedder.embed(texts)
    for alpha in (None, 0.3):
        got = milvus.hybrid_search(vectors, texts, 5, alpha=alpha)
        want = local.hybrid_search(vectors, texts, 5, alpha=alpha)
        # tied candidates may be taken in another order by Milvus: the named product is found by both
        assert sum(w in [h.id for h in hits] for (_, w), hits in zip(asked, want)) == len(asked)
        assert sum(w in [h.id for h in hits] for (_, w), hits in zip(asked, got)) == len(asked)
    flt = {"size": "M"}
    for hits in milvus.hybrid_search(vectors, texts, 4, flt, alpha=0.5):
        assert len(hits) == 4 and all(h.metadata["size"] == "M" for h in hits)


def test_milvus_writes_keep_the_counts_and_a_reopen_recounts(milvus_pair, tmp_path, embedder) -> None:
    from gpuprompt.index import MilvusIndex

    milvus, local = milvus_pair
    milvus.lexical_search(["red"], 1)  # the counts exist: this handle's writes keep them in step
    vectors = embedder.embed(["SKU-00001-AA spare part", "SKU-00002-BB spare part"])
    for index in (milvus, local):
        index.add(["new-1", "new-2"], vectors, documents=["SKU-00001-AA spare part", "SKU-00002-BB spare part"])
        index.delete(["new-2"])
    assert milvus._lexical_counts().documents == local.lexical_stats().documents
    assert milvus.lexical_search(["SKU-00001-AA"], 3)[0][0].id == "new-1"
    assert "new-2" not in [h.id for h in milvus.lexical_search(["SKU-00002-BB"], 3)[0]]
    milvus.close()
    again = MilvusIndex(embedder.dim, uri=str(tmp_path / "kb.db"), index_type="FLAT")
    assert again.lexical_search(["SKU-00001-AA"], 3)[0][0].id == "new-1"
    assert again._lexical_counts().documents == local.lexical_stats().documents
    again.close()


def test_a_store_without_a_lexical_leg_is_refused_with_the_fix() -> None:
    from gpuprompt.rag import check_retrieval
    from gpuprompt.rag._retrieve import lexical_capable

    class DenseOnly:
        pass

    with pytest.raises(ConfigurationError, match="lexical leg"):
        lexical_capable(DenseOnly(), "hybrid")
    with pytest.raises(InvalidInputError, match="'mode'"):
        check_retrieval("fuzzy")
    with pytest.raises(InvalidInputError, match="mode 'hybrid'"):
        check_retrieval("dense", alpha=0.5)
