"""Each text is tokenised once: the caller's encoding is padded into the model's features on the
worker, only where that reproduces the model's own ``preprocess`` exactly."""

from __future__ import annotations

import numpy as np
import pytest

from gpuprompt._tokens import Tokens

TRICKY = [
    "",
    "   ",
    "  leading and trailing  ",
    "UPPER lower MiXeD",
    "naïve café Ünïcödé — “quotes”",
    "tabs\tand\nnewlines\r\n",
    "emoji 🙂 東京",
    "long " * 400,
    "x",
]


def test_the_bundled_model_takes_the_shortcut(embedder) -> None:  # noqa: ANN001
    assert embedder._counter.pretokenizes


def test_features_equal_preprocess(sentence_transformer) -> None:  # noqa: ANN001
    tokens = Tokens(sentence_transformer.tokenizer, sentence_transformer.max_seq_length)
    assert tokens.verify(sentence_transformer.preprocess)
    for batch in (TRICKY, TRICKY[3:4], TRICKY[::-1]):
        got = tokens.features(tokens.encode(batch))
        want = sentence_transformer.preprocess(batch)
        assert set(got) == set(want)
        for key, value in want.items():
            if hasattr(value, "shape"):
                assert got[key].tolist() == value.tolist(), key
            else:
                assert got[key] == value


def test_encode_counts_and_flags_truncation(sentence_transformer) -> None:  # noqa: ANN001
    limit = sentence_transformer.max_seq_length
    tokens = Tokens(sentence_transformer.tokenizer, limit)
    tokens.verify(sentence_transformer.preprocess)
    encoded = tokens.encode(["short text", "long " * 400])
    full = tokens.count(["short text", "long " * 400])
    assert encoded[0].tokens == full[0] and not encoded[0].truncated
    assert encoded[1].tokens == limit and encoded[1].truncated and full[1] > limit


def test_a_preprocess_that_differs_keeps_the_models_own_path(sentence_transformer) -> None:  # noqa: ANN001
    def lowercasing_differently(texts: list[str]) -> dict:
        return sentence_transformer.preprocess([text.upper() + " !" for text in texts])

    tokens = Tokens(sentence_transformer.tokenizer, sentence_transformer.max_seq_length)
    assert not tokens.verify(lowercasing_differently)
    assert not tokens.pretokenizes
    assert tokens.encode(["a b"])[0].ids is None  # the worker then tokenises with preprocess


def test_a_preprocess_that_raises_keeps_the_models_own_path(sentence_transformer) -> None:  # noqa: ANN001
    def broken(texts: list[str]) -> dict:
        raise RuntimeError("no")

    tokens = Tokens(sentence_transformer.tokenizer, sentence_transformer.max_seq_length)
    assert not tokens.verify(broken)


def test_a_tokenizer_without_a_rust_backend_has_no_shortcut(sentence_transformer) -> None:  # noqa: ANN001
    class PythonOnly:  # the interface of a slow (pure Python) tokenizer: no backend_tokenizer
        pad_token_id = 0
        padding_side = "right"

        def __call__(self, texts: list[str], **kwargs: object) -> dict:
            return sentence_transformer.tokenizer(texts, **kwargs)

    tokens = Tokens(PythonOnly(), 256)
    assert not tokens.verify(sentence_transformer.preprocess)
    assert tokens.count(["hello world"]) == [4]
    assert tokens.encode(["hello world"])[0].tokens == 4


@pytest.mark.parametrize("texts", [TRICKY, ["one query"], [f"query number {i}" for i in range(70)]])
def test_vectors_equal_sentence_transformers(embedder, sentence_transformer, texts: list[str]) -> None:  # noqa: ANN001
    embedder.clear_cache()
    got = embedder.embed(texts)
    want = sentence_transformer.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(got, want, atol=2e-5)


# ---------------------------------------------------------------------- very long texts
def _long_texts() -> list[str]:
    from gpuprompt._corpus import prose_paragraphs

    prose = " ".join(prose_paragraphs()[:400])  # real prose, far past any cut
    return [
        prose,
        "Größe M oder L? Taille 38, ¿hay descuento? 東京 タワー 🙂\n" * 3000,
        "tabs\tand\nnewlines\r\n" * 20000,
        prose[:100_000] + " " * 200_000 + "tail",
    ]


def test_a_long_text_is_read_from_a_prefix_that_encodes_as_the_whole_text(sentence_transformer) -> None:  # noqa: ANN001
    limit = sentence_transformer.max_seq_length
    tokens = Tokens(sentence_transformer.tokenizer, limit)
    texts = _long_texts()
    bounded = tokens.bounded(texts)
    assert all(len(b) < len(t) for b, t in zip(bounded, texts))  # each read from a prefix, not whole
    assert all(len(b) <= 16 * max(limit, 256) for b in bounded)
    backend = sentence_transformer.tokenizer.backend_tokenizer
    for text, cut in zip(texts, bounded):
        assert cut == text[:len(cut)]
        whole, short = (sentence_transformer.tokenizer(t, truncation=True, max_length=limit)["input_ids"]
                        for t in (text, cut))
        assert whole == short
    assert [e.tokens for e in tokens.encode(texts)] == [limit] * len(texts)
    assert all(e.truncated for e in tokens.encode(texts))
    assert tokens.capped(texts) == [limit] * len(texts)
    assert backend.truncation is None or backend.truncation.get("max_length") == limit  # the model's own is untouched


def test_a_prefix_that_holds_too_few_tokens_is_not_taken(sentence_transformer) -> None:  # noqa: ANN001
    tokens = Tokens(sentence_transformer.tokenizer, sentence_transformer.max_seq_length)
    spaced = "a few words " + " " * 50_000 + "then the rest " * 10  # the cut falls in the run of spaces
    unbroken = "x" * 50_000  # no whitespace to cut at
    assert tokens.bounded([spaced, unbroken]) == [spaced, unbroken]
    assert tokens.count([spaced]) == [len(sentence_transformer.tokenizer(spaced)["input_ids"])]


def test_pairs_are_cut_only_where_the_truncated_pair_stays_the_same(sentence_transformer) -> None:  # noqa: ANN001
    tokenizer = sentence_transformer.tokenizer
    limit = 512
    tokens = Tokens(tokenizer, limit)
    long_text, *_ = _long_texts()
    cases = [
        ("a short question?", long_text),  # the document is cut
        (long_text, "a short document"),  # the query is cut
        (" ".join(["word"] * 700), long_text),  # a long-ish query: the cut document stays the longer one
        # Two long texts: both cut, keeping which one is longer (it keeps the odd token; on a tie, the
        # second). 30 kB each, so the reference below (the whole pair, whose truncation combines every
        # overflowing window of both texts) stays affordable.
        (both := long_text[:30_000], both[1000:]),
        (both[1000:], both),
        (both, both),
        (both[:20_000] + " pad" * 3000, both[:20_000]),
    ]
    bounded = tokens.bounded_pairs(cases)
    assert len(bounded[0][1]) < len(long_text) and len(bounded[1][0]) < len(long_text)
    assert all(len(bq) < len(q) and len(bd) < len(d) for (q, d), (bq, bd) in zip(cases[3:], bounded[3:]))
    for (q, d), (bq, bd) in zip(cases, bounded):
        whole = tokenizer(q, d, truncation="longest_first", max_length=limit)["input_ids"]
        assert tokenizer(bq, bd, truncation="longest_first", max_length=limit)["input_ids"] == whole


def test_a_long_texts_vector_and_count_equal_the_whole_texts(embedder, sentence_transformer) -> None:  # noqa: ANN001
    texts = _long_texts()[:3]
    want = sentence_transformer.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(embedder.embed(texts), want, atol=1e-5)
    assert embedder.count_tokens(texts) == [sentence_transformer.max_seq_length] * 3
    assert embedder.count_tokens(texts[:1], truncate=False)[0] > 10_000  # a prompt budget counts the whole text


async def test_the_event_loop_never_tokenises_a_long_text_nor_waits_for_the_tokenizer(embedder, monkeypatch) -> None:  # noqa: ANN001
    import asyncio
    import threading

    loop_thread = threading.get_ident()
    seen: list[tuple[int, int]] = []
    encode = Tokens.encode

    def spy(self: Tokens, texts: list[str]):  # noqa: ANN202
        seen.append((threading.get_ident(), max(map(len, texts))))
        return encode(self, texts)

    monkeypatch.setattr(Tokens, "encode", spy)
    await embedder.aembed(["one short text, prepared on the loop (a text no other test embeds)"])
    await embedder.aembed(["(the loop test) " + _long_texts()[0] * 8])  # new to the cache: tokenised
    assert seen[0][0] == loop_thread
    assert seen[1][0] != loop_thread, "a long text was tokenised on the event loop"
    assert (await embedder.acount_tokens(["short"])) == embedder.count_tokens(["short"])

    # Another thread holds the tokenizer: the loop goes on (a small call is prepared on a thread)
    # instead of blocking on the lock. The loop itself lets the holder go; if it were blocked, the
    # holder would give up after 30 s and the test fail.
    release, held = threading.Event(), threading.Event()

    def hold() -> None:
        with embedder._counter_lock:
            held.set()
            assert release.wait(30), "the event loop was blocked while another thread tokenised"

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    pending = [asyncio.ensure_future(embedder.aembed([f"a new short text {i}"])) for i in range(2)]
    pending.append(asyncio.ensure_future(embedder.acount_tokens(["another short text"])))
    await asyncio.sleep(0.05)
    release.set()
    results = await asyncio.wait_for(asyncio.gather(*pending), 60)
    holder.join(30)
    assert [r.shape for r in results[:2]] == [(1, embedder.dim)] * 2 and results[2] == embedder.count_tokens(["another short text"])


async def test_truncate_takes_only_a_bool(embedder) -> None:  # noqa: ANN001
    from gpuprompt.errors import InputTypeError

    with pytest.raises(InputTypeError, match="truncate"):
        embedder.count_tokens(["a"], truncate="no")
    with pytest.raises(InputTypeError, match="truncate"):
        await embedder.acount_tokens(["a"], truncate=1)
