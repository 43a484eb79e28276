"""LangChain.js, the client Flowise and most JavaScript apps call OpenAI-compatible servers with,
against the live server: ``@langchain/openai`` (the versions Flowise 3.1.4 ships, pinned by
tests/server/js/package-lock.json and installed by scripts/bootstrap.sh) driven by node through
tests/server/js/client.mjs. ``ChatOpenAI`` invoke and stream, ``bindTools`` with a forced call and
the tool's result sent back, ``OpenAIEmbeddings`` with its default (base64) and with float vectors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gpuprompt import GenerationRequest

JS = Path(__file__).parent / "js"
CHAT = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBED = "sentence-transformers/all-MiniLM-L6-v2"
QUESTION = "What does the red dress cost?"  # the same strings as client.mjs
TEXTS = ["a red cotton dress", "blue denim jeans, slim fit", "Will it shrink after washing? 🧺"]
GET_PRICE = {"type": "function", "function": {  # the tool client.mjs binds
    "name": "get_price", "description": "Price of a product in EUR.",
    "parameters": {"type": "object", "properties": {"product": {"type": "string", "enum": ["red dress", "blue jeans"]}},
                   "required": ["product"]}}}
MIN_NODE = 20  # @langchain/core 1.1 and openai 6 need node >= 20


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the LangChain.js client test needs node >= 20 and npm "
                    "(then scripts/bootstrap.sh installs its packages)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    major = int(re.match(r"v(\d+)", version).group(1))
    if major < MIN_NODE:
        pytest.skip(f"node {version} is older than the {MIN_NODE} that @langchain/openai needs")
    return node


@pytest.fixture(scope="module")
def js_out(request: pytest.FixtureRequest) -> dict:
    """What client.mjs printed after running every call against the live server."""
    node = _node()  # skips before the server starts when there is no node
    if not (JS / "node_modules" / "@langchain" / "openai").is_dir():
        pytest.fail(f"{JS}/node_modules has no @langchain/openai: run scripts/bootstrap.sh (it runs `npm ci` "
                    "there from the committed package-lock.json)")
    live = request.getfixturevalue("live")
    done = subprocess.run([node, "client.mjs", live.url, CHAT, EMBED], cwd=JS, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, f"client.mjs failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


def _direct(server_llm, messages: list[dict], max_tokens: int, **options):
    [result] = server_llm.generate(
        [GenerationRequest(messages=messages, max_tokens=max_tokens, temperature=0.0, **options)]
    )
    return result


def test_invoke_and_stream_equal_the_engine(js_out, server_llm) -> None:
    direct = _direct(server_llm, [{"role": "user", "content": QUESTION}], 24)
    assert js_out["invoke"]["content"] == direct.text and direct.text
    assert js_out["invoke"]["finish_reason"] == direct.finish_reason
    usage = js_out["invoke"]["usage"]
    assert usage["input_tokens"] == direct.usage.prompt_tokens
    assert usage["output_tokens"] == direct.usage.completion_tokens
    assert js_out["stream"]["content"] == direct.text
    assert js_out["stream"]["chunks"] > 2  # streamed piece by piece, not one block


def test_bind_tools_forced_call_invoke_and_stream(js_out) -> None:
    made = js_out["tool_call"]
    [call] = made["tool_calls"]
    assert call["name"] == "get_price"
    assert call["args"] == {"product": call["args"]["product"]}
    assert call["args"]["product"] in ("red dress", "blue jeans")
    assert call["id"].startswith("call_")
    assert made["finish_reason"] == "tool_calls" and made["invalid_tool_calls"] == []
    [streamed] = js_out["tool_call_stream"]["tool_calls"]
    assert (streamed["name"], streamed["args"]) == (call["name"], call["args"])


def test_the_tool_result_turn_gets_a_prose_answer(js_out, server_llm) -> None:
    call = js_out["tool_call"]["tool_calls"][0]
    answer = js_out["tool_result_turn"]
    assert answer["tool_calls"] == []
    assert isinstance(answer["content"], str) and answer["content"].strip()
    # The same conversation straight into the engine: the tool turn reached the model as a tool turn.
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function",
             "function": {"name": call["name"], "arguments": json.dumps(call["args"])}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "49 EUR"},
    ]
    direct = _direct(server_llm, messages, 24, tools=[GET_PRICE], tool_choice="none")
    assert answer["content"] == direct.text
    assert answer["finish_reason"] == direct.finish_reason


@pytest.mark.parametrize("encoding_format", ["base64", "float"])
def test_openai_embeddings_equal_the_embedder(js_out, embedder, encoding_format) -> None:
    got = js_out["embeddings"][encoding_format]
    expected = embedder.embed(TEXTS)
    np.testing.assert_allclose(np.array(got["documents"], dtype=np.float32), expected, atol=1e-5)
    np.testing.assert_allclose(np.array(got["query"], dtype=np.float32), expected[0], atol=1e-5)
