"""The remote reranker against vLLM's own ``/v1/rerank``: vLLM's OpenAI server (the CPU build here)
serving the session's cross-encoder folder with the pooling runner; ``RemoteReranker`` and
``GPUPromptReranker(base_url=...)`` talk to it unchanged and rank as the in-process Reranker does."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.live import wait_until

from gpuprompt._corpus import prose_paragraphs

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                   reason="vLLM is not installed")]


@pytest.fixture(scope="module")
def vllm_rerank_server(cross_encoder_path: str, tmp_path_factory) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("vllm-rerank") / "server.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", cross_encoder_path,
               "--runner", "pooling", "--max-model-len", "512", "--port", str(port), "--host", "127.0.0.1",
               "--enforce-eager", "--dtype", "float32"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            return True
        try:
            return httpx.get(f"{url}/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 400)
        if process.poll() is not None:
            pytest.fail(f"vLLM did not serve the cross-encoder:\n{Path(log).read_text()[-4000:]}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(30)


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
