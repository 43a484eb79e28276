"""CI load smoke: Locust runs examples/locustfile.py headless against the in-process server on
loopback for a bounded time (well under a minute) and no request may fail."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LOCUSTFILE = Path(__file__).resolve().parents[2] / "examples" / "locustfile.py"


# Locust monkey-patches the process with gevent when imported: only ever run it as a subprocess.
@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="needs locust (the bench extra)")
def test_locust_mixed_traffic_has_no_failures(live, tmp_path) -> None:
    stats_file = tmp_path / "stats.json"  # locust appends ".json" to the prefix it is given
    env = {**os.environ, "LOAD_PRODUCTS": "40", "LOAD_MAX_TOKENS": "8", "LOAD_COLLECTION": "locust-smoke"}
    env.pop("GPUPROMPT_API_KEY", None)
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", "8", "-r", "8", "-t", "15s",
        "--stop-timeout", "25", "--host", live.url, "--only-summary", "--json-file", str(tmp_path / "stats"),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    entries = json.loads(stats_file.read_text())
    requests = {entry["name"]: entry["num_requests"] for entry in entries}
    failures = {entry["name"]: entry["num_failures"] for entry in entries if entry["num_failures"]}
    assert failures == {}, done.stdout[-3000:]
    assert sum(requests.values()) > 0
    assert len(requests) >= 3, requests  # mixed traffic reached several endpoints
    assert "gpuprompt load summary" in done.stdout
    assert live.state.collections.get("locust-smoke").index.count == 40
