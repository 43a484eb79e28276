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
