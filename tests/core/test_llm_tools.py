"""Tool calling in the core: types, the prompt format, the parser, and the engine on both backends.

The bundled SmolLM2-135M calls tools poorly, so the protocol is tested where guided decoding makes
the shape certain ("required", a named tool, "auto" with its prose pseudo-tool); what the model
chooses inside that shape is not asserted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import pytest
from gpuprompt.errors import InputTypeError, InvalidInputError, UnsupportedFeatureError
from gpuprompt.llm import GenerationRequest, LLMEngine, StreamDelta, ToolCall, ToolCallDelta, ToolSpec
from gpuprompt.llm._tool_format import ToolOutputParser, ToolPlan, instruction, plan_tools
from support.tool_cases import FREE_PRICE, FREE_STOCK, LONG_ASK  # the cut-call case

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {
    "name": "get_time",
    "description": "Current time in a timezone.",
    "parameters": {
        "type": "object",
        "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["tz"],
    },
}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")


def ask(**kwargs) -> GenerationRequest:
    kwargs.setdefault("max_tokens", 48)
    return GenerationRequest(messages=ASK, tools=TOOLS, **kwargs)


def check_call(call: ToolCall, names=("get_weather", "get_time")) -> None:
    assert CALL_ID.match(call.id)
    assert call.name in names
    args = call.args
    if call.name == "get_weather":
        assert set(args) == {"city"} and isinstance(args["city"], str)
    else:
        assert args in ({"tz": "UTC"}, {"tz": "CET"})


# ---------------------------------------------------------------------- types
def test_tool_spec_forms_and_round_trip() -> None:
    spec = ToolSpec.from_openai(WEATHER)
    assert spec.name == "get_weather" and spec.parameters["required"] == ["city"] and not spec.strict
    assert ToolSpec.from_openai(spec.to_openai()) == spec
    assert ToolSpec.from_openai(CLOCK).to_openai()["function"]["name"] == "get_time"
    bare = ToolSpec("ping")
    assert bare.parameters == {"type": "object", "properties": {}}
    assert ToolSpec.from_openai({"name": "x", "parameters": None, "strict": True}).to_openai()["function"]["strict"]


@pytest.mark.parametrize(
    ("tool", "error", "match"),
    [
        ({"name": "has space"}, InvalidInputError, r"'tools\[0\]\.name' must be 1-64 characters"),
        ({"name": "x" * 65}, InvalidInputError, "1-64 characters"),
        ({"name": ""}, InvalidInputError, "1-64"),
        ({"name": 7}, InputTypeError, r"'tools\[0\]\.name' must be a str"),
        ({"description": "no name"}, InvalidInputError, "needs a name"),
        ({"name": "x", "parameters": [1]}, InputTypeError, "must be a JSON schema dict"),
        ({"name": "x", "parameters": {"type": "array"}}, InvalidInputError, "must be 'object'"),
        ({"name": "x", "parameters": {"type": "object", "d": float("nan")}}, InvalidInputError, "finite"),
        ({"name": "x", "strict": "yes"}, InputTypeError, "strict' must be a bool"),
        ({"name": "x", "extra": 1}, InvalidInputError, "unknown key"),
        ({"type": "retrieval", "function": {"name": "x"}}, InvalidInputError, "'function'"),
        ("get_weather", InputTypeError, "OpenAI tool dict"),
        ({"name": "__answer__"}, InvalidInputError, "reserved"),
    ],
)
def test_bad_tools_are_refused_naming_the_field(tool, error, match) -> None:
    with pytest.raises(error, match=match):
        GenerationRequest(messages=ASK, tools=[tool])


def test_hostile_tool_values_are_refused() -> None:
    cyclic: dict = {"type": "object"}
    cyclic["properties"] = cyclic
    with pytest.raises(InvalidInputError, match="must not contain itself"):
        ToolSpec("x", parameters=cyclic)
    deep: dict = {"type": "object"}
    node = deep
    for _ in range(100):
        node["p"] = {}
        node = node["p"]
    with pytest.raises(InvalidInputError, match="nested at most"):
        ToolSpec("x", parameters=deep)
    with pytest.raises(InvalidInputError, match="lone surrogate"):
        ToolSpec("x", description="\ud800")
    with pytest.raises(InputTypeError, match="Wrap a single tool in a list"):
        GenerationRequest(messages=ASK, tools=WEATHER)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="used by two tools"):
        GenerationRequest(messages=ASK, tools=[WEATHER, WEATHER])
    # an error names the tool by its place in the request, as the server's error.param does
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
    with pytest.raises(InvalidInputError, match=r"'tools\[1\]\.function\.parameters\.type'"):
        GenerationRequest(messages=ASK, tools=[WEATHER, bad])
    twice = {"type": "function", "function": {"name": "g"}}
    with pytest.raises(InvalidInputError, match=r"'tools\[1\]\.function\.name' 'g' is used by two tools"):
        GenerationRequest(messages=ASK, tools=[twice, twice])
    with pytest.raises(InvalidInputError, match="at most 128"):
        GenerationRequest(messages=ASK, tools=[{"name": f"t{i}"} for i in range(129)])


def test_tool_choice_is_normalised_and_checked() -> None:
    assert ask().tool_choice == "auto"
    assert ask(tool_choice={"type": "function", "function": {"name": "get_time"}}).tool_choice == "get_time"
    assert GenerationRequest(messages=ASK).tool_choice == "auto"  # auto without tools: plain generation
    assert not GenerationRequest(messages=ASK).uses_tools
    with pytest.raises(InvalidInputError, match=r"one of the tools \['get_weather', 'get_time'\]"):
        ask(tool_choice="get_stock")
    with pytest.raises(InvalidInputError, match="'tools' is empty"):
        GenerationRequest(messages=ASK, tool_choice="required")
    with pytest.raises(InputTypeError, match="'tool_choice' must be"):
        ask(tool_choice=True)
    with pytest.raises(InvalidInputError, match="'tool_choice' must be"):
        ask(tool_choice={"type": "function", "function": {}})
    with pytest.raises(InputTypeError, match="'parallel_tool_calls' must be a bool"):
        ask(parallel_tool_calls=1)
    with pytest.raises(InvalidInputError, match="need chat 'messages'"):
        GenerationRequest(prompt="hi", tools=TOOLS)
    with pytest.raises(InvalidInputError, match="forces a tool call"):
        ask(tool_choice="required", response_format={"type": "json_object"})


def test_tool_call_type() -> None:
    call = ToolCall.from_openai({"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}})
    assert call.args == {"a": 1}
    assert call.to_openai() == {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    generated = ToolCall.from_openai({"name": "f", "arguments": {"a": [1, 2]}})
    assert CALL_ID.match(generated.id) and generated.args == {"a": [1, 2]}
    with pytest.raises(InvalidInputError, match="JSON text of an object"):
        ToolCall("c", "f", "[1]")
    with pytest.raises(InvalidInputError, match="JSON text of an object"):
        ToolCall("c", "f", "{not json")
    with pytest.raises(InvalidInputError, match="non-empty"):
        ToolCall("", "f", "{}")


def test_tool_messages_are_validated() -> None:
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ]},
        {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1", "name": "get_weather"},
    ]
    request = GenerationRequest(messages=history, tools=TOOLS)
    assistant, tool = request.messages[1], request.messages[2]
    assert assistant["content"] == "" and assistant["tool_calls"][0] == ToolCall("call_1", "get_weather",
                                                                                 '{"city": "Paris"}')
    assert tool == {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1", "name": "get_weather"}
    GenerationRequest(messages=[*ASK, {"role": "tool", "content": "result"}])  # tool_call_id is optional
    bad = [
        ({"role": "assistant", "content": None}, InputTypeError, r"messages\[1\]\.content"),
        ({"role": "assistant", "content": "", "tool_calls": {"id": "x"}}, InputTypeError, "tool_calls"),
        ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a b"}}]}, InvalidInputError,
         r"messages\[1\]\.tool_calls\[0\]\.name"),
        ({"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": "[]"}]},
         InvalidInputError, "JSON text of an object"),
        ({"role": "tool", "content": "r", "tool_call_id": ""}, InvalidInputError, "tool_call_id"),
        ({"role": "tool", "content": "r", "tool_call_id": 5}, InputTypeError, "tool_call_id"),
        ({"role": "tool", "content": None}, InputTypeError, "content"),
        ({"role": "function", "content": "r"}, InvalidInputError, "'tool'"),
    ]
    for message, error, match in bad:
        with pytest.raises(error, match=match):
            GenerationRequest(messages=[*ASK, message])


# ---------------------------------------------------------------------- parser
def plan(**kwargs) -> ToolPlan:
    native = kwargs.pop("native", False)
    result = plan_tools(ask(**kwargs), native)
    assert result is not None
    return result


def run(parser_plan: ToolPlan, pieces: list[str], *, cut: bool = False) -> tuple[str, list[ToolCallDelta],
                                                                                 list[ToolCall]]:
    parser = ToolOutputParser(parser_plan)
    text, deltas = "", []
    for piece in pieces:
        new, calls = parser.feed(piece)
        text += new
        deltas.extend(calls)
    new, calls = parser.finish(cut=cut)
    assert parser.text == text + new
    return text + new, deltas + list(calls), parser.calls


def merged(deltas: list[ToolCallDelta]) -> list[tuple[str, str, str]]:
    out: dict[int, list[str]] = {}
    for delta in deltas:
        if delta.index not in out:
            assert delta.id is not None and delta.name is not None
            out[delta.index] = [delta.id, delta.name, ""]
        out[delta.index][2] += delta.arguments
    return [tuple(out[i]) for i in sorted(out)]  # type: ignore[misc]


@pytest.mark.parametrize("split", [1, 3, 1000])
def test_parser_streamed_equals_whole(split: int) -> None:
    cases = [
        (plan(tool_choice="required", parallel_tool_calls=False), '{"name":"get_weather","arguments":{"city":"Paris"}}'),
        (plan(tool_choice="required"), ('[{"name":"get_weather","arguments":{"city":"Paris"}},'
                                        '{"name":"get_time","arguments":{"tz":"UTC"}}]')),
        (plan(), '{"name":"__answer__","arguments":{"content":"Hi \\"you\\" \\u00e9\\ud83d\\ude00!"}}'),
        (plan(native=True), 'Let me check.<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'),
    ]
    for case_plan, text in cases:
        pieces = [text[i : i + split] for i in range(0, len(text), split)]
        streamed = run(case_plan, pieces)
        whole = run(case_plan, [text])
        assert streamed[0] == whole[0]
        assert [(n, a) for _, n, a in merged(streamed[1])] == [(c.name, c.arguments) for c in streamed[2]]
        assert [(c.name, c.args) for c in streamed[2]] == [(c.name, c.args) for c in whole[2]]
        assert all(CALL_ID.match(c.id) for c in streamed[2])
    assert run(cases[2][0], [cases[2][1]])[0] == 'Hi "you" \u00e9\U0001F600!'
    assert run(cases[3][0], [cases[3][1]])[0] == "Let me check."


def test_parser_never_hands_out_cut_call_or_wrapper_json() -> None:
    # A list cut short keeps its complete calls and drops the cut one; with none complete, nothing.
    text, _, calls = run(plan(tool_choice="required"), ['[{"name":"get_time","arguments":{"tz":"UTC"}},{"na'])
    assert [c.name for c in calls] == ["get_time"] and text == ""
    assert run(plan(tool_choice="required"), ['[{"name":"get_time","argu'])[0::2] == ("", [])
    # A single call cut short, or the answer's wrapper cut before its content: no text, no call.
    cut = '{"name":"get_weather","argu'
    assert run(plan(tool_choice="required", parallel_tool_calls=False), [cut])[0::2] == ("", [])
    for wrapper in ['{"name":"__answer__",', '{"name":"__answ', '{"name":"__answer__","arguments":{"content":', "{"]:
        for split in (1, 1000):
            pieces = [wrapper[i : i + split] for i in range(0, len(wrapper), split)]
            assert run(plan(), pieces)[0::2] == ("", [])
    # An answer cut short keeps its prose, decoded (an escape cut in half is left out).
    assert run(plan(), ['{"name":"__answer__","arguments":{"content":"Par'])[0] == "Par"
    for cut_answer, prose in [('"a \\"q\\" \\u00e9\\', 'a "q" \u00e9'), ('"x\\u00', "x"),
                              ('"y\\ud83d\\ude0', "y"), ('"z\\ud83d\\ude00', "z\U0001F600")]:
        raw = '{"name":"__answer__","arguments":{"content":' + cut_answer
        for split in (1, 1000):
            assert run(plan(), [raw[i : i + split] for i in range(0, len(raw), split)])[0] == prose
    # Tagged: unknown tools and broken blocks stay in the text; parallel off keeps the first call.
    tagged = plan(native=True, parallel_tool_calls=False)
    raw = ('A<tool_call>{"name": "nope", "arguments": {}}</tool_call>B<tool_call>{oops</tool_call>'
           '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'
           '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>')
    text, deltas, calls = run(tagged, [raw])
    assert text == 'A<tool_call>{"name": "nope", "arguments": {}}</tool_call>B<tool_call>{oops</tool_call>'
    assert [c.name for c in calls] == ["get_time"] and len(deltas) == 1
    # A marker split across pieces is held back, never leaked.
    streamed, _, calls = run(plan(native=True), ["Hi <tool", '_call>{"name": "get_time", "arguments": {"tz": "UTC"}}',
                                                 "</tool_", "call> bye"])
    assert streamed == "Hi  bye" and [c.name for c in calls] == ["get_time"]


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_parser_hands_out_a_call_cut_by_the_token_limit_with_its_partial_arguments() -> None:
    # A named choice: the call is known before its name is even written.
    named = plan(tool_choice="get_weather", parallel_tool_calls=False)
    for raw, arguments in [('{"name":"get_weather","arguments":{"city":"Par', '{"city":"Par'),
                           ('{"name": "get_weather", "arguments": {"city": "Par', '{"city": "Par'),
                           ('{"name":"get_weather","arguments":{"ci', '{"ci'),
                           ('{"name":"get_weather","arguments":', ""), ('{"name":"get_weather",', ""), ('{"na', "")]:
        for split in (1, 1000):
            text, deltas, calls = run(named, _split(raw, split), cut=True)
            assert text == "" and [(c.name, c.arguments, c.incomplete) for c in calls] == [
                ("get_weather", arguments, True)]
            assert merged(deltas) == [(calls[0].id, "get_weather", arguments)] and CALL_ID.match(calls[0].id)
            with pytest.raises(InvalidInputError, match="cut short by max_tokens"):
                calls[0].args
            assert calls[0].to_openai()["function"] == {"name": "get_weather", "arguments": arguments}
    # Only the wrapper's brace was cut: the arguments are whole, and so is the call.
    [call] = run(named, ['{"name":"get_weather","arguments":{"city":"Paris"}'], cut=True)[2]
    assert not call.incomplete and call.args == {"city": "Paris"}
    # "required": the call is known once its name is whole.
    single = plan(tool_choice="required", parallel_tool_calls=False)
    assert run(single, ['{"name":"get_wea'], cut=True)[0::2] == ("", [])
    [call] = run(single, ['{"name":"get_time","arguments":{"tz":"C'], cut=True)[2]
    assert (call.name, call.arguments, call.incomplete) == ("get_time", '{"tz":"C', True)
    # A list: whole calls are handed out as they close (streamed, before the end), the cut one last.
    several = plan(tool_choice="required")
    raw = '[{"name":"get_time","arguments":{"tz":"UTC"}}, {"name":"get_weather","arguments":{"city":"Ro'
    for split in (1, 7, 1000):
        parser = ToolOutputParser(several)
        early = [d for piece in _split(raw, split) for d in parser.feed(piece)[1]]
        late = parser.finish(cut=True)[1]
        assert [(d.index, d.name, d.arguments) for d in early] == [(0, "get_time", '{"tz": "UTC"}')]
        assert [(d.index, d.name, d.arguments) for d in late] == [(1, "get_weather", '{"city":"Ro')]
        assert [c.incomplete for c in parser.calls] == [False, True]
    # The answer's wrapper is never a call, cut or not; a reply ended otherwise keeps no cut call.
    for wrapper in ['{"name":"__answer__","arguments":{"content"', '{"name":"__answer__",']:
        assert run(plan(), [wrapper], cut=True)[0::2] == ("", [])
    assert run(named, ['{"name":"get_weather","arguments":{"city":"Par'])[0::2] == ("", [])
    # Tagged: a block the limit cut is a call; one the model left open (it ended) stays prose.
    raw = 'Sure.<tool_call>\n{"name": "get_time", "arguments": {"tz": "C'
    text, _, calls = run(plan(native=True), _split(raw, 3), cut=True)
    assert text == "Sure." and [(c.name, c.arguments, c.incomplete) for c in calls] == [("get_time", '{"tz": "C', True)]
    assert run(plan(native=True), [raw])[0::2] == (raw, [])


def test_an_incomplete_call_is_only_a_reply_s_last_word() -> None:
    cut = ToolCall("call_1", "f", '{"a": "x', incomplete=True)
    assert cut.arguments == '{"a": "x' and cut.to_openai()["function"]["arguments"] == '{"a": "x'
    with pytest.raises(InvalidInputError, match=r"'call_1' \(f\) were cut short by max_tokens"):
        cut.args
    with pytest.raises(InputTypeError, match="incomplete' must be a bool"):
        ToolCall("call_1", "f", "{}", incomplete="yes")  # type: ignore[arg-type]
    # A conversation's history holds whole calls: partial arguments are refused there.
    with pytest.raises(InvalidInputError, match="JSON text of an object"):
        GenerationRequest(messages=[*ASK, {"role": "assistant", "content": None, "tool_calls": [cut.to_openai()]}])


def test_auto_decodes_a_non_blank_answer_or_calls(tf_engine: LLMEngine) -> None:
    """The prose form under "auto" used to admit "" (1 in 11 seeds gave an empty reply): the grammar
    both backends decode it under requires a non-blank character, and still admits escapes."""
    from gpuprompt.llm.backends._guided import COMPACT, answer_or_calls_grammar, decoding_constraint

    cache = tf_engine._backend._grammar_cache()  # the engine's tokenizer; the grammar is the point
    for parallel in (False, True):
        auto = plan(parallel_tool_calls=parallel)
        assert auto.calls_schema is not None and auto.guided == {"json": auto.schema}  # portable form kept
        for separators in (COMPACT, None):  # transformers' compact JSON, and vLLM's (xgrammar's defaults)
            compiled = cache.compile({"grammar": answer_or_calls_grammar(auto.calls_schema, separators)})
            item, key = separators or (", ", ": ")

            def accepts(text: str) -> bool:
                matcher = cache.matcher(compiled)
                return bool(matcher.accept_string(text)) and matcher.is_completed()

            def answer(content: str) -> str:
                return f'{{"name"{key}"__answer__"{item}"arguments"{key}{{"content"{key}"{content}"}}}}'

            call = f'{{"name"{key}"get_time"{item}"arguments"{key}{{"tz"{key}"UTC"}}}}'
            for blank in ("", " ", "\\n", " \\n\\t ", "\\u0020", "\u3000"):
                assert not accepts(answer(blank)), (separators, blank)
            for prose in ("Hi", " Hi", r"\n\nSay \"hi\"\nBye", "\u00e9t\u00e9", "\\u00e9", "42"):
                assert accepts(answer(prose)), (separators, prose)
            assert accepts(f"[{call}]" if parallel else call)
            assert not accepts(call if parallel else f"[{call}]")
    # Only a free-text answer takes the grammar: a constrained answer, or forced calls, keep their schema.
    shaped = plan(guided_choice=["yes", "no"])
    forced = plan(tool_choice="required")
    assert shaped.calls_schema is None and forced.calls_schema is None

    class Prepared:
        guided = {"json": {}}
        tool_plan = forced

    assert decoding_constraint(Prepared()) == Prepared.guided


def test_plans_follow_tool_choice() -> None:
    assert plan(tool_choice="none").kind == "off"
    assert plan(native=True).kind == "tagged"
    assert plan(native=True, guided_choice=["a", "b"]).kind == "json"  # a constraint keeps auto constrained
    named = plan(tool_choice="get_time", parallel_tool_calls=False).schema
    assert named["properties"]["name"]["enum"] == ["get_time"]
    assert plan(tool_choice="required").schema["type"] == "array"
    auto = plan(parallel_tool_calls=False).schema["anyOf"]
    assert [o["properties"]["name"]["enum"][0] for o in auto] == ["__answer__", "get_weather", "get_time"]
    # A named choice is exactly one call of that tool, whatever parallel_tool_calls says.
    for parallel in (True, False):
        named_plan = plan(tool_choice="get_time", parallel_tool_calls=parallel)
        assert named_plan.schema["type"] == "object" and not named_plan.parallel
        assert "JSON list" not in instruction(named_plan)


# ---------------------------------------------------------------------- nested schemas ($defs)
ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
           "required": ["city", "country"], "additionalProperties": False}
CUSTOMER = {"type": "object", "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/Address"}},
            "required": ["name", "address"], "additionalProperties": False}
# What openai.pydantic_function_tool(Lookup) sends for Lookup{customer: Customer{address: Address}}.
LOOKUP = {"type": "function", "function": {"name": "Lookup", "description": "Look up a customer.", "strict": True,
                                           "parameters": {
    "$defs": {"Address": ADDRESS, "Customer": CUSTOMER},
    "type": "object", "properties": {"customer": {"$ref": "#/$defs/Customer"}}, "required": ["customer"],
    "additionalProperties": False}}}
# Another tool whose own "Address" differs (old-style "definitions"): a name collision.
SHIP = {"name": "ship", "parameters": {
    "definitions": {"Address": {"type": "object", "properties": {"street": {"type": "string"}}, "required": ["street"]}},
    "type": "object", "properties": {"to": {"$ref": "#/definitions/Address"}}, "required": ["to"]}}
# A recursive tool whose references point at its own root.
TREE = {"name": "tree", "parameters": {"type": "object", "properties": {
    "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}},
    "required": ["label"]}}


def resolve(schema: dict, ref: str) -> dict:
    assert ref.startswith("#/")
    node = schema
    for token in ref[2:].split("/"):
        node = node[token.replace("~1", "/").replace("~0", "~")]
    return node


def all_refs(node) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in all_refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in all_refs(v)]
    return []


def test_nested_tool_schemas_keep_their_definitions_at_the_root() -> None:
    from gpuprompt.llm.backends._guided import check_constraint

    request = GenerationRequest(messages=ASK, tools=[LOOKUP, SHIP, TREE], parallel_tool_calls=False,
                                response_format={"type": "json_schema", "json_schema": {"name": "C", "schema": {
                                    "$defs": {"Address": ADDRESS}, **CUSTOMER}}})
    schema = plan_tools(request, False).schema
    defs = schema["$defs"]
    refs = all_refs(schema)
    assert refs and all(r.startswith("#/$defs/") for r in refs)
    for ref in refs:
        resolve(schema, ref)  # every reference resolves in the combined schema
    assert "definitions" not in json.dumps(schema) and len([k for k in defs if k.startswith("Address")]) == 3
    ship = schema["anyOf"][2]["properties"]["arguments"]
    assert resolve(schema, ship["properties"]["to"]["$ref"])["required"] == ["street"]
    tree = schema["anyOf"][3]["properties"]["arguments"]
    assert resolve(schema, tree["$ref"])["properties"]["label"] == {"type": "string"}
    check_constraint(plan_tools(request, False).guided, "tools")
    # The tool's own schema is untouched.
    assert request.tools[0].parameters["properties"]["customer"] == {"$ref": "#/$defs/Customer"}


def test_a_tool_schema_that_cannot_compile_names_tools(tf_engine: LLMEngine) -> None:
    broken = {"name": "broken", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}}
    with pytest.raises(InvalidInputError, match=r"^'tools' could not be compiled"):
        tf_engine.generate([GenerationRequest(messages=ASK, tools=[broken], tool_choice="required", max_tokens=4)])
    with pytest.raises(InvalidInputError, match=r"^'response_format' could not be compiled"):
        tf_engine.generate([GenerationRequest(messages=ASK, tools=TOOLS, max_tokens=4, response_format={
            "type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}})])


def test_nested_tools_and_response_formats_decode(tf_engine: LLMEngine) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Address(pydantic.BaseModel):
        city: str
        country: str

    class Customer(pydantic.BaseModel):
        name: str
        address: Address

    class Lookup(pydantic.BaseModel):
        customer: Customer

    ask_bob = [{"role": "user", "content": "Look up Bob from Paris, France."}]
    called, answered = tf_engine.generate([
        GenerationRequest(messages=ask_bob, tools=[LOOKUP], tool_choice="required", max_tokens=80),
        GenerationRequest(messages=ask_bob, tools=[SHIP], max_tokens=80, response_format={
            "type": "json_schema", "json_schema": {"name": "C", "schema": Customer.model_json_schema()}}),
    ])
    assert called.finish_reason == "tool_calls" and called.tool_calls
    for call in called.tool_calls:
        assert call.name == "Lookup"
        Lookup.model_validate(call.args)
    if answered.tool_calls:
        assert all(set(c.args) == {"to"} for c in answered.tool_calls)
    elif answered.finish_reason == "stop":
        Customer.model_validate_json(answered.text)


# ---------------------------------------------------------------------- prompt format
@pytest.fixture(scope="module")
def formatter(tf_engine: LLMEngine):
    return tf_engine._ensure_formatter()


HISTORY = [
    {"role": "system", "content": "You are a travel helper."},
    *ASK,
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]},
    {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"},
]


def test_fallback_prompt_lists_tools_and_renders_calls_and_results(formatter) -> None:
    assert not formatter.native_tools  # the bundled SmolLM2 template knows no tools
    request = GenerationRequest(messages=HISTORY, tools=TOOLS)
    text = formatter.render(request.messages, formatter.plan(request))
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a travel helper.")
    assert "<tools>" in system and '"name": "get_time"' in system and "__answer__" in system
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        in text
    assert "<|im_start|>tool\n18 C, sunny<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    # The tools are counted as the engine will send them.
    with_tools = formatter.count(HISTORY, tools=TOOLS)
    assert with_tools == formatter.count(request) > formatter.count(HISTORY) + 40
    none_text = formatter.render(request.messages, plan_tools(ask(tool_choice="none"), False))
    assert "Do not call any tool" in none_text and "<tools>" in none_text


def test_a_template_with_tools_renders_them_itself(tf_engine: LLMEngine) -> None:
    from gpuprompt.llm._chat import ChatFormatter
    from gpuprompt.models import resolve_chat_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_chat_model(None))
    tokenizer.chat_template = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
        "{% for m in messages %}[{{ m.role }}]{{ m.content or '' }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}"
        "{% if m.tool_call_id %} (for {{ m.tool_call_id }}){% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    native = ChatFormatter(tokenizer, 2048, "custom")
    assert native.native_tools
    request = GenerationRequest(messages=HISTORY, tools=TOOLS)
    text = native.render(request.messages, native.plan(request))
    assert text.startswith("TOOLS:get_weather;get_time;[system]You are a travel helper.")
    assert 'CALL get_weather {"city": "Paris"}' in text and "[tool]18 C, sunny (for call_1)" in text
    assert "<tools>" not in text and "__answer__" not in text  # auto is the model's own format here
    forced = native.render(request.messages, native.plan(GenerationRequest(messages=HISTORY, tools=TOOLS,
                                                                           tool_choice="get_time")))
    assert "Call the tool 'get_time' now" in forced


def test_truncate_left_keeps_a_call_with_its_results(formatter) -> None:
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(12):
        messages += [
            {"role": "user", "content": f"Question {i}: " + "what about the weather there " * 8},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris " * 20})}}]},
            {"role": "tool", "content": "sunny " * 30, "tool_call_id": f"call_{i}"},
            {"role": "assistant", "content": "It is sunny. " * 10},
        ]
    messages += [{"role": "user", "content": "And tomorrow?"},
                 {"role": "assistant", "content": None, "tool_calls": [{"id": "call_x", "function": {
                     "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                 {"role": "tool", "content": "rain", "tool_call_id": "call_x"}]
    request = GenerationRequest(messages=messages, tools=TOOLS, max_tokens=1400, truncate="left")
    prepared = formatter.prepare(request)
    assert 0 < prepared.dropped_messages < len(messages) - 4
    kept = [m for m in messages if m["role"] == "system"] + messages[1 + prepared.dropped_messages :]
    assert kept[1]["role"] == "user"  # history restarts on a user turn: no orphan call or result
    assert len(prepared.token_ids) == formatter.count(GenerationRequest(messages=kept, tools=TOOLS))


# ---------------------------------------------------------------------- the engine, both backends
@pytest.mark.parametrize("parallel", [False, True])
def test_required_and_named_choices_return_typed_calls(engine: LLMEngine, parallel: bool) -> None:
    assert engine.supports_tools and engine.capabilities["tools"]
    required, named = engine.generate([
        ask(tool_choice="required", parallel_tool_calls=parallel),
        ask(tool_choice="get_time", parallel_tool_calls=parallel),
    ])
    for result in (required, named):
        assert result.finish_reason == "tool_calls" and result.text == ""
        assert 1 <= len(result.tool_calls) <= (4 if parallel else 1)
        for call in result.tool_calls:
            check_call(call)
    assert {c.name for c in named.tool_calls} == {"get_time"}
    assert len(named.tool_calls) == 1  # a named choice is one call, even with parallel_tool_calls
    if not parallel:
        assert len(required.tool_calls) == 1


def test_auto_answers_in_prose_or_calls_and_none_never_calls(engine: LLMEngine) -> None:
    results = engine.generate([
        ask(max_tokens=24),
        GenerationRequest(messages=[{"role": "user", "content": "Say hello to me."}], tools=TOOLS, max_tokens=24),
        ask(tool_choice="none", max_tokens=12),
    ])
    for result in results[:2]:
        if result.tool_calls:
            assert result.finish_reason == "tool_calls" and result.text == ""
            for call in result.tool_calls:
                check_call(call)
        else:
            assert result.text and result.finish_reason in ("stop", "length")
        assert not result.text.lstrip().startswith(("{", "["))  # no raw JSON leaks into the prose
    assert results[2].tool_calls == () and results[2].finish_reason in ("stop", "length") and results[2].text


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_streamed_tool_calls_concatenate_to_the_generated_ones(engine: LLMEngine, choice: str) -> None:
    request = ask(tool_choice=choice, max_tokens=40)
    [result] = engine.generate([request])
    deltas = list(engine.stream(request))
    assert all(isinstance(d, StreamDelta) for d in deltas)
    # usage as a whole but the prefix-cache hits, which depend on what ran before
    assert deltas[-1].finish_reason == result.finish_reason
    assert dataclasses.replace(deltas[-1].usage, cached_tokens=0) == dataclasses.replace(result.usage, cached_tokens=0)
    assert "".join(d.text for d in deltas) == result.text
    calls = merged([c for d in deltas for c in d.tool_calls])
    assert [(name, json.loads(args)) for _, name, args in calls] == [(c.name, c.args) for c in result.tool_calls]

    async def collect() -> list[StreamDelta]:
        return [d async for d in engine.astream(request)]

    again = asyncio.run(collect())
    assert [(n, a) for _, n, a in merged([c for d in again for c in d.tool_calls])] == [
        (n, a) for _, n, a in calls
    ]


def test_a_tool_result_in_the_history_is_answered(engine: LLMEngine) -> None:
    # Room for the answer's wrapper and some prose: a reply cut inside the wrapper is empty.
    request = GenerationRequest(messages=HISTORY, tools=TOOLS, max_tokens=32)
    [result] = engine.generate([request])
    assert result.usage.prompt_tokens == engine.count_tokens(request)
    assert result.text or result.tool_calls
    # Without tools bound, the same history still renders (calls and results as turns).
    [plain] = engine.generate([GenerationRequest(messages=HISTORY, max_tokens=8)])
    assert plain.text and not plain.tool_calls


def test_a_backend_lacking_a_feature_refuses_it(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = engine._backend
    monkeypatch.setattr(backend, "guided_kinds", frozenset({"json", "json_object"}))
    monkeypatch.setattr(backend, "sampling_fields", frozenset())
    before = engine.stats().requests
    with pytest.raises(UnsupportedFeatureError) as caught:
        engine.generate([GenerationRequest(messages=ASK, top_k=5)])
    assert caught.value.field == "top_k" and caught.value.backend == backend.name
    assert "'top_k' is not supported" in str(caught.value)
    with pytest.raises(UnsupportedFeatureError) as caught:
        engine.generate([GenerationRequest(messages=ASK, guided_regex="a+")])
    assert caught.value.field == "guided_regex"
    assert isinstance(caught.value, InvalidInputError)
    assert engine.stats().requests == before


def test_auto_with_a_constraint_shapes_the_prose_answer(engine: LLMEngine) -> None:
    schema = {"type": "object", "properties": {"sky": {"type": "string", "enum": ["clear", "cloudy"]}},
              "required": ["sky"]}
    choice, structured = engine.generate([
        GenerationRequest(messages=[{"role": "user", "content": "Is it sunny? Answer yes or no."}], tools=TOOLS,
                          guided_choice=["yes", "no"], max_tokens=40),
        GenerationRequest(messages=[{"role": "user", "content": "Describe the sky as JSON."}], tools=TOOLS,
                          response_format=schema, max_tokens=40),
    ])
    if not choice.tool_calls:
        assert choice.text in ("yes", "no")
    if not structured.tool_calls:
        assert json.loads(structured.text)["sky"] in ("clear", "cloudy")
    for result in (choice, structured):
        for call in result.tool_calls:
            check_call(call)


# ---------------------------------------------------------------------- cut short, stop strings
def _streamed(engine: LLMEngine, request: GenerationRequest) -> tuple[str, list[tuple[str, str]], str | None]:
    deltas = list(engine.stream(request))
    calls = [(name, args) for _, name, args in merged([c for d in deltas for c in d.tool_calls])]
    return "".join(d.text for d in deltas), calls, deltas[-1].finish_reason


def test_a_reply_cut_by_max_tokens_holds_no_wrapper_json(tf_engine: LLMEngine) -> None:
    requests = [ask(max_tokens=14), ask(tool_choice="required", max_tokens=10),
                ask(tool_choice="required", parallel_tool_calls=False, max_tokens=10)]
    for request, result in zip(requests, tf_engine.generate(requests)):
        assert result.finish_reason == "length" and result.usage.completion_tokens == request.max_tokens
        assert "{" not in result.text and "__answer__" not in result.text
        # A call the limit cut (once its name is written) is its only call, marked incomplete.
        assert len(result.tool_calls) <= 1 and all(c.incomplete for c in result.tool_calls)
        calls = [(c.name, c.arguments) for c in result.tool_calls]
        assert _streamed(tf_engine, request) == (result.text, calls, "length")


AFTER_A_TOOL = [
    {"role": "system", "content": "You are a helpful AI assistant."},
    {"role": "user", "content": "What does the red dress cost?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_price", "arguments": '{"product": "red dress"}'}}]},
    {"role": "tool", "content": "49.90", "tool_call_id": "call_1"},
]


def test_auto_never_answers_with_an_empty_reply(engine: LLMEngine) -> None:
    """Flowise's Tool Agent got empty replies: after a tool result, the prose form's content was ""
    for 7 of these 11 seeds on transformers before the grammar required a non-blank character."""
    requests = [GenerationRequest(messages=AFTER_A_TOOL, tools=[FREE_PRICE, FREE_STOCK], max_tokens=32,
                                  temperature=1.0, seed=seed) for seed in range(11)]
    for request, result in zip(requests, engine.generate(requests)):
        assert result.tool_calls or result.text.strip(), (request.seed, result)


def test_a_call_cut_by_max_tokens_comes_back_with_its_partial_arguments(engine: LLMEngine) -> None:
    """A forced call cut by max_tokens used to vanish (finish_reason "length", no call); OpenAI and
    vLLM's server return it with the partial arguments: so does the core, on both backends."""
    named = GenerationRequest(messages=LONG_ASK, tools=[FREE_PRICE, FREE_STOCK], max_tokens=24,
                              tool_choice={"type": "function", "function": {"name": "get_price"}})
    listed = GenerationRequest(messages=LONG_ASK, tools=[FREE_PRICE, FREE_STOCK], max_tokens=24,
                               tool_choice="required")
    for request, result in zip((named, listed), engine.generate([named, listed])):
        assert result.finish_reason == "length" and result.usage.completion_tokens == 24
        assert result.text == ""
        [call] = result.tool_calls
        assert call.incomplete and CALL_ID.match(call.id)
        assert call.name == "get_price" if request is named else call.name in ("get_price", "get_stock")
        # Cut inside the string argument: the text as generated, not JSON.
        assert re.match(r'\{\s*"product"\s*:\s*"[^"]+$', call.arguments), call.arguments
        with pytest.raises(InvalidInputError, match="cut short by max_tokens"):
            call.args
        # Streamed: the same call; its deltas (id and name first) concatenate to the partial text.
        deltas = list(engine.stream(request))
        assert deltas[-1].finish_reason == "length" and "".join(d.text for d in deltas) == ""
        [(_, name, arguments)] = merged([c for d in deltas for c in d.tool_calls])
        assert (name, arguments) == (call.name, call.arguments)
        # Stop strings apply to prose, never inside a call: even '"' does not cut it.
        [stopped] = engine.generate([dataclasses.replace(request, stop=('"', "dress"))])
        assert (stopped.finish_reason, [(c.name, c.arguments) for c in stopped.tool_calls]) == (
            "length", [(call.name, call.arguments)])


def test_length_wins_over_tool_calls_when_the_limit_stopped_the_reply(tf_engine: LLMEngine) -> None:
    request = ask(tool_choice="required", max_tokens=64)
    [whole] = tf_engine.generate([request])
    assert whole.finish_reason == "tool_calls" and whole.tool_calls
    # One token fewer: the end-of-sequence token is not reached, the limit stops the reply.
    limited = ask(tool_choice="required", max_tokens=whole.usage.completion_tokens - 1)
    [cut] = tf_engine.generate([limited])
    assert cut.finish_reason == "length" and cut.text == ""
    assert [(c.name, c.args) for c in cut.tool_calls] == [(c.name, c.args) for c in whole.tool_calls]
    text, calls, finish = _streamed(tf_engine, limited)
    assert (text, finish) == ("", "length") and [n for n, _ in calls] == [c.name for c in whole.tool_calls]


def test_stop_strings_apply_to_the_answer_not_the_wrapper(tf_engine: LLMEngine) -> None:
    hello = [{"role": "user", "content": "Say hello to me."}]
    [free] = tf_engine.generate([GenerationRequest(messages=hello, tools=TOOLS, max_tokens=40)])
    # At temperature 0 the bundled model answers this in prose (the "auto" wrapper's answer branch).
    assert not free.tool_calls and len(free.text.split()) >= 4, free
    # '"name"' and '"content"' are in the wrapper JSON, never in this answer: they must not stop it.
    stops = ['"name"', '"content"', free.text.split()[3]]
    cut_at = min(i for i in (free.text.find(s) for s in stops) if i >= 0)
    request = GenerationRequest(messages=hello, tools=TOOLS, max_tokens=40, stop=stops)
    [stopped] = tf_engine.generate([request])
    assert stopped.text == free.text[:cut_at] and stopped.finish_reason == "stop"
    assert stopped.usage.completion_tokens < free.usage.completion_tokens  # the request ended early
    assert _streamed(tf_engine, request) == (stopped.text, [], "stop")
