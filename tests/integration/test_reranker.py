"""Reranker: scores equal sentence-transformers CrossEncoder on the same model, concurrent callers
share batches, the cache serves repeats, cancellation and bad input are typed and never hang others."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from gpuprompt import Reranker, get_runtime
from gpuprompt._corpus import prose_paragraphs
from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, ModelLoadError

QUERY = "How is an assignment statement evaluated?"


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return prose_paragraphs()[:20]


@pytest.fixture(scope="module")
def cross_encoder(cross_encoder_path: str):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(cross_encoder_path, device="cpu")


def test_scores_equal_cross_encoder_predict(reranker: Reranker, cross_encoder, docs: list[str]) -> None:
    edge = ["", "x", "Größe M oder L?", "longword " * 600, "SKU-48213-QX, size M"]
    pairs = [(QUERY, d) for d in docs + edge] + [("", "empty query"), ("x " * 700, "a long query")]
    expected = cross_encoder.predict(pairs)
    assert reranker.activation == "sigmoid" and reranker.max_length == cross_encoder.max_seq_length
    np.testing.assert_allclose(reranker.score(pairs), expected, atol=1e-4)
    assert reranker.stats().truncated >= 2  # the long document and the long query were cut, never refused


def test_rerank_orders_by_score_best_first(reranker: Reranker, cross_encoder, docs: list[str]) -> None:
    expected = cross_encoder.predict([(QUERY, d) for d in docs])
    hits = reranker.rerank(QUERY, docs)
    assert [h.index for h in hits] == sorted(range(len(docs)), key=lambda i: (-expected[i], i))
    assert all(h.document == docs[h.index] for h in hits)
    np.testing.assert_allclose([h.score for h in hits], sorted(expected, reverse=True), atol=1e-4)
    top = reranker.rerank(QUERY, docs, top_n=3)
    assert top == hits[:3]
    assert reranker.rerank(QUERY, docs, top_n=100) == hits
    assert reranker.rerank(QUERY, []) == []


def test_the_runtime_shares_one_reranker_per_config(reranker: Reranker, cross_encoder_path: str) -> None:
    assert get_runtime().reranker(cross_encoder_path, device="cpu") is reranker
    assert "not loaded" in repr(Reranker(cross_encoder_path))  # constructing loads nothing


def test_concurrent_callers_share_batches_and_agree(reranker: Reranker, docs: list[str]) -> None:
    queries = [f"{QUERY} (caller {i})" for i in range(4)]
    alone = {q: reranker.rerank(q, docs) for q in queries}
    reranker.clear_cache()
    before = reranker.stats().batcher
    results: dict[str, list] = {}
    barrier = threading.Barrier(len(queries))

    def call(q: str) -> None:
        barrier.wait()
        results[q] = reranker.rerank(q, docs)

    threads = [threading.Thread(target=call, args=(q,)) for q in queries]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Pairs scored in batches whose make-up depends on arrival differ by ~1e-6 (rounding to 5
    # places once split a score across a boundary): the same hits in the same order, each score
    # within 1e-5.
    for q in queries:
        assert [h.index for h in results[q]] == [h.index for h in alone[q]]
        assert [h.score for h in results[q]] == pytest.approx([h.score for h in alone[q]], abs=1e-5)
    after = reranker.stats().batcher
    batches = after.batches - before.batches
    assert batches < len(queries)  # 4 calls of 20 pairs were coalesced into fewer batches
    assert after.max_batch_size > len(docs)


async def test_async_callers_share_batches(reranker: Reranker, docs: list[str]) -> None:
    reranker.clear_cache()
    queries = [f"async question {i}" for i in range(6)]
    results = await asyncio.gather(*(reranker.arerank(q, docs, top_n=4) for q in queries))
    for q, hits in zip(queries, results):
        assert hits == reranker.rerank(q, docs, top_n=4)  # served from the cache now, equal


def test_repeated_pairs_are_served_from_the_cache(reranker: Reranker, docs: list[str]) -> None:
    reranker.rerank("a cached question", docs)
    hits_before = reranker.stats().cache_hits
    reranker.rerank("a cached question", docs + docs[:5])  # duplicates within a call are scored once
    assert reranker.stats().cache_hits - hits_before == len(docs)


async def test_a_cancelled_caller_never_hangs_the_others(reranker: Reranker, docs: list[str]) -> None:
    reranker.clear_cache()
    many = [f"{d} (copy {i})" for i in range(10) for d in docs]
    doomed = asyncio.ensure_future(reranker.arerank("doomed", many))
    others = [asyncio.ensure_future(reranker.arerank(f"kept {i}", docs)) for i in range(3)]
    await asyncio.sleep(0)
    doomed.cancel()
    results = await asyncio.wait_for(asyncio.gather(*others), 60)
    assert all(len(r) == len(docs) for r in results)
    with pytest.raises(asyncio.CancelledError):
        await doomed


@pytest.mark.parametrize(
    ("query", "documents", "top_n", "error", "match"),
    [
        (None, ["a"], None, InputTypeError, "'query'"),
        (3, ["a"], None, InputTypeError, "'query'"),
        ("q", "a bare string", None, InputTypeError, "bare str"),
        ("q", ["a", None], None, InputTypeError, r"documents\[1\]"),
        ("q", ["a", b"bytes"], None, InputTypeError, r"documents\[1\]"),
        ("q", ["fine", "lone \ud800 surrogate"], None, InvalidInputError, r"documents\[1\]"),
        ("lone \udfff", ["a"], None, InvalidInputError, "'query'"),
        ("q", ["a"], 0, InvalidInputError, "'top_n'"),
        ("q", ["a"], -2, InvalidInputError, "'top_n'"),
        ("q", ["a"], True, InvalidInputError, "'top_n'"),
        ("q", ["a"], 1.5, InvalidInputError, "'top_n'"),
        ("q", {"a": 1}, None, InputTypeError, "'documents'"),
    ],
)
def test_bad_input_is_typed_and_names_the_item(reranker: Reranker, query, documents, top_n, error, match) -> None:
    with pytest.raises(error, match=match):
        reranker.rerank(query, documents, top_n=top_n)


def test_too_many_documents_are_refused_before_any_work(cross_encoder_path: str) -> None:
    small = get_runtime().reranker(cross_encoder_path, device="cpu", max_documents=5)
    with pytest.raises(InvalidInputError, match="at most 5"):
        small.rerank("q", ["d"] * 6)
    with pytest.raises(InputTypeError, match=r"pairs\[0\]"):
        small.score([("only one",)])


def test_bad_configuration_is_typed(cross_encoder_path: str, tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="unknown Reranker option"):
        Reranker(cross_encoder_path, temperature=1)
    with pytest.raises(ConfigurationError, match="activation"):
        Reranker(cross_encoder_path, activation="softmax")
    with pytest.raises(ConfigurationError, match="int8"):
        Reranker(cross_encoder_path, quantize="int8", device="cuda")
    with pytest.raises(ModelLoadError, match="does not exist"):
        Reranker(str(tmp_path / "missing")).load()


def test_a_model_with_several_labels_is_refused(tmp_path) -> None:
    from transformers import AutoTokenizer, BertForSequenceClassification

    from gpuprompt.models import resolve_embedding_model

    path = resolve_embedding_model(None)
    BertForSequenceClassification.from_pretrained(path, num_labels=3).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(path).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="3 labels"):
        Reranker(str(tmp_path), device="cpu").load()


def test_identity_activation_gives_the_raw_logits(reranker: Reranker, cross_encoder_path: str,
                                                  docs: list[str]) -> None:
    raw = Reranker(cross_encoder_path, device="cpu", activation="identity")
    try:
        logits = np.array(raw.score([(QUERY, d) for d in docs[:5]]))
        np.testing.assert_allclose(1 / (1 + np.exp(-logits)), reranker.score([(QUERY, d) for d in docs[:5]]),
                                   atol=1e-5)
    finally:
        raw.close()


def test_the_activation_sentence_transformers_saved_is_the_one_used(cross_encoder_path: str, docs: list[str],
                                                                   tmp_path) -> None:
    """sentence-transformers 4+ saves ``activation_fn`` in ``config_sentence_transformers.json`` (many
    trained rerankers ship raw logits that way): the scores are CrossEncoder's, logits here."""
    import torch
    from sentence_transformers import CrossEncoder

    CrossEncoder(cross_encoder_path, device="cpu", activation_fn=torch.nn.Identity()).save(str(tmp_path))
    pairs = [(QUERY, d) for d in docs[:6]]
    expected = CrossEncoder(str(tmp_path), device="cpu").predict(pairs)
    saved = Reranker(str(tmp_path), device="cpu")
    try:
        assert saved.activation == "identity"
        np.testing.assert_allclose(saved.score(pairs), expected, atol=1e-4)
    finally:
        saved.close()


def test_a_max_length_past_the_models_positions_is_a_configuration_error(cross_encoder_path: str) -> None:
    too_long = Reranker(cross_encoder_path, device="cpu", max_length=1024)
    with pytest.raises(ConfigurationError, match="max_position_embeddings"):
        too_long.load()  # not a RuntimeError from torch in the batch worker


def test_a_very_long_document_scores_as_cross_encoder_reads_it(reranker: Reranker, cross_encoder) -> None:
    """A long text is read from a prefix that tokenises as the whole text: the same scores and token
    counts as CrossEncoder's, which reads (and truncates) the whole text."""
    long_text = " ".join(prose_paragraphs()[100:400])
    assert len(long_text) > 16 * reranker.max_length
    pairs = [(QUERY, long_text), (long_text, "a short document"), ("a query " * 40, long_text)]
    np.testing.assert_allclose(reranker.score(pairs), cross_encoder.predict(pairs), atol=1e-4)
    assert reranker.count_tokens(pairs) == 3 * reranker.max_length
