"""The ``embed-peer`` bench's plumbing: registered, its /proc readers, its venv reuse, and one real
``gpuprompt serve --chat-model none`` started, driven by the bench's client and stopped (infinity
itself is installed only by the bench: 1.6 GB)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuprompt.apps.bench import scenarios

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_the_scenario_is_registered() -> None:
    table = scenarios()
    assert "embed-peer" in table and "infinity-emb 0.0.78" in table["embed-peer"].description


def test_proc_readers_count_the_whole_tree() -> None:
    from gpuprompt.apps.bench._peer import machine_busy_s, tree_cpu_s, tree_rss_bytes

    child = subprocess.Popen([sys.executable, "-c", "import sys; x = bytearray(200 * 2**20); sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        for _ in range(1200):  # until the child holds its 200 MiB (its start is not instant)
            if tree_rss_bytes(child.pid) > 200 * 2**20:
                break
            time.sleep(0.05)
        assert tree_rss_bytes(child.pid) > 200 * 2**20
        assert tree_rss_bytes(os.getpid()) > tree_rss_bytes(child.pid)  # this process's tree holds the child
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(30)
    before, busy = tree_cpu_s(os.getpid()), machine_busy_s()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert tree_cpu_s(os.getpid()) - before > 0.05  # a child waited for counts (cutime)
    assert machine_busy_s() - busy > 0.05


def test_a_ready_venv_is_reused_and_a_stale_marker_is_not(tmp_path: Path) -> None:
    from gpuprompt.apps.bench._peer import INFINITY_REQUIREMENTS, infinity_venv

    folder = tmp_path / "infinity-venv"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "infinity_emb").write_text("#!/bin/sh\n")
    (folder / ".gpuprompt-ready").write_text(" ".join(INFINITY_REQUIREMENTS) + "\n")
    assert infinity_venv(tmp_path) == folder  # reused: nothing installed, nothing removed
    assert (folder / "bin" / "infinity_emb").exists()


def test_our_server_alone_through_the_bench_client(tmp_path: Path, embedder) -> None:
    from gpuprompt.apps.bench import embed_peer
    from gpuprompt.models import resolve_embedding_model

    probe = embed_peer._probe()
    server = embed_peer._server("fp32", resolve_embedding_model(None), tmp_path, tmp_path, tmp_path, run=0)
    assert "--chat-model" in server.command and server.command[server.command.index("--chat-model") + 1] == "none"
    server.start(timeout=600)
    try:
        figures = asyncio.run(embed_peer._drive(server, 0, 64, embed_peer.BULK_BATCH, probe))
    finally:
        server.stop()
    assert server.process is not None and server.process.returncode == 0  # SIGTERM drained and exited 0
    assert embed_peer._cosine_min(figures.pop("vectors"), embedder.embed(probe).tolist()) > 0.9999
    for name in ("callers_texts_per_s", "bulk_texts_per_s", "callers_cpu_ms_per_text", "bulk_cpu_ms_per_text"):
        assert figures[name] > 0, name
    assert 0 <= figures["others_cpu_share"] <= 1.05  # a share of the machine (tick rounding aside)
    assert figures["peak_rss_mb"] >= figures["rss_mb"] > 100
    assert figures["callers_p95_ms"] >= figures["callers_p50_ms"]
