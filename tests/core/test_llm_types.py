"""LLM request validation, config, package surface and prompt fitting (tokenizer only, no engine)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gpuprompt.llm
from gpuprompt import get_runtime
from gpuprompt.errors import ConfigurationError, ContextLengthError, InputTypeError, InvalidInputError
from gpuprompt.llm import GenerationRequest, LLMConfig, LLMEngine

USER = [{"role": "user", "content": "Hi!"}]


def test_llm_package_all_is_pinned() -> None:
    assert sorted(gpuprompt.llm.__all__) == [
        "CallPolicy",
        "EngineStats",
        "GenerationRequest",
        "GenerationResult",
        "LLMConfig",
        "LLMEngine",
        "StreamDelta",
        "Timings",
        "ToolCall",
        "ToolCallDelta",
        "ToolChoice",
        "ToolSpec",
        "Usage",
        "check_call_policy",
        "check_tool_choice",
    ]


def test_construction_and_runtime_lookup_load_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from gpuprompt import LLMEngine, GenerationRequest, get_runtime\n"
        "e = LLMEngine(backend='vllm'); r = get_runtime().llm(backend='transformers', max_num_seqs=2)\n"
        "assert r is get_runtime().llm(backend='transformers', max_num_seqs=2)\n"
        "GenerationRequest(messages=[{'role': 'user', 'content': 'x'}], stop='.')\n"
        "print(','.join(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_runtime_shares_one_engine_per_config() -> None:
    runtime = get_runtime()
    a = runtime.llm(backend="transformers", max_num_seqs=3)
    assert a is runtime.llm(None, backend="transformers", max_num_seqs=3)
    assert a is not runtime.llm(backend="transformers", max_num_seqs=5)
    with pytest.raises(ConfigurationError, match="unknown LLM option"):
        runtime.llm(backend="transformers", batch_sise=3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, InvalidInputError, "exactly one of 'messages' or 'prompt'"),
        ({"messages": USER, "prompt": "x"}, InvalidInputError, "got both"),
        ({"prompt": 3}, InputTypeError, "'prompt' must be a str"),
        ({"messages": "hello"}, InputTypeError, "'messages' must be a list"),
        ({"messages": []}, InvalidInputError, "at least one message"),
        ({"messages": [{"role": "robot", "content": "x"}]}, InvalidInputError, r"messages\[0\]\.role"),
        ({"messages": [{"role": "user", "content": None}]}, InputTypeError, r"messages\[0\]\.content"),
        ({"messages": ["hi"]}, InputTypeError, r"messages\[0\]"),
        ({"prompt": "x", "max_tokens": 0}, InvalidInputError, "'max_tokens' must be an int >= 1"),
        ({"prompt": "x", "max_tokens": True}, InvalidInputError, "'max_tokens'"),
        ({"prompt": "x", "temperature": -1}, InvalidInputError, "'temperature'"),
        ({"prompt": "x", "temperature": float("nan")}, InvalidInputError, "'temperature' must be a finite"),
        ({"prompt": "x", "top_p": 0}, InvalidInputError, "'top_p'"),
        ({"prompt": "x", "seed": 1.5}, InvalidInputError, "'seed'"),
        ({"prompt": "x", "stop": [""]}, InvalidInputError, r"'stop\[0\]' must be a non-empty str"),
        ({"prompt": "x", "stop": 5}, InputTypeError, "'stop' must be a list of str"),
        ({"prompt": "x", "priority": "high"}, InvalidInputError, "'priority' must be an int"),
        ({"prompt": "x", "truncate": "right"}, InvalidInputError, "'truncate' must be 'error' or 'left'"),
        ({"prompt": "x", "request_id": ""}, InvalidInputError, "'request_id'"),
        ({"prompt": "x", "response_format": "json"}, InputTypeError, "'response_format'"),
        ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {}}}, InvalidInputError, "OpenAI"),
    ],
)
def test_bad_requests_name_the_field(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        GenerationRequest(**kwargs)


def test_request_normalisation() -> None:
    request = GenerationRequest(messages=USER, stop="\n", temperature=1, response_format={"type": "object"})
    assert request.stop == ("\n",) and isinstance(request.temperature, float)
    assert request.messages == ({"role": "user", "content": "Hi!"},)
    assert request.guided == {"json": {"type": "object"}}
    wrapped = GenerationRequest(
        prompt="x", response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}
    )
    assert wrapped.guided == {"json": {"type": "object"}}
    assert GenerationRequest(prompt="x", response_format={"type": "json_object"}).guided == {"json_object": True}
    assert GenerationRequest(prompt="x").guided is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backend": "onnx"}, "'backend' must be one of"),
        ({"max_model_len": 0}, "'max_model_len' must be an int >= 16"),
        ({"dtype": "int8"}, "'dtype'"),
        ({"max_num_seqs": 0}, "'max_num_seqs'"),
        ({"gpu_memory_utilization": 1.5}, "'gpu_memory_utilization'"),
        ({"tensor_parallel_size": 0}, "'tensor_parallel_size'"),
        ({"enforce_eager": "yes"}, "'enforce_eager'"),
        ({"max_wait_ms": -1}, "'max_wait_ms'"),
    ],
)
def test_bad_config_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        LLMEngine(**kwargs)


def test_unknown_engine_option_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigurationError, match="valid options: .*max_num_seqs"):
        LLMEngine(max_batch=4)
    with pytest.raises(ConfigurationError, match="not both"):
        LLMEngine(config=LLMConfig(), backend="vllm")


def test_config_key_tells_configs_apart() -> None:
    assert LLMConfig().key() == LLMConfig().key()
    assert LLMConfig().key() != LLMConfig(max_num_seqs=8).key()
    assert LLMConfig().replace(backend="vllm").backend == "vllm"


# ---------------------------------------------------------------------- prompt fitting (tokenizer only)
@pytest.fixture(scope="module")
def formatter():
    from transformers import AutoTokenizer

    from gpuprompt.llm._chat import ChatFormatter
    from gpuprompt.models import resolve_chat_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_chat_model(None))
    return ChatFormatter(tokenizer, 256, "SmolLM2")


def _chat(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are the shop's assistant. Be brief."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: " + "tell me about the red dress " * 3})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "it is linen and washable " * 3})
    messages.append({"role": "user", "content": "And does it come in blue?"})
    return messages


def test_prompt_tokens_match_the_chat_template(formatter) -> None:
    messages = _chat(1)
    text = formatter.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = len(formatter.tokenizer(text, add_special_tokens=False)["input_ids"])
    prepared = formatter.prepare(GenerationRequest(messages=messages, max_tokens=8))
    assert prepared.prompt_tokens == expected == formatter.count(messages)
    assert formatter.count("hello there") == len(formatter.tokenizer("hello there")["input_ids"])


def test_too_long_prompt_raises_with_both_lengths(formatter) -> None:
    request = GenerationRequest(messages=_chat(20), max_tokens=8)
    with pytest.raises(ContextLengthError) as info:
        formatter.prepare(request)
    assert info.value.max_context == 256 and info.value.prompt_tokens > 256
    assert str(info.value.prompt_tokens) in str(info.value) and "truncate='left'" in str(info.value)


def test_truncate_left_keeps_system_and_last_turn(formatter) -> None:
    messages = _chat(20)
    prepared = formatter.prepare(GenerationRequest(messages=messages, max_tokens=32, truncate="left"))
    assert prepared.prompt_tokens <= 256 - 32 and prepared.dropped_messages > 0
    text = formatter.tokenizer.decode(prepared.token_ids)
    assert messages[0]["content"] in text and messages[-1]["content"] in text
    assert "Question 0:" not in text and "Question 19:" in text
    assert prepared.max_tokens == 32
    # History restarts on a user turn, right after the system message.
    assert text.index("Question") < text.index("Answer")
    # The fewest turns were dropped: one more old turn would not have fitted.
    kept = len(messages) - prepared.dropped_messages
    one_more = [messages[0], *messages[len(messages) - kept - 1 :]]
    assert formatter.count(one_more) > 256 - 32


def test_truncate_left_fails_when_system_and_last_turn_alone_do_not_fit(formatter) -> None:
    messages = [{"role": "system", "content": "rule " * 400}, {"role": "user", "content": "hi"}]
    with pytest.raises(ContextLengthError, match="even the system message"):
        formatter.prepare(GenerationRequest(messages=messages, max_tokens=8, truncate="left"))


def test_raw_prompt_truncate_left_keeps_the_newest_tokens(formatter) -> None:
    prompt = " ".join(f"w{i}" for i in range(400)) + " END"
    prepared = formatter.prepare(GenerationRequest(prompt=prompt, max_tokens=16, truncate="left"))
    assert prepared.prompt_tokens == 256 - 16
    assert formatter.tokenizer.decode(prepared.token_ids).endswith(" END")


def test_max_tokens_is_capped_by_the_room_left(formatter) -> None:
    prepared = formatter.prepare(GenerationRequest(messages=_chat(3), max_tokens=10_000))
    assert prepared.max_tokens == 256 - prepared.prompt_tokens


def test_empty_prompt_is_refused(formatter) -> None:
    with pytest.raises(InvalidInputError, match="must not be empty"):
        formatter.prepare(GenerationRequest(prompt=""))


@pytest.mark.parametrize(
    ("stops", "pieces", "expected"),
    [
        # the stop string that ends first wins, whatever starts first or comes first in the list
        (("Yes", "e"), ["Yes"], (1, "e")),
        (("abcd", "bc"), ["xabcd"], (2, "bc")),
        (("abc", "bc", "c"), ["xabcd"], (1, "abc")),  # all three end together
        # a tie in where they end goes to the earlier in the list
        (("bc", "abc"), ["xabc"], (2, "bc")),
        (("abc", "bc"), ["xabc"], (1, "abc")),
        # found across pieces, and only where it ends in the new part
        (("ab",), ["xa", "by"], (1, "ab")),
        (("a",), ["xa", "by"], (1, "a")),
    ],
)
def test_stop_scanner_matches_the_stop_that_ends_first(stops, pieces, expected) -> None:
    from gpuprompt.llm._job import StopScanner

    scanner, text, found = StopScanner(stops), "", None
    for piece in pieces:
        text += piece
        found = found or scanner.match(text)
    assert found == expected


def test_stop_scanner_skips_what_min_tokens_held_back() -> None:
    from gpuprompt.llm._job import StopScanner

    scanner = StopScanner(("a", "abc"))
    scanner.skip("xxa")  # a stop string inside the skipped text is never matched
    assert scanner.match("xxab") is None
    assert scanner.match("xxabc") == (2, "abc")  # one that ends after it still is
