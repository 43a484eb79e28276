"""Embedder on the real bundled all-MiniLM-L6-v2: equality, coalescing, cache, errors."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gpuprompt import Embedder
from gpuprompt.embed import EmbedderConfig, EmbeddingCache
from gpuprompt.errors import ClosedError, ConfigurationError, InputTypeError

TEXTS = [
    "Is the red linen dress machine washable?",
    "Cotton shrinks about 3% after the first hot wash.",
    "Blue jeans, 98% cotton 2% elastane, sizes 28-36.",
    "Do you ship to Norway?",
    "",
    "short",
]


def test_shape_dtype_and_equality_with_sentence_transformers(embedder: Embedder, sentence_transformer) -> None:
    ours = embedder.embed(TEXTS)
    reference = sentence_transformer.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    assert ours.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    assert embedder.dim == 384


def test_batched_concurrent_results_equal_unbatched(embedder: Embedder, sentence_transformer) -> None:
    texts = [f"customer question {i}: does item {i * 13} come in size {i % 7}?" for i in range(96)]
    before = embedder.stats().batcher.batches
    with ThreadPoolExecutor(16) as pool:
        rows = list(pool.map(lambda t: embedder.embed([t])[0], texts))
    stats = embedder.stats().batcher
    reference = sentence_transformer.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(np.stack(rows), reference, atol=1e-5)
    # 96 single-text calls from 16 threads must have been coalesced into far fewer forward passes.
    assert stats.batches - before < 96 / 2, stats


def test_bulk_call_keeps_order_across_batches(embedder: Embedder, sentence_transformer) -> None:
    # Lengths vary wildly so that length sorting reorders texts inside the call.
    texts = [("word " * (i % 37)) + f"item {i}" for i in range(150)]
    ours = embedder.embed(texts, show_progress=False)
    reference = sentence_transformer.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_cache_hits_skip_the_model(embedder: Embedder) -> None:
    texts = ["a cached sentence about wool socks", "another cached sentence about hats"]
    first = embedder.embed(texts)
    before = embedder.stats()
    second = embedder.embed(texts[::-1])
    after = embedder.stats()
    np.testing.assert_array_equal(second, first[::-1])
    assert after.cache_hits - before.cache_hits == 2
    assert after.cache_misses == before.cache_misses
    assert after.batcher.batches == before.batcher.batches  # no forward pass


def test_duplicates_within_a_call_are_encoded_once(embedder: Embedder) -> None:
    before = embedder.stats()
    out = embedder.embed(["dup text xyz", "dup text xyz", "dup text xyz", "other text xyz"])
    after = embedder.stats()
    assert after.cache_misses - before.cache_misses == 2
    assert after.deduplicated - before.deduplicated == 2
    np.testing.assert_array_equal(out[0], out[2])


def test_mixed_threads_and_asyncio(embedder: Embedder, sentence_transformer) -> None:
    thread_texts = [f"thread text {i}" for i in range(16)]
    async_texts = [f"async text {i}" for i in range(16)]
    results: dict[str, np.ndarray] = {}

    def worker(text: str) -> None:
        results[text] = embedder.embed([text])[0]

    async def main() -> list[np.ndarray]:
        return list(await asyncio.gather(*(embedder.aembed([t]) for t in async_texts)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in thread_texts]
    for t in threads:
        t.start()
    async_rows = asyncio.run(main())
    for t in threads:
        t.join(30)
    reference = sentence_transformer.encode(thread_texts + async_texts, normalize_embeddings=True)
    np.testing.assert_allclose(np.stack([results[t] for t in thread_texts]), reference[:16], atol=1e-5)
    np.testing.assert_allclose(np.concatenate(async_rows), reference[16:], atol=1e-5)


async def test_aembed_cancellation_drops_work(embedder: Embedder) -> None:
    texts = [f"never embedded because cancelled {i} " + "pad " * 200 for i in range(400)]
    task = asyncio.create_task(embedder.aembed(texts))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The embedder keeps serving; most of the cancelled texts never reached the model.
    out = await embedder.aembed(["after cancellation"])
    assert out.shape == (1, 384)
    stats = embedder.stats()
    assert stats.batcher.cancelled > 0


def test_truncation_is_counted(embedder: Embedder) -> None:
    before = embedder.stats().truncated
    embedder.embed(["longword " * 2000])
    assert embedder.stats().truncated == before + 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("a bare string", "bare str"),
        (["ok", None], r"'texts\[1\]' must be a str \(got None that is a NoneType\)"),
        (["ok", "ok", 3], r"'texts\[2\]' must be a str \(got 3 that is a int\)"),
        ([b"bytes"], r"'texts\[0\]' must be a str"),
        (42, "must be a list of str"),
    ],
)
def test_bad_input_is_typed(embedder: Embedder, bad: object, message: str) -> None:
    with pytest.raises(InputTypeError, match=message):
        embedder.embed(bad)  # type: ignore[arg-type]


def test_empty_list(embedder: Embedder) -> None:
    assert embedder.embed([]).shape == (0, 384)


def test_construction_loads_nothing_and_rejects_unknown_options() -> None:
    emb = Embedder(device="cpu", batch_size=8)
    assert "not loaded" in repr(emb)
    with pytest.raises(ConfigurationError, match=r"unknown Embedder option\(s\) \['batchsize'\]"):
        Embedder(batchsize=8)
    with pytest.raises(ConfigurationError, match="'cache_size' must be an int >= 0"):
        EmbedderConfig(cache_size=-1)


def test_lru_eviction_and_small_cache(sentence_transformer) -> None:
    emb = Embedder(device="cpu", cache_size=2)
    try:
        emb.embed(["one", "two", "three"])  # "one" is evicted
        stats = emb.stats()
        assert stats.cache_entries == 2 and stats.cache_evictions == 1
        before = emb.stats().cache_misses
        emb.embed(["three", "two"])
        assert emb.stats().cache_misses == before  # both still cached
        emb.embed(["one"])
        assert emb.stats().cache_misses == before + 1
        np.testing.assert_allclose(
            emb.embed(["one", "two", "three"]),
            sentence_transformer.encode(["one", "two", "three"], normalize_embeddings=True),
            atol=1e-5,
        )
    finally:
        emb.close()
    with pytest.raises(ClosedError):
        emb.embed(["after close"])


def test_embedding_cache_unit() -> None:
    import torch

    cache = EmbeddingCache(dim=3, capacity=3, device="cpu")
    cache.put([b"a", b"b"], torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]))
    rows, positions = cache.gather([b"x", b"b", b"a"])
    assert positions == [1, 2]
    assert rows.tolist() == [[0, 1.0, 0], [1.0, 0, 0]]
    cache.put([b"c", b"d"], torch.tensor([[0, 0, 1.0], [1.0, 1.0, 1.0]]))  # evicts "b" (LRU: "a" was touched later)
    _, positions = cache.gather([b"a", b"b", b"c", b"d"])
    assert positions == [0, 2, 3]
    assert len(cache) == 3 and cache.evictions == 1


@pytest.mark.gpu
def test_fp16_on_cuda_close_to_fp32(sentence_transformer) -> None:
    emb = Embedder(device="cuda")
    try:
        assert emb.device.startswith("cuda")
        ours = emb.embed(TEXTS)
        reference = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
        np.testing.assert_allclose(ours, reference, atol=5e-3)
    finally:
        emb.close()


@pytest.mark.gpu
def test_cuda_oom_halves_the_batch() -> None:
    import torch

    emb = Embedder(device="cuda", batch_size=64, max_batch_tokens=10**9)
    try:
        emb.load()
        real = emb._model.forward
        calls: list[int] = []

        def flaky(features, **kwargs):
            size = features["input_ids"].shape[0]
            calls.append(size)
            if size > 8:
                raise torch.cuda.OutOfMemoryError("simulated by the test: batch above 8 rows")
            return real(features, **kwargs)

        emb._model.forward = flaky
        texts = [f"oom split text {i}" for i in range(32)]
        out = emb.embed(texts)
        assert out.shape == (32, 384)
        assert max(calls) == 32 and any(c <= 8 for c in calls)
    finally:
        emb.close()
