"""The core remote objects against a live ``gpuprompt serve``: the same vectors and replies as in
process, streaming, async, tools, structured output, sessions, and the error mapping."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import numpy as np
import pytest
from gpuprompt.errors import (
    ConfigurationError,
    ContextLengthError,
    EngineDeadError,
    EngineError,
    FilterError,
    InputTypeError,
    InvalidInputError,
    ModelLoadError,
    QueueFullError,
    RequestTimeoutError,
    SessionStoreError,
    UnsupportedFeatureError,
    VectorStoreError,
)
from gpuprompt.llm import GenerationRequest, ToolSpec
from gpuprompt.remote import RemoteConfig, RemoteEmbedder, RemoteLLM, resolve_remote
from gpuprompt.wire import error_from_status

TEXTS = ["red summer dress", "blue denim jeans", "a warm winter coat", "", "naïve café ☕"]
WEATHER = ToolSpec(
    "get_weather",
    "Weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def _chat(text: str, **options) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], **options)


# ---------------------------------------------------------------------- embeddings
def test_embeddings_equal_in_process(live, embedder) -> None:
    remote = RemoteEmbedder(live.url)
    vectors = remote.embed(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), embedder.dim)
    np.testing.assert_allclose(vectors, embedder.embed(TEXTS), atol=1e-5)
    assert remote.dim == embedder.dim
    assert remote.model_id == embedder.model_id == remote.identity
    assert remote.embed([]).shape == (0, embedder.dim)


async def test_async_embeddings_equal_in_process(live, embedder) -> None:
    remote = RemoteEmbedder(live.url)
    vectors = await asyncio.gather(*(remote.aembed([text]) for text in TEXTS))
    np.testing.assert_allclose(np.concatenate(vectors), embedder.embed(TEXTS), atol=1e-5)


def test_large_inputs_are_split_into_server_sized_requests(live, embedder) -> None:
    texts = [f"item {i % 50}" for i in range(2050)]  # two requests: 2048 + 2
    vectors = RemoteEmbedder(live.url).embed(texts)
    assert vectors.shape == (2050, embedder.dim)
    np.testing.assert_allclose(vectors[2049], embedder.embed([texts[2049]])[0], atol=1e-5)


def test_bad_embedding_input_is_refused_before_sending(live) -> None:
    with pytest.raises(InputTypeError, match="texts"):
        RemoteEmbedder(live.url).embed("a bare str")  # type: ignore[arg-type]


def test_models_are_matched_to_the_served_ones(live, embedder, remote_llm_engine) -> None:
    with pytest.raises(ConfigurationError, match="serves the embedding model"):
        RemoteEmbedder(live.url, model="no/such-model").load()
    with pytest.raises(ConfigurationError, match="serves the chat model"):
        RemoteLLM(live.url, model=embedder.model_id).load()  # served, but not as the chat model
    short = remote_llm_engine.model_name.rsplit("/", 1)[-1]  # a local folder's name matches by its tail
    assert RemoteLLM(live.url, model=short).model_name == remote_llm_engine.model_name
    named = RemoteEmbedder(live.url, model=embedder.model_id)
    np.testing.assert_allclose(named.embed(["x"]), embedder.embed(["x"]), atol=1e-5)


# ---------------------------------------------------------------------- generation
def test_generate_equals_in_process_at_temperature_zero(live, remote_llm_engine) -> None:
    requests = [_chat("Name a colour.", max_tokens=12), _chat("Say hello to Ana.", max_tokens=12)]
    remote = RemoteLLM(live.url)
    got = remote.generate(requests)
    for request, result in zip(requests, got, strict=True):
        [local] = remote_llm_engine.generate([request])
        assert result.text == local.text
        assert result.finish_reason == local.finish_reason
        assert result.usage.prompt_tokens == local.usage.prompt_tokens
        assert result.usage.completion_tokens == local.usage.completion_tokens
        assert result.model == remote_llm_engine.model_name == remote.model_name
        assert 0 <= result.timings.ttft_s <= result.timings.total_s


def test_raw_prompt_goes_to_completions(live, remote_llm_engine) -> None:
    request = GenerationRequest(prompt="The capital of France is", max_tokens=6)
    [result] = RemoteLLM(live.url).generate([request])
    [local] = remote_llm_engine.generate([request])
    assert result.text == local.text
    assert dataclasses.replace(result.usage, cached_tokens=0) == dataclasses.replace(local.usage, cached_tokens=0)


def test_stream_concatenates_to_the_reply(live, remote_llm_engine) -> None:
    request = _chat("Count to five.", max_tokens=16)
    deltas = list(RemoteLLM(live.url).stream(request))
    assert all(d.finish_reason is None for d in deltas[:-1])
    last = deltas[-1]
    assert last.finish_reason in ("stop", "length") and last.usage is not None
    [local] = remote_llm_engine.generate([request])
    assert "".join(d.text for d in deltas) == local.text
    assert last.usage.completion_tokens == local.usage.completion_tokens


async def test_async_generate_and_stream(live, remote_llm_engine) -> None:
    remote = RemoteLLM(live.url)
    request = _chat("Name a fruit.", max_tokens=10)
    [local] = remote_llm_engine.generate([request])
    results = await asyncio.gather(*(remote.agenerate(request) for _ in range(3)))
    assert {r.text for r in results} == {local.text}
    text = ""
    async for delta in remote.astream(request):
        text += delta.text
    assert text == local.text


def test_forced_tool_call_is_well_formed(live, remote_llm_engine) -> None:
    request = _chat("What is the weather in Paris?", tools=[WEATHER], tool_choice="get_weather",
                    parallel_tool_calls=False, max_tokens=48)
    [result] = RemoteLLM(live.url).generate([request])
    assert result.finish_reason == "tool_calls"
    [call] = result.tool_calls
    assert call.name == "get_weather" and isinstance(call.args.get("city"), str) and call.id
    [local] = remote_llm_engine.generate([request])
    assert [(c.name, c.args) for c in local.tool_calls] == [(call.name, call.args)]
    deltas = list(RemoteLLM(live.url).stream(request))
    pieces = [piece for d in deltas for piece in d.tool_calls]
    assert pieces[0].name == "get_weather" and pieces[0].id
    assert json.loads("".join(p.arguments for p in pieces)) == call.args
    # The call and its result go back to the server as a conversation.
    follow = GenerationRequest(
        messages=[{"role": "user", "content": "What is the weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [call.to_openai()]},
                  {"role": "tool", "content": "sunny, 21 C", "tool_call_id": call.id, "name": call.name}],
        tools=[WEATHER], max_tokens=12)
    [answer] = RemoteLLM(live.url).generate([follow])
    assert answer.finish_reason in ("stop", "length", "tool_calls")


def test_structured_output_follows_the_schema(live) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "price": {"type": "number"}},
              "required": ["name", "price"]}
    [result] = RemoteLLM(live.url).generate([_chat("A red dress for 40 euros.", response_format=schema, max_tokens=48)])
    value = json.loads(result.text)
    assert set(value) == {"name", "price"} and isinstance(value["price"], (int, float))
    [choice] = RemoteLLM(live.url).generate([_chat("Yes or no?", guided_choice=["yes", "no"], max_tokens=4)])
    assert choice.text in ("yes", "no")


def test_context_window_is_the_served_models(live, remote_llm_engine, dead_url) -> None:
    """The model list carries each model's length (as vLLM's does); the client reports the chat
    model's, capped by the one it was given."""
    import httpx

    cards = {card["id"]: card for card in httpx.get(live.url + "/v1/models").json()["data"]}
    assert cards[remote_llm_engine.model_name]["max_model_len"] == remote_llm_engine.context_window
    assert RemoteLLM(live.url).context_window == 2048  # nothing asked yet
    assert RemoteLLM(live.url).load().context_window == remote_llm_engine.context_window
    assert RemoteLLM(live.url, context_window=512).load().context_window == 512
    assert RemoteLLM(live.url, context_window=10**6).load().context_window == remote_llm_engine.context_window
    assert RemoteLLM(dead_url, context_window=300).context_window == 300  # no server: what was given


def test_count_tokens_matches_the_engine(live, remote_llm_engine) -> None:
    messages = [{"role": "user", "content": "How long is this prompt?"}]
    remote = RemoteLLM(live.url)
    assert remote.count_tokens(messages) == remote_llm_engine.count_tokens(messages)
    assert remote.count_tokens(messages, tools=[WEATHER]) == remote_llm_engine.count_tokens(messages, tools=[WEATHER])
    # a forced tool call changes the prompt's instructions: counted by the generation path, still exact
    forced = GenerationRequest(messages=messages, tools=[WEATHER], tool_choice="required")
    assert remote.count_tokens(forced) == remote_llm_engine.count_tokens(forced)
    # a history past the context window is counted too (LangChain's trim_messages counts exactly such a one)
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": "tell me about red cotton dresses " * 20}
            for i in range(21)]
    expected = remote_llm_engine.count_tokens(long)
    assert expected > remote_llm_engine.context_window
    assert remote.count_tokens(long) == expected
    assert remote.count_tokens("word " * 3000) == remote_llm_engine.count_tokens("word " * 3000)



def test_tokenize_and_detokenize_match_the_engine(live, remote_llm_engine) -> None:
    """vLLM's /tokenize and /detokenize: the ids the generation routes read, no generation slot used."""
    import httpx

    messages = [{"role": "user", "content": "How long is this prompt?"}]
    remote = RemoteLLM(live.url)
    assert remote.tokenize(messages) == remote_llm_engine.tokenize(messages)
    assert remote.tokenize(messages, tools=[WEATHER]) == remote_llm_engine.tokenize(messages, tools=[WEATHER])
    assert remote.tokenize("a raw prompt") == remote_llm_engine.tokenize("a raw prompt")
    ids = remote_llm_engine.tokenize("a red dress")
    assert remote.detokenize(ids) == remote_llm_engine.detokenize(ids) == "a red dress"
    before = remote_llm_engine.stats().requests
    assert remote.count_tokens(messages) == len(remote_llm_engine.tokenize(messages))
    assert remote_llm_engine.stats().requests == before  # counted by /tokenize, not by a generation
    answer = httpx.post(live.url + "/tokenize", json={"prompt": "a red dress", "return_token_strs": True}).json()
    assert answer["count"] == len(ids) and answer["tokens"] == ids
    assert answer["token_strs"] == remote_llm_engine.token_strs(ids)  # vocabulary pieces, as vLLM's
    assert len(answer["token_strs"]) == len(ids)
    assert answer["max_model_len"] == remote_llm_engine.context_window
    # vLLM's defaults: special tokens for a prompt, none on top of a chat template
    chat = httpx.post(live.url + "/tokenize", json={"messages": messages, "add_special_tokens": False}).json()
    assert chat["tokens"] == remote_llm_engine.tokenize(messages)
    for refused_body, param in [({"prompt": "x", "messages": messages}, "body"),
                                ({"messages": messages, "add_special_tokens": True}, "add_special_tokens"),
                                ({"prompt": "x", "add_special_tokens": False}, "add_special_tokens"),
                                ({"messages": messages, "chat_template": "{{ messages }}"}, "chat_template"),
                                ({"messages": messages, "continue_final_message": True}, "continue_final_message")]:
        refused = httpx.post(live.url + "/tokenize", json=refused_body)
        assert refused.status_code == 400, refused_body
        assert refused.json()["error"]["param"] == param, refused.json()
    with pytest.raises(InvalidInputError, match=r"tokens\[0\]"):
        remote.detokenize([-1])
    with pytest.raises(InvalidInputError, match="lone surrogate"):
        remote_llm_engine.tokenize("a \ud800 b")  # checked as a request's prompt is, never the tokenizer's TypeError


# ---------------------------------------------------------------------- errors
def test_refused_fields_come_back_typed(live) -> None:
    remote = RemoteLLM(live.url)
    with pytest.raises(InvalidInputError, match="logit_bias"):  # no such token in the served vocabulary
        remote.generate([_chat("Hi", logit_bias={999_999_999: 1.0}, max_tokens=2)])
    with pytest.raises(ContextLengthError) as too_long:
        remote.generate([_chat("word " * 5000, max_tokens=2)])
    assert too_long.value.prompt_tokens > too_long.value.max_context > 0
    with pytest.raises(InvalidInputError):  # the server takes at most 16 stop strings
        remote.generate([_chat("Hi", stop=[f"s{i}" for i in range(20)], max_tokens=2)])


def test_truncate_left_drops_the_oldest_turns_on_the_server_as_in_process(live, remote_llm_engine) -> None:
    """``truncate="left"`` travels as the request's ``truncate`` field (a RAGPipeline over a RemoteLLM
    sends it): the server drops the same turns the engine drops in process."""
    window = remote_llm_engine.context_window
    turns: list[dict[str, str]] = []
    for i in range(window // 150 + 2):
        turns += [{"role": "user", "content": f"Turn {i}: " + "word " * 200}, {"role": "assistant", "content": "ok"}]
    messages = [{"role": "system", "content": "Be brief."}, *turns, {"role": "user", "content": "Name a color."}]

    def ask(**options) -> GenerationRequest:
        return GenerationRequest(messages=messages, max_tokens=4, temperature=0.0, **options)

    remote = RemoteLLM(live.url)
    with pytest.raises(ContextLengthError):
        remote.generate([ask()])
    [far] = remote.generate([ask(truncate="left")])
    [near] = remote_llm_engine.generate([ask(truncate="left")])
    assert far.text == near.text and far.usage.prompt_tokens == near.usage.prompt_tokens <= window - 4


def test_vllm_end_of_reply_fields_travel_and_run_as_in_process(live, remote_llm_engine) -> None:
    """vLLM's end-of-reply fields (``ignore_eos``, ``min_tokens``, ``stop_token_ids``,
    ``include_stop_str_in_output``, ``skip_special_tokens``) reach the server's engine: a RemoteLLM
    gets the replies the engine gives in process."""
    short = [{"role": "user", "content": "Say just the word yes."}]
    cases = [{"ignore_eos": True}, {"min_tokens": 10}, {"ignore_eos": True, "stop_token_ids": [198]},
             {"stop": ["."], "include_stop_str_in_output": True}, {"ignore_eos": True, "skip_special_tokens": False}]
    requests = [GenerationRequest(messages=short, max_tokens=16, **case) for case in cases]
    far = RemoteLLM(live.url).generate(requests)
    near = remote_llm_engine.generate(requests)
    assert [(r.text, r.finish_reason, r.stop_reason, r.usage.completion_tokens) for r in far] == \
        [(r.text, r.finish_reason, r.stop_reason, r.usage.completion_tokens) for r in near]
    assert near[0].usage.completion_tokens == 16 and near[1].usage.completion_tokens >= 10


def test_wrong_api_key_is_an_engine_error_naming_the_key(live_keyed) -> None:
    with pytest.raises(EngineError, match="api_key"):
        RemoteEmbedder(live_keyed.url, api_key="wrong").embed(["x"])
    assert RemoteEmbedder(live_keyed.url, api_key="sesame").embed(["x"]).shape[0] == 1
    [result] = RemoteLLM(live_keyed.url, api_key="sesame").generate([_chat("Hi", max_tokens=2)])
    assert result.usage.completion_tokens >= 1


def test_dead_server_fails_fast_and_typed(dead_url) -> None:
    import time

    started = time.monotonic()
    with pytest.raises(EngineDeadError, match="could not connect"):
        RemoteEmbedder(dead_url, max_retries=1, backoff=0.05).embed(["x"])
    with pytest.raises(EngineDeadError):
        RemoteLLM(dead_url).generate([_chat("Hi", max_tokens=2)])
    with pytest.raises(EngineDeadError):
        list(RemoteLLM(dead_url).stream(_chat("Hi", max_tokens=2)))
    assert time.monotonic() - started < 10


async def test_hung_server_times_out_instead_of_hanging(silent_url) -> None:
    import time

    started = time.monotonic()
    with pytest.raises(RequestTimeoutError):
        RemoteEmbedder(silent_url, read_timeout=0.5, max_retries=0).embed(["x"])
    with pytest.raises(RequestTimeoutError):
        await RemoteEmbedder(silent_url, read_timeout=0.5, max_retries=0).aembed(["x"])
    with pytest.raises(RequestTimeoutError):
        await RemoteLLM(silent_url, read_timeout=0.5).agenerate(_chat("Hi", max_tokens=2))
    assert time.monotonic() - started < 10


def test_request_body_carries_every_field() -> None:
    from gpuprompt.remote._llm import request_body

    request = GenerationRequest(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}],
        tools=[WEATHER], tool_choice="get_weather", parallel_tool_calls=False, max_tokens=9, temperature=0.5,
        top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.2, logit_bias={7: -5.0}, seed=3, stop=["\n"],
        priority=-1, session_id="conversation-7", stop_token_ids=[5, 9],
    )
    path, body = request_body(request, "served/model")
    assert path == "/chat/completions" and body["stream"] is True and body["model"] == "served/model"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["tools"] == [WEATHER.to_openai()] and body["parallel_tool_calls"] is False
    assert {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                 "logit_bias", "seed", "stop", "priority")} == {
        "max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2,
        "logit_bias": {"7": -5.0}, "seed": 3, "stop": ["\n"], "priority": -1}
    assert body["stop_token_ids"] == [5, 9] and "min_tokens" not in body and "ignore_eos" not in body
    assert RemoteLLM("http://127.0.0.1:9")._prepare(request)[2] == {"X-Session-ID": "conversation-7"}
    _, regex = request_body(GenerationRequest(prompt="Code:", guided_regex="[0-9]{3}", min_tokens=2,
                                              skip_special_tokens=False))
    assert regex["prompt"] == "Code:" and regex["guided_regex"] == "[0-9]{3}" and "messages" not in regex
    assert regex["min_tokens"] == 2 and regex["skip_special_tokens"] is False


def test_error_mapping_inverts_the_server() -> None:
    def body(code: str, message: str = "m", param: str | None = None) -> dict:
        return {"error": {"message": message, "type": "x", "param": param, "code": code}}

    assert isinstance(error_from_status(503, body("unavailable")), EngineDeadError)
    assert type(error_from_status(503, body("other"))) is EngineError
    assert isinstance(error_from_status(500, body("RequestTimeoutError")), RequestTimeoutError)
    assert isinstance(error_from_status(500, body("ModelLoadError")), ModelLoadError)
    assert type(error_from_status(500, body("SomethingElse"))) is EngineError
    unsupported = error_from_status(400, body("unsupported_parameter", param="top_k"))
    assert isinstance(unsupported, UnsupportedFeatureError) and unsupported.field == "top_k"
    context = error_from_status(400, body("context_length_exceeded", "the prompt has 3000 tokens but the context "
                                          "window of 'm' is 2048 tokens (...)"))
    assert isinstance(context, ContextLengthError) and (context.prompt_tokens, context.max_context) == (3000, 2048)
    bad_filter = error_from_status(400, body("invalid_filter", "bad op (at filter path $.a)"))
    assert isinstance(bad_filter, FilterError) and bad_filter.path == "$.a"
    assert str(bad_filter).count("filter path") == 1
    queue_full = error_from_status(429, body("queue_full"), {"retry-after": "2"})
    assert isinstance(queue_full, QueueFullError) and queue_full.retry_after == 2.0
    # a storage outage on the server (Redis / Milvus): 503, and the client keeps its type
    assert isinstance(error_from_status(503, body("SessionStoreError")), SessionStoreError)
    assert isinstance(error_from_status(503, body("VectorStoreError")), VectorStoreError)


def test_server_storage_outages_are_503_and_bad_json_never_500() -> None:
    import json

    from gpuprompt.server.errors import error_response, validation_message
    from pydantic import BaseModel, ValidationError

    for error in (SessionStoreError("the session store at redis://h failed"), VectorStoreError("Milvus failed")):
        answer = error_response(error, retry_after_s=3)
        body = json.loads(answer.body)["error"]
        assert answer.status_code == 503 and answer.headers["retry-after"] == "3"
        assert body["code"] == type(error).__name__ and "model failed" not in body["message"]

    class Body(BaseModel):
        q: str

    for raw in ("", "garbage", '{"q": 1'):  # model_validate_json (the Ray Serve app) reports no location
        with pytest.raises(ValidationError) as caught:
            Body.model_validate_json(raw)
        message, param, malformed = validation_message(caught.value.errors())
        assert malformed and param is None and "not valid JSON" in message


def test_config_and_env_resolution() -> None:
    assert resolve_remote(None, None, owner="X", environ={}) is None
    env = {"GPUPROMPT_URL": "http://h:1", "GPUPROMPT_API_KEY": "s3cret"}
    config = resolve_remote(None, None, owner="X", environ=env)
    assert config == RemoteConfig(base_url="http://h:1", api_key="s3cret") and config.root == "http://h:1/v1"
    assert "s3cret" not in repr(config)
    assert "tok" not in repr(RemoteConfig(base_url="http://user:tok@h:1/v1"))
    with pytest.raises(ConfigurationError, match="api_key"):
        resolve_remote(None, "k", owner="X", environ={})
    with pytest.raises(ConfigurationError, match=r"\['device'\].*GPUPROMPT_URL"):
        resolve_remote(None, None, owner="X", local_options={"device": ("cpu", "auto")},
                       environ={"GPUPROMPT_URL": "http://h:1"})
    for url in ("h:1", "ftp://h", "http://", " "):
        with pytest.raises(ConfigurationError, match="base_url"):
            RemoteConfig(base_url=url)
    with pytest.raises(ConfigurationError, match="read_timeout"):
        RemoteConfig(base_url="http://h:1", read_timeout=0)
