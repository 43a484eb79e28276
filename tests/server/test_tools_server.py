"""Tool calling, JSON output and sampling fields over ``/v1/chat/completions`` with the official
``openai`` client: reply and stream-chunk shapes (the SDK's own stream and parse helpers consume
them), tool-result turns, usage details, and the fields refused with a 400 naming them.

The bundled SmolLM2-135M picks tools poorly, so calls are forced (``required`` or a named tool):
the output is then constrained, and the protocol's shape is guaranteed whatever the model thinks.
Free-text arguments are enums where the model would otherwise ramble, and most forced calls set
``parallel_tool_calls=False`` (one call), which keeps these constrained generations short on CPU.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel
from support.tool_cases import FREE_PRICE, FREE_STOCK, LONG_ASK  # the cut-call case

CHAT = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
PRICE = {
    "type": "function",
    "function": {
        "name": "get_price",
        "description": "Price of a product in EUR.",
        "parameters": {
            "type": "object",
            "properties": {"product": {"type": "string", "enum": ["red dress", "blue jeans", "linen shirt"]}},
            "required": ["product"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what does the red dress cost?"}]


class Weather(BaseModel):
    """Current weather of a city."""

    city: str
    unit: Literal["C", "F"]


class Answer(BaseModel):
    colour: Literal["red", "blue", "green"]
    price: int


def _call(openai_client, **options: Any):
    options = {"model": CHAT, "messages": ASK, "max_tokens": 48, "temperature": 0, **options}
    return openai_client.chat.completions.create(**options)


def _check_args(name: str, arguments: str) -> dict[str, Any]:
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("C", "F")
    else:
        assert set(args) == {"product"} and args["product"] in ("red dress", "blue jeans", "linen shirt")
    return args


def test_a_named_tool_choice_gets_a_well_formed_call(openai_client) -> None:
    response = _call(openai_client, tools=[WEATHER, PRICE], parallel_tool_calls=False,
                     tool_choice={"type": "function", "function": {"name": "get_price"}})
    [choice] = response.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.role == "assistant"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_price"
    _check_args("get_price", call.function.arguments)


def test_required_calls_one_of_the_tools_and_parallel_false_calls_once(openai_client) -> None:
    response = _call(openai_client, tools=[WEATHER, PRICE], tool_choice="required", parallel_tool_calls=False)
    [choice] = response.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name in ("get_weather", "get_price")
    _check_args(call.function.name, call.function.arguments)
    response = _call(openai_client, tools=[WEATHER, PRICE], tool_choice="required")
    calls = response.choices[0].message.tool_calls
    assert calls and len({c.id for c in calls}) == len(calls)
    for call in calls:
        _check_args(call.function.name, call.function.arguments)


def test_tool_choice_none_answers_in_prose(openai_client) -> None:
    response = _call(openai_client, tools=[WEATHER], tool_choice="none", max_tokens=12)
    [choice] = response.choices
    assert choice.message.tool_calls is None
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")


def test_auto_with_tools_is_served(openai_client) -> None:
    # Dify sends tool_choice "auto" with every tool app: whatever the model does, the shape is valid.
    response = _call(openai_client, tools=[WEATHER, PRICE], tool_choice="auto", max_tokens=48)
    [choice] = response.choices
    if choice.finish_reason == "tool_calls":
        for call in choice.message.tool_calls:
            _check_args(call.function.name, call.function.arguments)
    else:
        assert choice.message.tool_calls is None and isinstance(choice.message.content, str)


def test_tool_results_continue_the_conversation(openai_client) -> None:
    first = _call(openai_client, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    [call] = first.choices[0].message.tool_calls
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21, "sky": "sunny"})},
    ]
    response = _call(openai_client, messages=messages, tools=[WEATHER], max_tokens=16, tool_choice="none")
    assert isinstance(response.choices[0].message.content, str)
    assert response.usage.prompt_tokens > first.usage.prompt_tokens


def test_streamed_tool_calls_have_the_chunk_shapes_of_openai(openai_client) -> None:
    options = {"tools": [WEATHER, PRICE], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
               "parallel_tool_calls": False}
    whole = _call(openai_client, **options).choices[0].message.tool_calls
    chunks = list(_call(openai_client, stream=True, stream_options={"include_usage": True}, **options))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert pieces
    by_index: dict[int, list] = {}
    for piece in pieces:
        by_index.setdefault(piece.index, []).append(piece)
    assert len(by_index) == len(whole)
    for index, parts in by_index.items():
        head, rest = parts[0], parts[1:]
        assert head.id.startswith("call_") and head.type == "function"  # ids are new per request
        assert head.function.name == whole[index].function.name
        assert all(p.id is None and p.function.name is None for p in rest)  # the SDK concatenates strings
        assert "".join(p.function.arguments or "" for p in parts) == whole[index].function.arguments
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_the_sdk_stream_helper_and_parse_read_tool_calls(openai_client) -> None:
    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    choice = {"type": "function", "function": {"name": "get_weather"}}
    done = []
    options = {"model": CHAT, "messages": ASK, "max_tokens": 48, "temperature": 0, "tools": [tool],
               "tool_choice": choice, "parallel_tool_calls": False}
    with openai_client.chat.completions.stream(**options) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done.append(event)
        final = stream.get_final_completion()
    [event] = done
    assert event.name == "get_weather"
    assert isinstance(event.parsed_arguments, Weather)
    [call] = final.choices[0].message.tool_calls
    assert call.function.arguments == event.arguments
    assert isinstance(call.function.parsed_arguments, Weather)
    parsed = openai_client.chat.completions.parse(**options)
    assert isinstance(parsed.choices[0].message.tool_calls[0].function.parsed_arguments, Weather)


def test_parse_with_a_response_format_returns_the_model(openai_client) -> None:
    messages = [{"role": "user", "content": "The red dress costs 49 EUR. Give its colour and price as JSON."}]
    parsed = openai_client.chat.completions.parse(
        model=CHAT, messages=messages, max_tokens=64, temperature=0, response_format=Answer
    )
    assert isinstance(parsed.choices[0].message.parsed, Answer)
    response = openai_client.chat.completions.create(
        model=CHAT, messages=messages, max_tokens=24, temperature=0, response_format={"type": "json_object"}
    )
    content = response.choices[0].message.content
    assert content.startswith("{")
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_usage_reports_cached_prompt_tokens(openai_client, server_llm) -> None:
    response = _call(openai_client, max_tokens=4)
    details = response.usage.prompt_tokens_details
    assert details is not None and isinstance(details.cached_tokens, int)
    if not server_llm.capabilities.get("prefix_cache"):
        assert details.cached_tokens == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_k", 5), ("min_p", 0.1), ("presence_penalty", 0.5), ("frequency_penalty", 0.5),
     ("repetition_penalty", 1.2), ("logit_bias", {"42": -100})],
)
def test_sampling_fields_are_honoured_or_refused_naming_the_field(openai_client, server_llm, field, value) -> None:
    supported = field in server_llm.capabilities["sampling"]
    options = {field: value} if field in ("top_k", "min_p", "repetition_penalty") else {}
    extra = {} if options else {field: value}
    if supported:
        response = _call(openai_client, max_tokens=4, temperature=0.8, seed=1, extra_body=options, **extra)
        assert response.choices[0].finish_reason in ("stop", "length")
    else:
        with pytest.raises(openai.BadRequestError) as info:
            _call(openai_client, max_tokens=4, temperature=0.8, extra_body=options, **extra)
        assert info.value.param == field
        assert info.value.code == "unsupported_parameter"
        assert f"'{field}'" in info.value.message


def test_default_sampling_values_are_always_accepted(openai_client) -> None:
    # What Dify sends with its sliders untouched, and vLLM's fields at the values that ask for nothing.
    response = _call(openai_client, max_tokens=2, presence_penalty=0, frequency_penalty=0,
                     extra_body={"top_k": 0, "min_p": 0, "repetition_penalty": 1, "ignore_eos": False,
                                 "min_tokens": 0, "skip_special_tokens": True, "stop_token_ids": [],
                                 "add_generation_prompt": True, "truncate_prompt_tokens": None})
    assert response.choices[0].finish_reason in ("stop", "length")


def test_vllm_end_of_reply_fields_run_as_in_process(openai_client, server_llm) -> None:
    """``ignore_eos`` (what ``vllm bench serve --ignore-eos`` sends), ``min_tokens``,
    ``stop_token_ids``, ``include_stop_str_in_output`` and ``skip_special_tokens`` reach the
    engine: the same replies as the in-process requests."""
    from gpuprompt.llm import GenerationRequest

    short = [{"role": "user", "content": "Say just the word yes."}]
    cases = [{"ignore_eos": True}, {"min_tokens": 12}, {"ignore_eos": True, "stop_token_ids": [198]},
             {"stop": ["."], "include_stop_str_in_output": True}, {"ignore_eos": True, "skip_special_tokens": False}]
    local = server_llm.generate([GenerationRequest(messages=short, max_tokens=20, **case) for case in cases])
    for case, expected in zip(cases, local):
        served = _call(openai_client, messages=short, max_tokens=20, extra_body=case).choices[0]
        assert served.message.content == expected.text and served.finish_reason == expected.finish_reason, case
        assert served.model_extra.get("stop_reason") == expected.stop_reason, case  # vLLM's field
    assert local[2].stop_reason == 198 and local[3].stop_reason == "."
    *_, last = _call(openai_client, messages=short, max_tokens=20, stream=True, extra_body=cases[2])
    assert last.choices[0].finish_reason == "stop" and last.choices[0].model_extra["stop_reason"] == 198
    assert local[0].finish_reason == "length" and local[0].usage.completion_tokens == 20
    assert local[1].usage.completion_tokens >= 12


def test_chat_template_kwargs_the_template_does_not_read_change_nothing(openai_client) -> None:
    """``{"enable_thinking": false}`` (what LiteLLM and Open WebUI send for Qwen3) is a no-op for a
    template without that switch, as in vLLM: accepted, same output (a key it reads is refused)."""
    plain = _call(openai_client, max_tokens=8).choices[0].message.content
    switched = _call(openai_client, max_tokens=8, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert switched.choices[0].message.content == plain


def test_vllm_structured_outputs_constrain_as_the_guided_fields(openai_client) -> None:
    """vLLM 0.10+ spells guided decoding ``structured_outputs``: the same constraint as ``guided_*``,
    and both spellings of one constraint together (what gpuprompt's own remote backend sends, for
    either kind of server) are one constraint."""
    for new, old in (({"choice": ["red", "blue"]}, {"guided_choice": ["red", "blue"]}),
                     ({"regex": "[0-9]{3}"}, {"guided_regex": "[0-9]{3}"}),
                     ({"json": json.dumps(WEATHER["function"]["parameters"])},
                      {"guided_json": WEATHER["function"]["parameters"]})):
        spelled = _call(openai_client, extra_body={"structured_outputs": new})
        guided = _call(openai_client, extra_body=old)
        both = _call(openai_client, extra_body={"structured_outputs": {**new, "disable_any_whitespace": True}, **old})
        assert spelled.choices[0].message.content == guided.choices[0].message.content == both.choices[0].message.content
    assert spelled.choices[0].message.content and json.loads(spelled.choices[0].message.content) is not None


@pytest.mark.parametrize(
    ("payload", "param", "fragment"),
    [
        ({"tool_choice": "required"}, "tool_choice", "'tools' is empty"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "bad name!"),
        ({"functions": [{"name": "f"}]}, "functions", "'tools'"),
        ({"function_call": "auto"}, "function_call", "'tool_choice'"),
        ({"messages": [{"role": "tool", "content": "4"}]}, "messages[0]", "tool_call_id"),
        ({"messages": [{"role": "user", "content": "hi", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages[0]", "assistant"),
        ({"logprobs": True}, "logprobs", "'logprobs'"),
        ({"top_logprobs": 2}, "top_logprobs", "'top_logprobs'"),
        ({"modalities": ["text", "audio"]}, "modalities", "text only"),
        ({"top_k": -2}, "top_k", "'top_k'"),
        ({"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty"),
        ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice", "at most one"),
        # vLLM's own fields that change the output: run, or refused, never ignored
        ({"min_tokens": 8}, "min_tokens", "at most 'max_tokens' (2)"),
        ({"min_tokens": -1}, "min_tokens", "'min_tokens'"),
        ({"ignore_eos": "yes"}, "ignore_eos", "bool"),
        ({"ignore_eos": True, "guided_choice": ["a"]}, "ignore_eos", "cannot be combined"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "stop_token_ids"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids", "vocabulary"),
        ({"skip_special_tokens": False, "tools": [WEATHER]}, "skip_special_tokens", "cannot be combined with tools"),
        ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens", "vLLM sampling field"),
        ({"continue_final_message": True}, "continue_final_message", "vLLM sampling field"),
        ({"bad_words": ["no"]}, "bad_words", "vLLM sampling field"),
        ({"structured_outputs": {"grammar": "root ::= 'a'"}}, "structured_outputs.grammar", "Extra inputs"),
        ({"structured_outputs": {"choice": ["a"], "regex": "b"}}, "structured_outputs", "exactly one"),
        ({"structured_outputs": {"json": "[1"}}, "structured_outputs.json", "JSON schema"),
        ({"structured_outputs": {"choice": ["a"]}, "guided_regex": "a"}, "structured_outputs", "'regex'"),
        ({"structured_outputs": {"json": "[" * 5000 + "]" * 5000}}, "structured_outputs.json", "JSON schema"),
        ({"structured_outputs": {"json": '{"type": "object", "x": NaN}'}}, "structured_outputs.json", "JSON schema"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs", "read by the served"),
        ({"echo": True}, "echo", "vLLM sampling field"),
    ],
)
def test_bad_tool_and_sampling_requests_are_400_naming_the_field(http, payload, param, fragment) -> None:
    body = {"messages": ASK, "max_tokens": 2, **payload}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"] or "").startswith(param), error
    assert fragment in error["message"], error


def test_the_stream_helper_gives_content_none_for_calls_and_text_for_prose(openai_client) -> None:
    options = {"model": CHAT, "messages": ASK, "max_tokens": 48, "temperature": 0, "tools": [WEATHER],
               "tool_choice": "required", "parallel_tool_calls": False}
    with openai_client.chat.completions.stream(**options) as stream:
        for _ in stream:
            pass
        calls = stream.get_final_completion().choices[0]
    assert calls.finish_reason == "tool_calls" and len(calls.message.tool_calls) == 1
    assert calls.message.content is None  # as non-streamed: a reply of calls only has no content
    assert _call(openai_client, **{k: v for k, v in options.items() if k != "model"}).choices[0].message.content is None
    # A text reply (tools bound, "none"), ended by a stop string: the helper refuses a reply cut by max_tokens.
    prose = {**options, "tool_choice": "none", "max_tokens": 32, "stop": [" "]}
    with openai_client.chat.completions.stream(**prose) as stream:
        for _ in stream:
            pass
        text = stream.get_final_completion().choices[0]
    assert text.finish_reason == "stop" and isinstance(text.message.content, str) and text.message.tool_calls is None
    raw = list(_call(openai_client, stream=True, **{k: v for k, v in prose.items() if k != "model"}))
    assert raw[0].choices[0].delta.content == ""  # OpenAI's opening chunk of a text reply


class Address(BaseModel):
    city: str
    country: Literal["France", "Italy"]


class Customer(BaseModel):
    name: str
    address: Address


class Lookup(BaseModel):
    """Look up a customer."""

    customer: Customer


def test_nested_pydantic_tools_and_response_formats_are_served(openai_client) -> None:
    # openai.pydantic_function_tool sends "$defs" with "#/$defs/..." references.
    tool = openai.pydantic_function_tool(Lookup)
    assert "$defs" in tool["function"]["parameters"]
    messages = [{"role": "user", "content": "Look up Bob from Paris, France."}]
    parsed = openai_client.chat.completions.parse(model=CHAT, messages=messages, tools=[tool], tool_choice="required",
                                                  parallel_tool_calls=False, max_tokens=80, temperature=0)
    [choice] = parsed.choices
    assert choice.finish_reason == "tool_calls"
    assert isinstance(choice.message.tool_calls[0].function.parsed_arguments, Lookup)
    # A nested response format beside tools (auto): an answer follows the format, or a call the tool.
    both = openai_client.chat.completions.parse(model=CHAT, messages=messages, response_format=Customer,
                                                tools=[openai.pydantic_function_tool(Address)], max_tokens=80,
                                                temperature=0)
    message = both.choices[0].message
    if message.tool_calls:
        assert all(isinstance(c.function.parsed_arguments, Address) for c in message.tool_calls)
    elif both.choices[0].finish_reason == "stop":
        assert isinstance(message.parsed, Customer)


def test_a_tool_schema_that_cannot_compile_is_a_400_naming_tools(http) -> None:
    broken = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/Missing"}}, "required": ["p"]}}}
    response = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, "tools": [broken],
                                                       "tool_choice": "required"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tools"


def _folded(openai_client, stream: bool, **options: Any) -> tuple[str, list[tuple[str, str, str]], list[str]]:
    """(content, [(id, name, arguments)], finish reasons) of a reply, streamed or not."""
    if not stream:
        [choice] = _call(openai_client, **options).choices
        calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return choice.message.content or "", calls, [choice.finish_reason]
    chunks = [c for c in _call(openai_client, stream=True, **options) if c.choices]
    folded: dict[int, list[str]] = {}
    for piece in (tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])):
        slot = folded.setdefault(piece.index, ["", "", ""])
        slot[0] += piece.id or ""
        slot[1] += (piece.function.name or "") if piece.function else ""
        slot[2] += (piece.function.arguments or "") if piece.function else ""
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    return content, [tuple(folded[i]) for i in sorted(folded)], finish  # type: ignore[misc]


def test_a_reply_cut_short_or_stopped_holds_no_wrapper_json(openai_client) -> None:
    for stream in (False, True):
        options = {"tools": [WEATHER, PRICE], "tool_choice": "required", "max_tokens": 10}
        content, calls, finish = _folded(openai_client, stream, **options)
        assert (content, finish) == ("", ["length"])
        # At most the call the limit cut, with the arguments written so far (never JSON of a whole call).
        assert len(calls) <= 1 and all(name in ("get_weather", "get_price") for _, name, _ in calls)
    # With "auto", a stop string applies to the answer: the wrapper's '"name"' does not stop it.
    [choice] = _call(openai_client, tools=[WEATHER], tool_choice="auto", max_tokens=14, stop=['"name"', "{"]).choices
    assert "{" not in (choice.message.content or "") and "__answer__" not in (choice.message.content or "")


def test_a_forced_call_cut_by_max_tokens_comes_back_with_partial_arguments(openai_client) -> None:
    """It used to come back as finish_reason "length", content "", tool_calls None; vLLM's server and
    OpenAI return the call with the arguments generated so far."""
    options = {"messages": LONG_ASK, "tools": [FREE_PRICE, FREE_STOCK], "max_tokens": 24,
               "tool_choice": {"type": "function", "function": {"name": "get_price"}}}
    response = _call(openai_client, **options)
    [choice] = response.choices
    assert choice.finish_reason == "length" and not choice.message.content
    assert response.usage.completion_tokens == 24
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_price"
    assert re.match(r'\{\s*"product"\s*:\s*"[^"]+$', call.function.arguments), call.function.arguments
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)
    content, calls, finish = _folded(openai_client, True, **options)
    assert (content, finish) == ("", ["length"])
    assert [(name, arguments) for _, name, arguments in calls] == [("get_price", call.function.arguments)]


def test_an_empty_tool_reply_is_logged_with_the_raw_text(openai_client, caplog: pytest.LogCaptureFixture) -> None:
    """A reply with tools that holds neither prose nor a call (here: cut inside the answer's wrapper)
    is logged at debug level with what the model wrote."""
    with caplog.at_level(logging.DEBUG, logger="gpuprompt"):
        [choice] = _call(openai_client, tools=[FREE_PRICE], tool_choice="auto", max_tokens=3).choices
    assert choice.finish_reason == "length" and not choice.message.content and not choice.message.tool_calls
    [record] = [r for r in caplog.records if "neither prose nor a tool call" in r.getMessage()]
    assert record.levelno == logging.DEBUG and "'{" in record.getMessage()


def test_a_stream_whose_first_delta_is_slow_sends_its_headers_first(openai_client, http, monkeypatch) -> None:
    """A tool call is handed out whole, so its first delta comes when the call is written: the stream
    answers 200 and the opening chunk after at most _HEADERS_AFTER_S rather than holding the headers
    (a proxy's read timeout) for the whole generation. At 0 s every stream takes that path; the
    chunks are then the same as when the first delta came first."""
    from gpuprompt.server.routes import generation

    forced = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    whole = _call(openai_client, **forced).choices[0].message
    prose = _call(openai_client, max_tokens=8).choices[0].message.content
    monkeypatch.setattr(generation, "_HEADERS_AFTER_S", 0.0)
    with openai_client.chat.completions.stream(model=CHAT, messages=ASK, max_tokens=48, temperature=0,
                                                **forced) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0].message
    assert streamed.content is None  # a forced call opens with content null, as after seeing the call
    assert [(c.function.name, c.function.arguments) for c in streamed.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls]
    chunks = list(_call(openai_client, max_tokens=8, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == prose
    # A refusal after the headers went is reported in the stream, in OpenAI's error shape.
    reply = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "word " * 5000}],
                                                     "max_tokens": 2, "stream": True})
    assert reply.status_code == 200
    events = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
    error = json.loads(events[-1])["error"]
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
