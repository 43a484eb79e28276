"""backend="onnx": the same fp32 embedder and cross-encoder exported once to ONNX and run by
onnxruntime on CPU. The vectors and scores equal torch's, batching and the cache behave as with torch,
the export is checked against torch when it is built (a mismatch refuses it, leaving nothing), and
the refusals are typed."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="backend='onnx' needs the quant extra: pip install 'gpuprompt[quant]'")

from gpuprompt import Embedder, Reranker, Runtime
from gpuprompt import _int8 as onnx_build  # where the builds look up onnxruntime (patched below)
from gpuprompt._corpus import prose_paragraphs
from gpuprompt._int8 import COMPLETE_MARK, FP32_RECIPE, build_fp32, fingerprint
from gpuprompt.errors import ConfigurationError, DependencyError, ModelLoadError

TEXTS = [
    "Is the red linen dress machine washable?",
    "Cotton shrinks about 3% after the first hot wash.",
    "",
    "short",
    "Größe M oder L? " * 3,
    "word " * 400,  # truncated at the model's 256 tokens, as with torch
]
QUERY = "How is an assignment statement evaluated?"


@pytest.fixture(scope="module")
def onnx_embedder():
    emb = Embedder(device="cpu", backend="onnx").load()
    yield emb
    emb.close()


@pytest.fixture(scope="module")
def onnx_reranker(cross_encoder_path: str):
    rr = Reranker(cross_encoder_path, device="cpu", backend="onnx").load()
    yield rr
    rr.close()


# ------------------------------------------------------------------------------- embedder
def test_onnx_embedder_equals_torch(onnx_embedder: Embedder, embedder: Embedder) -> None:
    assert onnx_embedder.backend == "onnx" and embedder.backend == "torch"
    assert onnx_embedder.quantization is None and onnx_embedder.quality is None
    assert onnx_embedder.identity == embedder.identity  # same vectors: an index built by either serves both
    assert "backend='onnx'" in repr(onnx_embedder) and "backend" not in repr(embedder)
    ours, reference = onnx_embedder.embed(TEXTS), embedder.embed(TEXTS)
    assert ours.shape == reference.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    assert onnx_embedder.count_tokens(TEXTS) == embedder.count_tokens(TEXTS)


def test_onnx_concurrent_callers_share_batches_and_equal_one_bulk_call(onnx_embedder: Embedder) -> None:
    texts = [f"onnx parity question {i}: does item {i * 13} come in size {i % 7}?" for i in range(64)]
    before = onnx_embedder.stats().batcher.batches
    singles: dict[int, np.ndarray] = {}

    def one(i: int) -> None:
        singles[i] = onnx_embedder.embed([texts[i]])[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batches = onnx_embedder.stats().batcher.batches - before
    assert batches < len(texts)  # callers were coalesced
    onnx_embedder.clear_cache()
    bulk = onnx_embedder.embed(texts)
    np.testing.assert_allclose(np.stack([singles[i] for i in range(len(texts))]), bulk, atol=1e-5)


async def test_onnx_aembed_matches_embed(onnx_embedder: Embedder) -> None:
    np.testing.assert_allclose(await onnx_embedder.aembed(TEXTS[:3]), onnx_embedder.embed(TEXTS[:3]), atol=1e-6)


def test_torch_and_onnx_are_separate_shared_instances() -> None:
    runtime = Runtime(device="cpu")
    torch_side, onnx_side = runtime.embedder(), runtime.embedder(backend="onnx")
    assert torch_side is not onnx_side and onnx_side is runtime.embedder(backend="onnx")
    assert "not loaded" in repr(onnx_side) and "backend='onnx'" in repr(onnx_side)


def test_close_releases_the_onnx_session() -> None:
    emb = Embedder(device="cpu", backend="onnx").load()  # the export is cached: this only loads it
    forward = emb._forward
    emb.embed(["before close"])
    emb.close()
    assert forward._session is None


# ------------------------------------------------------------------------------- reranker
def test_onnx_reranker_equals_torch(onnx_reranker: Reranker, reranker: Reranker) -> None:
    docs = prose_paragraphs()[:8] + ["", "x", "longword " * 600]
    pairs = [(QUERY, d) for d in docs] + [("", "empty query"), ("x " * 700, "a long query")]
    assert onnx_reranker.backend == "onnx" and reranker.backend == "torch"
    assert onnx_reranker.identity == reranker.identity and onnx_reranker.quantization is None
    np.testing.assert_allclose(onnx_reranker.score(pairs), reranker.score(pairs), atol=1e-5)
    ours, reference = onnx_reranker.rerank(QUERY, docs), reranker.rerank(QUERY, docs)
    assert [h.index for h in ours] == [h.index for h in reference]
    assert onnx_reranker.stats().truncated >= 2


def test_onnx_reranker_concurrent_callers_agree_with_alone(onnx_reranker: Reranker) -> None:
    docs = prose_paragraphs()[20:28]
    queries = [f"{QUERY} (caller {i})" for i in range(4)]
    alone = {q: onnx_reranker.rerank(q, docs) for q in queries}
    onnx_reranker.clear_cache()
    together: dict[str, list] = {}

    def one(q: str) -> None:
        together[q] = onnx_reranker.rerank(q, docs)

    threads = [threading.Thread(target=one, args=(q,)) for q in queries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for q in queries:
        assert [h.index for h in together[q]] == [h.index for h in alone[q]]
        np.testing.assert_allclose([h.score for h in together[q]], [h.score for h in alone[q]], atol=1e-5)


# ------------------------------------------------------------------------------- the adapters
def test_langchain_embeddings_take_sentence_transformers_backend_argument(onnx_embedder: Embedder,
                                                                          sentence_transformer) -> None:
    from langchain_gpuprompt import GPUPromptEmbeddings

    # What a HuggingFaceEmbeddings user writes for sentence-transformers' onnx backend, unchanged.
    ours = GPUPromptEmbeddings(model_kwargs={"device": "cpu", "backend": "onnx"},
                               encode_kwargs={"normalize_embeddings": True})
    assert ours.backend == "onnx" and ours._config().backend == "onnx"
    assert ours.embedder.backend == "onnx" and "backend='onnx'" in repr(ours)
    np.testing.assert_allclose(ours.embed_documents(TEXTS[:4]),
                               sentence_transformer.encode(TEXTS[:4], normalize_embeddings=True), atol=1e-5)
    from llamaindex_gpuprompt import GPUPromptEmbedding

    li = GPUPromptEmbedding(device="cpu", embedder_options={"backend": "onnx"})
    assert li.embedder.backend == "onnx"
    np.testing.assert_allclose(li.get_text_embedding_batch(TEXTS[:2]), onnx_embedder.embed(TEXTS[:2]), atol=1e-5)
    with pytest.raises(ConfigurationError, match="'backend' must be one of 'torch', 'onnx'"):
        GPUPromptEmbeddings(model_kwargs={"backend": "openvino"})
    with pytest.raises(ConfigurationError, match="disagree"):
        GPUPromptEmbeddings(backend="torch", model_kwargs={"backend": "onnx"})


def test_langchain_and_llamaindex_rerankers_run_onnx(onnx_reranker: Reranker, reranker: Reranker,
                                                     cross_encoder_path: str) -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from langchain_gpuprompt import GPUPromptReranker
    from llamaindex_gpuprompt import GPUPromptRerank

    docs = prose_paragraphs()[40:52]
    expected = [h.index for h in reranker.rerank(QUERY, docs, top_n=3)]
    lc = GPUPromptReranker(model=cross_encoder_path, device="cpu", backend="onnx", top_n=3)
    assert lc.reranker.backend == "onnx"
    got = lc.compress_documents([Document(page_content=d, metadata={"i": i}) for i, d in enumerate(docs)], QUERY)
    assert [d.metadata["i"] for d in got] == expected
    li = GPUPromptRerank(model=cross_encoder_path, device="cpu", backend="onnx", top_n=3, max_length=512)
    assert li.reranker.backend == "onnx"
    nodes = li.postprocess_nodes([NodeWithScore(node=TextNode(text=d, id_=f"n{i}"), score=0.0)
                                  for i, d in enumerate(docs)], query_bundle=QueryBundle(QUERY))
    assert [n.node.id_ for n in nodes] == [f"n{i}" for i in expected]
    with pytest.raises(ConfigurationError, match="'backend'"):
        GPUPromptReranker(model=cross_encoder_path, backend="tensorrt")
    with pytest.raises(ConfigurationError, match="'backend'"):
        GPUPromptRerank(model=cross_encoder_path, backend="tensorrt")


async def test_the_server_serves_the_onnx_models_and_says_so(onnx_embedder: Embedder, onnx_reranker: Reranker,
                                                               embedder: Embedder, reranker: Reranker) -> None:
    from support.asgi import InProcessServer

    from gpuprompt.server import create_app

    served = InProcessServer(create_app(chat_model="none", embedder=onnx_embedder, reranker=onnx_reranker)).start()
    try:
        async with served.client() as client:
            health = (await client.get("/health")).json()
            vectors = (await client.post("/v1/embeddings", json={"input": TEXTS[:3]})).json()
            ranked = (await client.post("/v1/rerank", json={"query": QUERY, "documents": TEXTS[:4]})).json()
    finally:
        served.stop()
    assert (health["embed_backend"], health["rerank_backend"]) == ("onnx", "onnx")
    assert health["embedder_identity"] == embedder.identity
    np.testing.assert_allclose([item["embedding"] for item in vectors["data"]], embedder.embed(TEXTS[:3]), atol=1e-5)
    assert [r["index"] for r in ranked["results"]] == [h.index for h in reranker.rerank(QUERY, TEXTS[:4])]


# ------------------------------------------------------------------------------- the build
def test_an_export_that_differs_from_torch_is_refused_and_leaves_nothing(tmp_path: Path, tiny_model: Path) -> None:
    model = tiny_model
    root = tmp_path / "models"

    def export(path: Path) -> None:
        path.write_bytes(b"not a graph")

    with pytest.raises(ModelLoadError, match=r"relative difference 0\.5 > 0\.0001.*use backend='torch'"):
        build_fp32(str(model), "org/tiny", "embed", export=export,
                   check=lambda path: (np.array([2.0, 1.0]), np.array([1.0, 1.0])), root=root)
    with pytest.raises(ModelLoadError, match="relative difference inf"):  # a different shape is a mismatch too
        build_fp32(str(model), "org/tiny", "embed", export=export,
                   check=lambda path: (np.zeros(3), np.zeros(2)), root=root)
    assert [p.suffix for p in root.iterdir()] == [".lock"]  # no folder, finished or half-written


class CountingExport:
    """An export that writes a stand-in graph and counts its calls (the build logic under test, not ONNX)."""

    def __init__(self) -> None:
        self.calls: list[Path] = []

    def __call__(self, path: Path) -> None:
        self.calls.append(path)
        path.write_bytes(b"graph")


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def test_a_checked_export_is_built_once_and_reused(tmp_path: Path, tiny_model: Path) -> None:
    export = CountingExport()

    def check(path: Path) -> tuple[np.ndarray, np.ndarray]:
        return np.array([3.0, -4.0]), np.array([3.0, -4.0 + 1e-6])

    first = build_fp32(str(tiny_model), "org/tiny", "rerank", export=export, check=check, root=tmp_path / "models")
    again = build_fp32(str(tiny_model), "org/tiny", "rerank", export=export, check=check, root=tmp_path / "models")
    assert first == again and len(export.calls) == 1
    assert first.parent.name.startswith(f"tiny-rerank-{FP32_RECIPE}-") and (first.parent / COMPLETE_MARK).is_file()
    assert (first.parent / "check.json").is_file()


def test_a_cached_export_that_was_changed_is_built_again(tmp_path: Path, tiny_model: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    export = CountingExport()

    def check(path: Path) -> tuple[np.ndarray, np.ndarray]:
        return np.ones(2), np.ones(2)

    first = build_fp32(str(tiny_model), "org/tiny", "embed", export=export, check=check, root=tmp_path / "models")
    first.write_bytes(b"graph, edited after the check")  # altered (or truncated) on disk
    with caplog.at_level(logging.WARNING, logger="gpuprompt._int8"):
        again = build_fp32(str(tiny_model), "org/tiny", "embed", export=export, check=check, root=tmp_path / "models")
    assert again == first and again.read_bytes() == b"graph" and len(export.calls) == 2
    assert any("not the one checked against torch" in r.message for r in caplog.records)


def test_a_model_saved_again_in_place_gets_a_new_build(tmp_path: Path, tiny_model: Path) -> None:
    model = tiny_model
    weights = bytearray(3 << 20)  # a fine-tune of the same shapes: same names, same sizes
    (model / "model.safetensors").write_bytes(weights)
    before = fingerprint(str(model), FP32_RECIPE)
    weights[-1] = 1  # only the last layer (the head) changed, past the first MiB
    (model / "model.safetensors").write_bytes(weights)
    after = fingerprint(str(model), FP32_RECIPE)
    assert before != after
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    assert fingerprint(str(copy), FP32_RECIPE) == after  # the same files elsewhere share the build
    assert fingerprint(str(model), FP32_RECIPE + "rerank") != after


def test_missing_onnxruntime_is_a_dependency_error(monkeypatch: pytest.MonkeyPatch, cross_encoder_path: str) -> None:
    def missing() -> None:
        raise DependencyError("backend='onnx' needs onnxruntime and onnx: pip install 'gpuprompt[quant]'")

    monkeypatch.setattr(onnx_build, "onnxruntime", missing)
    with pytest.raises(DependencyError, match=r"pip install 'gpuprompt\[quant\]'"):
        Reranker(cross_encoder_path, device="cpu", backend="onnx").load()


# ------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("cls", [Embedder, Reranker], ids=["Embedder", "Reranker"])
def test_bad_backend_options_are_typed(cls: type) -> None:
    with pytest.raises(ConfigurationError, match="'backend' must be one of 'torch', 'onnx' \\(got 'tensorrt'"):
        cls(backend="tensorrt")
    with pytest.raises(ConfigurationError, match=r"backend='onnx' runs on CPU only \(got device='cuda'\)"):
        cls(backend="onnx", device="cuda")
    with pytest.raises(ConfigurationError, match="'dtype' must be None or 'float32' with backend='onnx'"):
        cls(backend="onnx", dtype="bfloat16")
    assert "not loaded" in repr(cls(backend="onnx", device="cpu"))  # valid: constructing loads nothing


@pytest.mark.gpu
def test_on_cuda_auto_with_onnx_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="resolved to 'cuda"):
        Embedder(device="auto", backend="onnx").load()
