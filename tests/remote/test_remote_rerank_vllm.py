"""The remote reranker against vLLM's own ``/v1/rerank``: vLLM's OpenAI server (the CPU build here)
serving the session's cross-encoder folder with the pooling runner; ``RemoteReranker`` and
``GPUPromptReranker(base_url=...)`` talk to it unchanged and rank as the in-process Reranker does."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
from support.live import vllm_api_server

from gpuprompt._corpus import prose_paragraphs

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                   reason="vLLM is not installed")]


@pytest.fixture(scope="module")
def vllm_rerank_server(cross_encoder_path: str, tmp_path_factory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("vllm-rerank") / "server.log"
    with vllm_api_server(cross_encoder_path, log, "--runner", "pooling", "--max-model-len", "512",
                         "--dtype", "float32") as url:
        yield url


def test_remote_reranker_over_vllms_rerank_route_ranks_as_in_process(vllm_rerank_server: str, reranker) -> None:
    from langchain_core.documents import Document

    from gpuprompt.remote import RemoteReranker
    from langchain_gpuprompt import GPUPromptReranker

    docs = prose_paragraphs()[60:72]
    query = "What does the with statement guarantee?"
    local = reranker.rerank(query, docs, top_n=5)
    remote = RemoteReranker(vllm_rerank_server)
    hits = remote.rerank(query, docs, top_n=5)
    assert [h.index for h in hits] == [h.index for h in local]
    assert [h.score for h in hits] == pytest.approx([h.score for h in local], abs=1e-3)
    compressor = GPUPromptReranker(base_url=vllm_rerank_server, top_n=3)
    kept = compressor.compress_documents([Document(page_content=d) for d in docs], query)
    assert [d.page_content for d in kept] == [docs[h.index] for h in local[:3]]
    remote.close()
