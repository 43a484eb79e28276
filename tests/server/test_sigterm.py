"""``serve()`` in a subprocess: SIGTERM lets an in-flight stream finish, refuses new connections,
then the process exits 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest
from server_helpers import wait_until

SERVE = (
    "import sys\n"
    "from gpuprompt.server import serve\n"
    "sys.exit(serve(host='127.0.0.1', port=int(sys.argv[1]), llm_backend='transformers', device='cpu',"
    " log_level='warning', graceful_timeout_s=600))\n"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=2.0)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_drains_the_stream_in_flight_then_exits_zero() -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(lambda: _healthy(url) or proc.poll() is not None, timeout=240, interval=0.5)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        body = {"messages": [{"role": "user", "content": "Tell me a long story about a tailor and a red dress."}],
                "max_tokens": 16, "temperature": 0, "stream": True}
        pieces_after_signal = 0
        events = []
        with httpx.Client(base_url=url, timeout=120.0) as client, \
                client.stream("POST", "/v1/chat/completions", json=body) as stream:
            lines = stream.iter_lines()
            for line in lines:
                if '"delta":{"content"' in line:
                    break
            proc.send_signal(signal.SIGTERM)
            # The listener closes at once: new connections are refused while the stream drains.
            assert wait_until(lambda: _refused(url), timeout=20, interval=0.1)
            for line in lines:
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if '"delta":{"content"' in line:
                    pieces_after_signal += 1
        assert events[-1] == "[DONE]"
        final = json.loads(events[-2])
        assert final["choices"][0]["finish_reason"] in ("length", "stop")
        assert pieces_after_signal > 0  # the generation was still running when SIGTERM came
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if proc.stdout:
            proc.stdout.close()
