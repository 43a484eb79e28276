"""Guided decoding (regex, choice, JSON) and the extra sampling fields, on both backends.

Greedy decoding throughout unless a test samples on purpose; max_tokens stays small.
"""

from __future__ import annotations

import re

import pytest

from gpuprompt.errors import InputTypeError, InvalidInputError
from gpuprompt.llm import GenerationRequest, LLMEngine

ASK = [{"role": "user", "content": "Give me a product code for a red dress."}]


def chat(**kwargs) -> GenerationRequest:
    kwargs.setdefault("max_tokens", 16)
    return GenerationRequest(messages=kwargs.pop("messages", ASK), **kwargs)


# ---------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"top_k": -1}, InvalidInputError, r"'top_k' must be an int >= 0"),
        ({"top_k": 1.5}, InvalidInputError, "'top_k'"),
        ({"top_k": True}, InvalidInputError, "'top_k'"),
        ({"min_p": 1.5}, InvalidInputError, "'min_p' must be a finite number"),
        ({"min_p": float("nan")}, InvalidInputError, "'min_p'"),
        ({"presence_penalty": 2.5}, InvalidInputError, "'presence_penalty'"),
        ({"frequency_penalty": "1"}, InvalidInputError, "'frequency_penalty'"),
        ({"repetition_penalty": 0}, InvalidInputError, "'repetition_penalty' must be a number > 0"),
        ({"repetition_penalty": float("inf")}, InvalidInputError, "'repetition_penalty'"),
        ({"logit_bias": [1, 2]}, InputTypeError, "'logit_bias' must be None or a dict"),
        ({"logit_bias": {-1: 1.0}}, InvalidInputError, "'logit_bias key'"),
        ({"logit_bias": {"abc": 1.0}}, InvalidInputError, "'logit_bias key'"),
        ({"logit_bias": {5: 101}}, InvalidInputError, r"'logit_bias\[5\]'"),
        ({"logit_bias": {5: float("nan")}}, InvalidInputError, r"'logit_bias\[5\]'"),
        ({"logit_bias": {i: 1.0 for i in range(4097)}}, InvalidInputError, "at most 4096"),
        ({"guided_regex": ""}, InvalidInputError, "'guided_regex' must be a non-empty str"),
        ({"guided_regex": "(unclosed"}, InvalidInputError, "valid regular expression"),
        ({"guided_regex": b"a+"}, InputTypeError, "'guided_regex' must be a str"),
        ({"guided_choice": "yes"}, InputTypeError, "Wrap a single option in a list"),
        ({"guided_choice": []}, InvalidInputError, "'guided_choice' must be a list of 1 to"),
        ({"guided_choice": ["a", 3]}, InputTypeError, r"'guided_choice\[1\]' must be a str"),
        ({"guided_choice": ["a", ""]}, InvalidInputError, r"'guided_choice\[1\]' must be a non-empty str"),
        ({"guided_choice": ["a"], "guided_regex": "a"}, InvalidInputError, "at most one of"),
        ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, InvalidInputError, "at most one of"),
        ({"min_tokens": -1}, InvalidInputError, "'min_tokens' must be an int >= 0"),
        ({"min_tokens": 2.0}, InvalidInputError, "'min_tokens'"),
        ({"min_tokens": 17}, InvalidInputError, r"'min_tokens' must be at most 'max_tokens' \(16\)"),
        ({"ignore_eos": 1}, InputTypeError, "'ignore_eos' must be a bool"),
        ({"ignore_eos": True, "guided_regex": "a+"}, InvalidInputError, "'ignore_eos' cannot be combined"),
        ({"ignore_eos": True, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
         InvalidInputError, "'ignore_eos' cannot be combined"),
        ({"stop_token_ids": 5}, InputTypeError, "'stop_token_ids' must be a list of token ids"),
        ({"stop_token_ids": "5"}, InputTypeError, "'stop_token_ids' must be a list of token ids"),
        ({"stop_token_ids": [1, -2]}, InvalidInputError, r"'stop_token_ids\[1\]' must be an int >= 0"),
        ({"stop_token_ids": [True]}, InvalidInputError, r"'stop_token_ids\[0\]'"),
        ({"stop_token_ids": list(range(1025))}, InvalidInputError, "at most 1024 ids"),
        ({"include_stop_str_in_output": "yes"}, InputTypeError, "'include_stop_str_in_output' must be a bool"),
        ({"skip_special_tokens": None}, InputTypeError, "'skip_special_tokens' must be a bool"),
        ({"skip_special_tokens": False, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
         InvalidInputError, "'skip_special_tokens' cannot be combined with tools"),
        ({"include_stop_str_in_output": True,
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
         InvalidInputError, "'include_stop_str_in_output' cannot be combined with tools"),
        ({"min_tokens": 2, "stop": ["x"], "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
         InvalidInputError, "'min_tokens' cannot be combined with 'stop' and tools"),
    ],
)
def test_bad_sampling_and_guided_fields_are_refused(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        chat(**kwargs)


def test_fields_are_normalised() -> None:
    request = chat(logit_bias={"42": 5, 7: -1.5}, guided_choice=["a", "b", "a"], top_k=3, min_p=0)
    assert request.logit_bias == {42: 5.0, 7: -1.5}
    assert request.guided == {"choice": ["a", "b"]}
    assert isinstance(request.min_p, float) and request.top_k == 3
    assert chat(guided_regex="[a-z]+").guided == {"regex": "[a-z]+"}
    assert chat(logit_bias={}).logit_bias is None
    assert chat(stop_token_ids=[7, 3, 7]).stop_token_ids == (7, 3)
    assert chat(stop_token_ids=None).stop_token_ids == ()


# ---------------------------------------------------------------------- constraints, both backends
def test_regex_and_choice_constrain_the_output(engine: LLMEngine) -> None:
    assert {"json", "json_object", "regex", "choice"} <= set(engine.capabilities["guided"])
    regex, choice, question = engine.generate([
        chat(guided_regex=r"[A-Z]{3}-[0-9]{4}"),
        chat(messages=[{"role": "user", "content": "Is the sky green?"}], guided_choice=["yes", "no", "maybe not"]),
        chat(messages=[{"role": "user", "content": "Pick a size."}], guided_choice=['X "large"\n', "small"]),
    ])
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{4}", regex.text) and regex.finish_reason == "stop"
    assert choice.text in ("yes", "no", "maybe not") and choice.finish_reason == "stop"
    assert question.text in ('X "large"\n', "small")


def test_constrained_and_free_rows_share_a_batch(engine: LLMEngine) -> None:
    free = chat(messages=[{"role": "user", "content": "Name three colors."}], max_tokens=12)
    [alone] = engine.generate([free])
    together = engine.generate([chat(guided_regex="[0-9]{6}"), free, chat(guided_choice=["red", "blue"])])
    assert together[1].text == alone.text  # the free row is untouched by its neighbours' grammars
    assert re.fullmatch("[0-9]{6}", together[0].text) and together[2].text in ("red", "blue")


def test_a_bad_constraint_fails_at_the_call(engine: LLMEngine) -> None:
    before = engine.stats().requests
    with pytest.raises(InvalidInputError):
        engine.generate([chat(response_format={"type": "object", "properties": {"a": {"type": "no-such-type"}}})])
    assert engine.stats().requests == before


# ---------------------------------------------------------------------- sampling fields, both backends
def test_top_k_one_and_min_p_one_sample_the_greedy_token(engine: LLMEngine) -> None:
    greedy, top_k, min_p = engine.generate([
        chat(max_tokens=10),
        chat(max_tokens=10, temperature=1.5, top_k=1, seed=3),
        chat(max_tokens=10, temperature=1.5, min_p=1.0, seed=4),
    ])
    assert top_k.text == greedy.text == min_p.text


def test_logit_bias_and_penalties_change_the_greedy_output(engine: LLMEngine) -> None:
    formatter = engine._ensure_formatter()
    [greedy] = engine.generate([chat(max_tokens=8)])
    first = formatter.tokenizer(greedy.text, add_special_tokens=False)["input_ids"][0]
    banned, forced = engine.generate([
        chat(max_tokens=8, logit_bias={first: -100}),
        chat(max_tokens=2, logit_bias={first: 100}),
    ])
    assert not banned.text.startswith(formatter.tokenizer.decode([first]))
    assert forced.text == formatter.tokenizer.decode([first, first])
    repeat = [{"role": "user", "content": "Repeat after me forever: la la la la la la la la la la"}]
    plain, penalised, presence = engine.generate([
        chat(messages=repeat, max_tokens=24),
        chat(messages=repeat, max_tokens=24, repetition_penalty=1.8),
        chat(messages=repeat, max_tokens=24, presence_penalty=2.0, frequency_penalty=2.0),
    ])
    assert penalised.text != plain.text and presence.text != plain.text
    assert plain.text.count("la") > presence.text.count("la")


def test_logit_bias_outside_the_vocabulary_is_refused(engine: LLMEngine) -> None:
    with pytest.raises(InvalidInputError, match="logit_bias"):
        engine.generate([chat(logit_bias={10**9: 1.0})])


# ---------------------------------------------------------------------- vLLM's end-of-reply fields, both backends
SHORT = [{"role": "user", "content": "Say just the word yes."}]
"""A prompt the bundled model answers in a few tokens, well before max_tokens."""


def test_ignore_eos_generates_to_max_tokens(engine: LLMEngine) -> None:
    plain, ignoring = engine.generate([chat(messages=SHORT, max_tokens=20),
                                       chat(messages=SHORT, max_tokens=20, ignore_eos=True)])
    assert plain.finish_reason == "stop" and plain.usage.completion_tokens < 10
    assert ignoring.finish_reason == "length" and ignoring.usage.completion_tokens == 20
    assert ignoring.text.startswith(plain.text) and len(ignoring.text) > len(plain.text)


def test_min_tokens_holds_back_the_end_of_sequence_and_stop_strings(engine: LLMEngine) -> None:
    plain, held, early_stop, held_stop = engine.generate([
        chat(messages=SHORT, max_tokens=24),
        chat(messages=SHORT, max_tokens=24, min_tokens=12),
        chat(messages=SHORT, max_tokens=24, stop=["Yes"]),
        chat(messages=SHORT, max_tokens=24, stop=["Yes"], min_tokens=4),
    ])
    assert plain.text.startswith("Yes") and plain.usage.completion_tokens < 12
    assert held.usage.completion_tokens >= 12 and held.text.startswith(plain.text.rstrip("."))
    assert early_stop.text == "" and early_stop.finish_reason == "stop"
    # "Yes" is met in the first tokens, before min_tokens: only a later one may end the reply.
    assert held_stop.text.startswith("Yes") and held_stop.usage.completion_tokens >= 4


def test_stop_token_ids_end_the_reply_without_their_text(engine: LLMEngine) -> None:
    tokenizer = engine._ensure_formatter().tokenizer
    [greedy] = engine.generate([chat(max_tokens=12, ignore_eos=True)])
    ids = tokenizer(greedy.text, add_special_tokens=False)["input_ids"]
    second = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])  # a token not met before it
    [stopped] = engine.generate([chat(max_tokens=12, ignore_eos=True, stop_token_ids=[ids[second]])])
    assert stopped.finish_reason == "stop"
    assert stopped.text == tokenizer.decode(ids[:second])
    assert stopped.usage.completion_tokens == second + 1  # the stop token is counted, not shown


def test_include_stop_str_in_output_and_special_tokens(engine: LLMEngine) -> None:
    tokenizer = engine._ensure_formatter().tokenizer
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert len(newline) == 1
    cut, kept, token_cut, token_kept, plain, special = engine.generate([
        chat(messages=SHORT, max_tokens=16, stop=["."]),
        chat(messages=SHORT, max_tokens=16, stop=["."], include_stop_str_in_output=True),
        chat(messages=SHORT, max_tokens=16, ignore_eos=True, stop_token_ids=newline),
        chat(messages=SHORT, max_tokens=16, ignore_eos=True, stop_token_ids=newline, include_stop_str_in_output=True),
        chat(messages=SHORT, max_tokens=16, ignore_eos=True),
        chat(messages=SHORT, max_tokens=16, ignore_eos=True, skip_special_tokens=False),
    ])
    assert cut.finish_reason == kept.finish_reason == "stop" and kept.text == cut.text + "."
    assert token_kept.text == token_cut.text + "\n" and token_kept.finish_reason == "stop"
    assert tokenizer.eos_token not in plain.text and tokenizer.eos_token in special.text
    assert special.text.replace(tokenizer.eos_token, "").startswith(plain.text.split("\n")[0])


def test_min_tokens_bars_the_end_of_sequence_with_ignore_eos_too(engine: LLMEngine) -> None:
    """As vLLM: min_tokens bars the end-of-sequence token even when ignore_eos would not stop on it."""
    held, both = engine.generate([chat(messages=SHORT, max_tokens=20, min_tokens=10),
                                  chat(messages=SHORT, max_tokens=20, min_tokens=10, ignore_eos=True)])
    assert held.finish_reason == "stop" and held.usage.completion_tokens < 20
    assert both.text.startswith(held.text) and both.usage.completion_tokens == 20


def test_the_stop_string_that_ends_first_wins(engine: LLMEngine) -> None:
    """"Yes." meets "e" (ending at 2) before "Yes" (ending at 3), whatever their order or starts."""
    cut, kept = engine.generate([chat(messages=SHORT, stop=["Yes", "e"]),
                                 chat(messages=SHORT, stop=["Yes", "e"], include_stop_str_in_output=True)])
    assert (cut.text, kept.text) == ("Y", "Ye")


def test_stop_reason_names_the_stop_token_or_string(engine: LLMEngine) -> None:
    """As vLLM's stop_reason: the stop token id or stop string; None for the end of sequence and length."""
    token, string, eos, length = engine.generate([
        chat(messages=SHORT, ignore_eos=True, stop_token_ids=[198]),
        chat(messages=SHORT, stop=["zzz", "."]),
        chat(messages=SHORT),
        chat(messages=SHORT, max_tokens=1),
    ])
    assert (token.finish_reason, token.stop_reason) == ("stop", 198)
    assert (string.finish_reason, string.stop_reason) == ("stop", ".")
    assert (eos.finish_reason, eos.stop_reason) == ("stop", None)
    assert (length.finish_reason, length.stop_reason) == ("length", None)
    *_, last = engine.stream(chat(messages=SHORT, stop=["zzz", "."]))
    assert (last.finish_reason, last.stop_reason) == ("stop", ".")


def test_stop_token_ids_outside_the_vocabulary_are_refused(engine: LLMEngine) -> None:
    with pytest.raises(InvalidInputError, match="stop_token_ids"):
        engine.generate([chat(stop_token_ids=[10**9])])


# ---------------------------------------------------------------------- prefix cache
def test_cached_tokens(engine: LLMEngine) -> None:
    long = [{"role": "system", "content": "You answer questions about the shop. " * 40},
            {"role": "user", "content": "Which dress is red?"}]
    first, = engine.generate([chat(messages=long, max_tokens=2)])
    second, = engine.generate([chat(messages=long, max_tokens=2)])
    assert engine.capabilities["prefix_cache"]  # both backends (transformers: see test_llm_prefix_cache)
    assert 0 < second.usage.cached_tokens < second.usage.prompt_tokens
    assert second.text == first.text
