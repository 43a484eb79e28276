"""``POST /v1/completions`` through the official ``openai`` client: raw prompts (no chat template),
lists of prompts, echo, stop, streaming, usage, and the fields refused with a 400 naming them."""

from __future__ import annotations

import openai
import pytest

from gpuprompt import GenerationRequest

PROMPT = "The three primary colours are"
CHAT = "SmolLM2-135M-Instruct"


def _direct(llm, prompt: str, **options):
    [result] = llm.generate([GenerationRequest(prompt=prompt, temperature=0.0, **options)])
    return result


def test_a_prompt_continues_exactly_as_the_engine_does(openai_client, server_llm) -> None:
    direct = _direct(server_llm, PROMPT, max_tokens=10)
    response = openai_client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=10, temperature=0)
    [choice] = response.choices
    assert response.object == "text_completion"
    assert response.id.startswith("cmpl-")
    assert choice.text == direct.text
    assert choice.finish_reason == direct.finish_reason
    assert choice.index == 0
    assert response.usage.prompt_tokens == direct.usage.prompt_tokens
    assert response.usage.completion_tokens == direct.usage.completion_tokens
    assert response.usage.total_tokens == direct.usage.total_tokens


def test_a_list_of_prompts_gets_one_choice_each_and_summed_usage(openai_client, server_llm) -> None:
    prompts = [PROMPT, "A red dress is made of"]
    directs = [_direct(server_llm, p, max_tokens=6) for p in prompts]
    response = openai_client.completions.create(model=CHAT, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in response.choices] == [0, 1]
    assert [c.text for c in response.choices] == [d.text for d in directs]
    assert response.usage.prompt_tokens == sum(d.usage.prompt_tokens for d in directs)
    assert response.usage.completion_tokens == sum(d.usage.completion_tokens for d in directs)


def test_echo_puts_the_prompt_first_and_stop_cuts(openai_client, server_llm) -> None:
    direct = _direct(server_llm, PROMPT, max_tokens=12)
    response = openai_client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=12, temperature=0, echo=True)
    assert response.choices[0].text == PROMPT + direct.text
    words = direct.text.split()
    assert len(words) >= 3, direct.text
    stop = " " + words[2]
    response = openai_client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop)
    assert response.choices[0].text == direct.text[: direct.text.index(stop)]
    assert response.choices[0].finish_reason == "stop"


def test_max_tokens_and_seeded_sampling(openai_client) -> None:
    response = openai_client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=3, temperature=0)
    assert response.usage.completion_tokens <= 3
    assert response.choices[0].finish_reason == "length"
    first = openai_client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=8, temperature=0.9, top_p=0.9, seed=7)
    again = openai_client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=8, temperature=0.9, top_p=0.9, seed=7)
    assert first.choices[0].text == again.choices[0].text


def test_streaming_sends_the_same_text_with_echo_and_usage(openai_client, server_llm) -> None:
    direct = _direct(server_llm, PROMPT, max_tokens=10)
    chunks = list(
        openai_client.completions.create(
            model=CHAT, prompt=PROMPT, max_tokens=10, temperature=0, stream=True, echo=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert texts[0] == PROMPT
    assert len(texts) > 2
    assert "".join(texts) == PROMPT + direct.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        direct.finish_reason
    ]
    assert all(c.object == "text_completion" for c in chunks)
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == direct.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == direct.usage.prompt_tokens


@pytest.mark.parametrize(
    ("options", "param", "fragment"),
    [
        ({"prompt": [1, 2, 3]}, "prompt", "token ids"),
        ({"prompt": [[1, 2], [3]]}, "prompt", "token ids"),
        ({"prompt": []}, "prompt", "at least one prompt"),
        ({"prompt": PROMPT, "n": 2}, "n", "'n' must be 1"),
        ({"prompt": PROMPT, "best_of": 2}, "best_of", "'best_of'"),
        ({"prompt": PROMPT, "logprobs": 1}, "logprobs", "'logprobs'"),
        ({"prompt": PROMPT, "suffix": "end."}, "suffix", "'suffix'"),
        ({"prompt": [PROMPT, PROMPT], "stream": True}, "prompt", "one text when 'stream'"),
        ({"prompt": PROMPT, "temperature": 3}, "temperature", "'temperature'"),
        ({"prompt": PROMPT, "presence_penalty": 2.5}, "presence_penalty", "'presence_penalty'"),
        ({"prompt": PROMPT, "logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
        ({"prompt": PROMPT, "logit_bias": {"12": 101}}, "logit_bias", "'logit_bias"),
        ({"prompt": "word " * 5000}, "prompt", "context"),
        ({"prompt": PROMPT, "extra_body": {"ignore_eos": True, "guided_regex": "a+"}}, "ignore_eos",
         "cannot be combined"),
        ({"prompt": PROMPT, "extra_body": {"bad_words": ["the"]}}, "bad_words", "vLLM sampling field"),
    ],
)
def test_refused_fields_are_400_naming_the_field(openai_client, options, param, fragment) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.completions.create(model=CHAT, max_tokens=2, **options)
    assert info.value.status_code == 400
    assert info.value.param is not None and info.value.param.startswith(param), info.value.body
    assert fragment in info.value.message
    assert info.value.body["type"] == "invalid_request_error"


def test_ignore_eos_gives_replies_of_max_tokens(openai_client) -> None:
    """What ``vllm bench serve --ignore-eos`` sends to time replies of a fixed length."""
    answer = openai_client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=24, temperature=0,
                                              extra_body={"ignore_eos": True})
    assert answer.usage.completion_tokens == 24 and answer.choices[0].finish_reason == "length"
    held = openai_client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=24, temperature=0,
                                            stop=["\n"], extra_body={"min_tokens": 16})
    assert held.usage.completion_tokens >= 16


def test_unknown_model_is_404(openai_client) -> None:
    with pytest.raises(openai.NotFoundError):
        openai_client.completions.create(model="gpt-3.5-turbo-instruct", prompt=PROMPT, max_tokens=2)
