"""GPUPromptEmbeddings behaviour beyond the standard suite: equality, coalescing, errors, laziness."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gpuprompt.errors import ConfigurationError, InputTypeError
from langchain_gpuprompt import GPUPromptEmbeddings


def test_construction_loads_nothing() -> None:
    embeddings = GPUPromptEmbeddings(batch_size=8)
    assert embeddings._embedder is None


def test_same_settings_share_one_core_embedder(lc_embeddings: GPUPromptEmbeddings) -> None:
    assert GPUPromptEmbeddings().embedder is lc_embeddings.embedder
    assert GPUPromptEmbeddings(batch_size=7).embedder is not lc_embeddings.embedder


def test_vectors_equal_sentence_transformers(lc_embeddings: GPUPromptEmbeddings, sentence_transformer) -> None:
    texts = ["a red summer dress", "waterproof hiking boots", "how do I return an item?"]
    ours = np.array(lc_embeddings.embed_documents(texts))
    reference = sentence_transformer.encode(texts, normalize_embeddings=True)
    assert ours.shape == (3, 384)
    assert np.allclose(ours, reference, atol=1e-5)
    assert np.allclose(lc_embeddings.embed_query(texts[1]), reference[1], atol=1e-5)
    assert all(type(x) is float for x in lc_embeddings.embed_query("x"))


async def test_async_equals_sync(lc_embeddings: GPUPromptEmbeddings) -> None:
    texts = ["wool socks", "linen shirt"]
    assert np.allclose(await lc_embeddings.aembed_documents(texts), lc_embeddings.embed_documents(texts), atol=1e-6)
    assert np.allclose(await lc_embeddings.aembed_query("wool socks"), lc_embeddings.embed_query("wool socks"), atol=1e-6)


async def test_concurrent_queries_are_coalesced(lc_embeddings: GPUPromptEmbeddings) -> None:
    embedder = lc_embeddings.embedder
    texts = [f"coalesce probe question number {i} about shipping" for i in range(32)]
    before = embedder.stats().batcher.batches
    vectors = await asyncio.gather(*(lc_embeddings.aembed_query(t) for t in texts))
    batches = embedder.stats().batcher.batches - before
    assert batches < len(texts)
    expected = lc_embeddings.embed_documents(texts)  # now cache hits: same vectors
    assert np.allclose(vectors, expected, atol=1e-6)


def test_repeats_are_served_from_the_device_cache(lc_embeddings: GPUPromptEmbeddings) -> None:
    embedder = lc_embeddings.embedder
    lc_embeddings.embed_documents(["cache probe alpha", "cache probe beta"])
    hits = embedder.stats().cache_hits
    lc_embeddings.embed_documents(["cache probe alpha", "cache probe beta"])
    assert embedder.stats().cache_hits == hits + 2


def test_bad_input_is_a_typed_error(lc_embeddings: GPUPromptEmbeddings) -> None:
    with pytest.raises(InputTypeError, match="'text' must be a str"):
        lc_embeddings.embed_query(42)  # type: ignore[arg-type]
    with pytest.raises(InputTypeError, match="wrap it in a list"):
        lc_embeddings.embed_documents("not a list")  # type: ignore[arg-type]
    with pytest.raises(InputTypeError, match=r"'texts\[1\]'"):
        lc_embeddings.embed_documents(["ok", None])  # type: ignore[list-item]


def test_bad_options_fail_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="'batch_size' must be an int >= 1"):
        GPUPromptEmbeddings(batch_size=0)
    with pytest.raises(ConfigurationError, match="'dtype'"):
        GPUPromptEmbeddings(dtype="int8")
    with pytest.raises(ConfigurationError, match="'modle' is not an option of GPUPromptEmbeddings"):
        GPUPromptEmbeddings(modle="typo")  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="'batch_size' must be a valid integer"):
        GPUPromptEmbeddings(batch_size=None)  # type: ignore[arg-type]
