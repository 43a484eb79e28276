"""``dtype="bfloat16"`` on a CPU with native bf16 (AMX / AVX512-BF16): the embedder and the
reranker run prepacked layers that give exactly the plain bf16 model's output, close to fp32's,
through the core and the adapters. Skips where the CPU emulates bf16 (nothing is packed there)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuprompt import Embedder, Reranker
from gpuprompt._bf16 import bf16_is_native
from gpuprompt._corpus import prose_paragraphs

pytestmark = pytest.mark.skipif(not bf16_is_native(), reason="this CPU has no native bf16 (AMX or AVX512-BF16)")

QUERY = "How is an assignment statement evaluated?"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return prose_paragraphs()[:40] + ["", "?", "Größe M oder L?", "longword " * 600]


def _plain_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpuprompt._bf16.bf16_is_native", lambda: False)


def _packed(model: object) -> bool:
    return any(type(m).__name__ == "PackedLinear" for m in model.modules())  # type: ignore[attr-defined]


def test_bf16_embedder_is_packed_and_equals_plain_bf16(texts: list[str], embedder: Embedder,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    packed = Embedder(device="cpu", dtype="bfloat16", cache_size=0)
    try:
        out = packed.embed(texts)
        assert _packed(packed._model) and out.dtype == np.float32 and out.shape == (len(texts), 384)
        with monkeypatch.context() as patch:
            _plain_bf16(patch)
            plain = Embedder(device="cpu", dtype="bfloat16", cache_size=0)
            try:
                reference = plain.embed(texts)
                assert not _packed(plain._model)
            finally:
                plain.close()
        np.testing.assert_array_equal(out, reference)  # the same oneDNN product, weights packed once
        cosine = np.sum(out * embedder.embed(texts), axis=1)
        assert cosine.min() > 0.999
        assert packed.identity == embedder.identity  # bf16 vectors may share an fp32 index
        # Concurrent single calls are coalesced into the same packed forward.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(8) as pool:
            singles = np.vstack(list(pool.map(lambda t: packed.embed([t])[0], texts[:16])))
        np.testing.assert_allclose(singles, out[:16], atol=2e-2)  # batch make-up moves bf16 rounding
        assert np.sum(singles * out[:16], axis=1).min() > 0.9995
    finally:
        packed.close()


def test_bf16_reranker_is_packed_and_keeps_the_ranking(cross_encoder_path: str, reranker: Reranker,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    documents = prose_paragraphs()[40:60]
    packed = Reranker(cross_encoder_path, device="cpu", dtype="bfloat16", cache_size=0)
    try:
        scores = packed.score([(QUERY, d) for d in documents])
        assert _packed(packed._model)
        with monkeypatch.context() as patch:
            _plain_bf16(patch)
            plain = Reranker(cross_encoder_path, device="cpu", dtype="bfloat16", cache_size=0)
            try:
                assert plain.score([(QUERY, d) for d in documents]) == scores
            finally:
                plain.close()
        fp32 = reranker.score([(QUERY, d) for d in documents])
        np.testing.assert_allclose(scores, fp32, atol=2e-2)
        top = [hit.index for hit in packed.rerank(QUERY, documents, top_n=3)]
        assert top == list(np.argsort(-np.asarray(scores), kind="stable")[:3])
    finally:
        packed.close()


def test_adapters_pass_the_dtype_through(cross_encoder_path: str) -> None:
    from langchain_core.documents import Document

    from langchain_gpuprompt import GPUPromptReranker
    from llamaindex_gpuprompt import GPUPromptRerank

    lc = GPUPromptReranker(model=cross_encoder_path, device="cpu", dtype="bfloat16", top_n=2)
    li = GPUPromptRerank(model=cross_encoder_path, device="cpu", dtype="bfloat16", top_n=2)
    assert lc.reranker.config.dtype == li.reranker.config.dtype == "bfloat16"
    kept = lc.compress_documents([Document(page_content=d) for d in prose_paragraphs()[60:66]], QUERY)
    assert len(kept) == 2 and _packed(lc.reranker._model)
