"""GPUPromptEmbedding: the same vectors as sentence-transformers, true async, coalesced queries."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gpuprompt.errors import ConfigurationError, InputTypeError
from llamaindex_gpuprompt import GPUPromptEmbedding

TEXTS = ["a red cotton summer dress", "waterproof leather hiking boots", "stainless steel water bottle"]


def test_query_and_text_embeddings_match_sentence_transformers(li_embed, sentence_transformer) -> None:
    reference = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
    batch = np.asarray(li_embed.get_text_embedding_batch(TEXTS))
    assert batch.shape == (3, 384)
    np.testing.assert_allclose(batch, reference, atol=1e-4)
    np.testing.assert_allclose(li_embed.get_query_embedding(TEXTS[1]), reference[1], atol=1e-4)
    np.testing.assert_allclose(li_embed.get_text_embedding(TEXTS[2]), reference[2], atol=1e-4)
    assert all(isinstance(x, float) for x in li_embed.get_query_embedding("x"))


async def test_async_methods_match_sync(li_embed) -> None:
    sync = li_embed.get_text_embedding_batch(TEXTS)
    batch = await li_embed.aget_text_embedding_batch(TEXTS)
    query = await li_embed.aget_query_embedding(TEXTS[0])
    text = await li_embed.aget_text_embedding(TEXTS[1])
    np.testing.assert_allclose(batch, sync, atol=1e-5)
    np.testing.assert_allclose(query, sync[0], atol=1e-5)
    np.testing.assert_allclose(text, sync[1], atol=1e-5)


async def test_concurrent_query_embeddings_are_coalesced_into_batches(li_embed) -> None:
    before = li_embed.embedder.stats().batcher
    queries = [f"coalesce probe {i}: do you ship boots size {40 + i} to Oslo?" for i in range(24)]
    results = await asyncio.gather(*(li_embed.aget_query_embedding(q) for q in queries))
    after = li_embed.embedder.stats().batcher
    assert len(results) == 24 and all(len(r) == 384 for r in results)
    # 24 single-query calls ran in fewer model batches than calls: they were batched together.
    assert after.batches - before.batches < 24
    assert after.max_batch_size > 1
    np.testing.assert_allclose(results[5], li_embed.get_query_embedding(queries[5]), atol=1e-5)


def test_instructions_are_prepended(li_embed) -> None:
    instructed = GPUPromptEmbedding(embedder=li_embed.embedder, query_instruction="query: ", text_instruction="passage: ")
    np.testing.assert_allclose(instructed.get_query_embedding("boots"), li_embed.get_query_embedding("query: boots"), atol=1e-5)
    np.testing.assert_allclose(instructed.get_text_embedding("boots"), li_embed.get_text_embedding("passage: boots"), atol=1e-5)


def test_shares_the_runtime_embedder(li_embed) -> None:
    # Two instances with the same configuration use one loaded model and one batch queue.
    assert GPUPromptEmbedding().embedder is li_embed.embedder
    assert li_embed.model_name == "sentence-transformers/all-MiniLM-L6-v2"


def test_bad_input_raises_typed_errors(li_embed) -> None:
    with pytest.raises(InputTypeError, match="'query' must be a str"):
        li_embed.get_query_embedding(None)
    with pytest.raises(InputTypeError, match=r"'texts\[1\]' must be a str"):
        li_embed.get_text_embedding_batch(["ok", 3])
    with pytest.raises(ConfigurationError, match="'embedder' must be a gpuprompt.Embedder"):
        GPUPromptEmbedding(embedder="not an embedder")
    with pytest.raises(ConfigurationError, match="'no_such_option' is not an option of GPUPromptEmbedding"):
        GPUPromptEmbedding(no_such_option=1)
    with pytest.raises(ConfigurationError, match="'model_name' must be a valid string"):
        GPUPromptEmbedding(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="'query_instruction' must be a str"):
        GPUPromptEmbedding(embedder=li_embed.embedder, query_instruction=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="unknown option"):
        GPUPromptEmbedding(embedder_options={"bogus": 1})
    with pytest.raises(ConfigurationError, match="'batch_size'"):
        GPUPromptEmbedding(embedder_options={"batch_size": 0})


def test_embeds_nodes_as_a_transformation(li_embed) -> None:
    from llama_index.core.schema import TextNode

    nodes = li_embed([TextNode(text=t) for t in TEXTS])
    np.testing.assert_allclose(nodes[0].embedding, li_embed.get_text_embedding(TEXTS[0]), atol=1e-5)


def test_quantize_int8_vectors_are_close_to_fp32(li_embed) -> None:
    pytest.importorskip("onnxruntime", reason="the int8 embedder needs the quant extra: pip install 'gpuprompt[quant]'")
    int8 = GPUPromptEmbedding(device="cpu", quantize="int8")
    assert int8.embedder.config.quantize == "int8" and int8.embedder is not li_embed.embedder
    assert int8.embedder.quantization == "int8"
    quantized = np.asarray(int8.get_text_embedding_batch(TEXTS))
    reference = np.asarray(li_embed.get_text_embedding_batch(TEXTS))
    assert quantized.shape == reference.shape == (3, 384)
    # Both are L2-normalised: the row-wise dot product is the cosine.
    cosines = (quantized * reference).sum(axis=1)
    assert cosines.min() > 0.98
    assert not np.allclose(quantized, reference, atol=1e-6)  # it really is another forward pass
    query = np.asarray(int8.get_query_embedding(TEXTS[1]))
    assert float(query @ reference[1]) > 0.98
    assert "quantize='int8'" in repr(int8)


@pytest.mark.parametrize("bad", ["int4", "INT8", True, 8])
def test_quantize_bad_value_is_a_typed_error(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="'quantize' must be one of None, 'int8', 'auto'"):
        GPUPromptEmbedding(quantize=bad)  # type: ignore[arg-type]


def test_quantize_conflicts_are_typed_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"must not hold \['quantize'\]"):
        GPUPromptEmbedding(embedder_options={"quantize": "int8"})
    with pytest.raises(ConfigurationError, match="quantize='int8' runs on CPU only"):
        GPUPromptEmbedding(device="cuda", quantize="int8")
