"""An explicit JSON ``null`` in an optional OpenAI request field means the same as leaving it out.

OpenAI's spec marks its optional request fields nullable, and hand-written integrations and some
SDKs send ``null`` for "the default". Such a field takes its default (never None where the default
is not None); non-null values keep their checks, and required fields still refuse ``null`` with a
400 in OpenAI's error shape.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from gpuprompt.server.schemas import EmbeddingRequest
from gpuprompt.server.schemas.chat import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    FunctionCall,
    FunctionDefinition,
    JSONSchemaSpec,
    NamedToolChoice,
    ResponseFormat,
    StreamOptions,
    ToolCallIn,
    ToolDefinition,
)
from pydantic import BaseModel, ValidationError

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBED = "/v1/embeddings"
USER = [{"role": "user", "content": "Hi"}]

# The smallest valid body of each model: the baseline a null field is compared against.
_BASES: dict[type[BaseModel], dict[str, Any]] = {
    ChatCompletionRequest: {"messages": USER},
    CompletionRequest: {"prompt": "Hi"},
    EmbeddingRequest: {"input": "hello"},
    ChatMessage: {"role": "user", "content": "Hi"},
    StreamOptions: {},
    ResponseFormat: {"type": "text"},
    JSONSchemaSpec: {"schema": {"type": "object"}},
    ToolDefinition: {"function": {"name": "f"}},
    FunctionDefinition: {"name": "f"},
    NamedToolChoice: {"function": {"name": "f"}},
    ToolCallIn: {"id": "call_1", "function": {"name": "f"}},
    FunctionCall: {"name": "f"},
}

# The fields the bug report names: each must stay optional (a rename would silently skip it below).
_REPORTED: dict[type[BaseModel], set[str]] = {
    ChatCompletionRequest: {
        "temperature",
        "top_p",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "stream",
        "top_k",
        "min_p",
        "repetition_penalty",
        "priority",
        "seed",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "logit_bias",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "stream_options",
        "user",
        "logprobs",
    },
    CompletionRequest: {
        "temperature",
        "top_p",
        "n",
        "echo",
        "stream",
        "best_of",
        "suffix",
        "logprobs",
        "seed",
        "stop",
        "max_tokens",
    },
    EmbeddingRequest: {"encoding_format", "dimensions", "user", "model"},
    StreamOptions: {"include_usage"},
}


def _key(model: type[BaseModel], name: str) -> str:
    info = model.model_fields[name]
    return info.alias or name


def _optional_cases() -> list[Any]:
    cases = []
    for model in _BASES:
        for name, info in model.model_fields.items():
            if not info.is_required():
                cases.append(pytest.param(model, _key(model, name), id=f"{model.__name__}.{name}"))
    return cases


def _required_cases() -> list[Any]:
    cases = []
    for model, base in _BASES.items():
        for name, info in model.model_fields.items():
            if info.is_required():
                key = _key(model, name)
                assert key in base, (model, key)
                cases.append(pytest.param(model, key, id=f"{model.__name__}.{name}"))
    return cases


def _post(http: httpx.Client, path: str, payload: dict[str, Any]) -> httpx.Response:
    return http.post(path, content=json.dumps(payload).encode(), headers={"content-type": "application/json"})


def _bad_request(response: httpx.Response, param: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None and error["param"].startswith(param), error
    assert f"'{param}" in error["message"], error
    return error


def _comparable(payload: dict[str, Any]) -> dict[str, Any]:
    """A response body without the fields that differ from one request to the next (ids, times,
    and the prompt tokens the prefix cache served, which depend on what ran before)."""
    body = {k: v for k, v in payload.items() if k not in ("id", "created")}
    if isinstance(body.get("usage"), dict):
        body["usage"] = {k: v for k, v in body["usage"].items() if k != "prompt_tokens_details"}
    return body


# ---------------------------------------------------------------------------------------- schemas
def test_every_reported_field_is_optional() -> None:
    for model, names in _REPORTED.items():
        for name in names:
            assert name in model.model_fields, (model.__name__, name)
            assert not model.model_fields[name].is_required(), (model.__name__, name)


@pytest.mark.parametrize(("model", "key"), _optional_cases())
def test_null_parses_exactly_as_an_omitted_field(model: type[BaseModel], key: str) -> None:
    base = {k: v for k, v in _BASES[model].items() if k != key}
    omitted = model.model_validate(base)
    nulled = model.model_validate({**base, key: None})
    assert nulled.model_dump() == omitted.model_dump()
    name = next(n for n in model.model_fields if _key(model, n) == key)
    assert getattr(nulled, name) == model.model_fields[name].get_default(call_default_factory=True)


def test_all_nulls_at_once_parse_as_the_defaults() -> None:
    for model, base in _BASES.items():
        nulls = {_key(model, n): None for n, info in model.model_fields.items() if not info.is_required()}
        required = {k: v for k, v in base.items() if k not in nulls}
        nulled = model.model_validate({**required, **nulls})
        assert nulled.model_dump() == model.model_validate(required).model_dump()


def test_null_defaults_are_the_values_downstream_code_expects() -> None:
    chat = ChatCompletionRequest.model_validate(
        {
            "messages": USER,
            "temperature": None,
            "top_p": None,
            "n": None,
            "presence_penalty": None,
            "frequency_penalty": None,
            "stream": None,
            "top_k": None,
            "min_p": None,
            "repetition_penalty": None,
            "priority": None,
            "stream_options": {"include_usage": None},
            "max_tokens": 4,
        }
    )
    assert (chat.temperature, chat.top_p, chat.n, chat.stream, chat.priority) == (1.0, 1.0, 1, False, 0)
    assert (chat.top_k, chat.min_p, chat.presence_penalty, chat.frequency_penalty) == (0, 0.0, 0.0, 0.0)
    assert chat.repetition_penalty == 1.0
    assert chat.stream_options is not None and chat.stream_options.include_usage is False
    assert (
        chat.sampling_options()
        == ChatCompletionRequest.model_validate({"messages": USER, "max_tokens": 4}).sampling_options()
    )
    completion = CompletionRequest.model_validate({"prompt": "Hi", "echo": None, "stream": None, "n": None})
    assert (completion.echo, completion.stream, completion.n) == (False, False, 1)
    embedding = EmbeddingRequest.model_validate({"input": "x", "encoding_format": None, "dimensions": None})
    assert (embedding.encoding_format, embedding.dimensions) == ("float", None)


def test_nested_nulls_take_their_defaults() -> None:
    chat = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": "Hi", "name": None},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "call_1", "type": None, "function": {"name": "f", "arguments": None}}],
                },
                {"role": "tool", "content": "1", "tool_call_id": "call_1"},
            ],
            "tools": [{"type": None, "function": {"name": "f", "description": None, "parameters": None}}],
            "tool_choice": {"type": None, "function": {"name": "f"}},
        }
    )
    call = chat.messages[1].tool_calls[0]
    assert (call.type, call.function.arguments) == ("function", "{}")
    assert chat.tools[0].core() == {"type": "function", "function": {"name": "f"}}
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.tool_choice.type == "function"


@pytest.mark.parametrize(("model", "key"), _required_cases())
def test_required_fields_still_refuse_null(model: type[BaseModel], key: str) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate({**_BASES[model], key: None})
    assert caught.value.errors()[0]["loc"][0] == key


@pytest.mark.parametrize(
    ("model", "payload"),
    [
        (ChatCompletionRequest, {"messages": USER, "temperature": "0.5"}),
        (ChatCompletionRequest, {"messages": USER, "temperature": 2.5}),
        (ChatCompletionRequest, {"messages": USER, "top_p": -0.1}),
        (ChatCompletionRequest, {"messages": USER, "n": 0}),
        (ChatCompletionRequest, {"messages": USER, "n": True}),
        (ChatCompletionRequest, {"messages": USER, "stream": "maybe"}),
        (ChatCompletionRequest, {"messages": USER, "priority": 1.5}),
        (ChatCompletionRequest, {"messages": USER, "stop": ""}),
        (ChatCompletionRequest, {"messages": USER, "stop": [None]}),
        (ChatCompletionRequest, {"messages": USER, "max_tokens": 0}),
        (ChatCompletionRequest, {"messages": [None]}),
        (CompletionRequest, {"prompt": "Hi", "echo": "maybe"}),
        (CompletionRequest, {"prompt": [None]}),
        (EmbeddingRequest, {"input": "x", "encoding_format": "int8"}),
        (EmbeddingRequest, {"input": "x", "dimensions": 0}),
        (EmbeddingRequest, {"input": [None]}),
    ],
)
def test_non_null_values_keep_their_checks(model: type[BaseModel], payload: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(payload)


# ---------------------------------------------------------------------------------------- live HTTP
def test_the_reported_chat_request_is_served_as_without_the_nulls(http) -> None:
    # The body of the bug report, seeded: temperature null is the default 1.0, so sampling is on.
    nulls = {"temperature": None, "top_p": None, "n": None, "presence_penalty": None, "stream": None}
    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 7}
    with_nulls = _post(http, CHAT, {**base, **nulls})
    without = _post(http, CHAT, base)
    assert with_nulls.status_code == 200, with_nulls.text
    assert without.status_code == 200, without.text
    assert with_nulls.headers["content-type"].startswith("application/json")  # stream null: not SSE
    assert _comparable(with_nulls.json()) == _comparable(without.json())


def test_every_optional_chat_field_may_be_null(http) -> None:
    base = {"messages": USER, "max_tokens": 3, "temperature": 0}
    nulls = {
        _key(ChatCompletionRequest, n): None
        for n, info in ChatCompletionRequest.model_fields.items()
        if not info.is_required() and _key(ChatCompletionRequest, n) not in base
    }
    with_nulls = _post(http, CHAT, {**base, **nulls})
    without = _post(http, CHAT, base)
    assert with_nulls.status_code == 200, with_nulls.text
    assert _comparable(with_nulls.json()) == _comparable(without.json())


def test_every_optional_completion_field_may_be_null(http) -> None:
    base = {"prompt": "The three primary colours are", "max_tokens": 3, "temperature": 0}
    nulls = {
        _key(CompletionRequest, n): None
        for n, info in CompletionRequest.model_fields.items()
        if not info.is_required() and _key(CompletionRequest, n) not in base
    }
    with_nulls = _post(http, COMPLETIONS, {**base, **nulls})
    without = _post(http, COMPLETIONS, base)
    assert with_nulls.status_code == 200, with_nulls.text
    assert _comparable(with_nulls.json()) == _comparable(without.json())
    # null temperature / max_tokens: the defaults, as when left out (seeded, so comparable)
    seeded = {"prompt": "Hi", "seed": 3, "max_tokens": 2}
    with_nulls = _post(http, COMPLETIONS, {**seeded, "temperature": None, "top_p": None, "echo": None})
    assert with_nulls.status_code == 200, with_nulls.text
    assert _comparable(with_nulls.json()) == _comparable(_post(http, COMPLETIONS, seeded).json())


def test_null_embedding_options_are_the_defaults(http) -> None:
    base = {"input": ["hello", "a red dress"]}
    with_nulls = _post(http, EMBED, {**base, "encoding_format": None, "dimensions": None, "user": None, "model": None})
    without = _post(http, EMBED, base)
    assert with_nulls.status_code == 200, with_nulls.text
    assert with_nulls.json() == without.json()
    assert isinstance(with_nulls.json()["data"][0]["embedding"], list)  # "float", the default


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        (CHAT, {"messages": None, "max_tokens": 1}, "messages"),
        (COMPLETIONS, {"prompt": None, "max_tokens": 1}, "prompt"),
        (EMBED, {"input": None}, "input"),
        (CHAT, {"messages": [{"role": None, "content": "Hi"}], "max_tokens": 1}, "messages[0].role"),
    ],
)
def test_required_fields_sent_as_null_are_400(http, path: str, payload: dict[str, Any], param: str) -> None:
    _bad_request(_post(http, path, payload), param)


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        (CHAT, {"messages": USER, "temperature": 3}, "temperature"),
        (CHAT, {"messages": USER, "n": 17}, "n"),
        (CHAT, {"messages": USER, "logprobs": True}, "logprobs"),
        (COMPLETIONS, {"prompt": "Hi", "logprobs": 1}, "logprobs"),
        (COMPLETIONS, {"prompt": "Hi", "best_of": 2}, "best_of"),
        (EMBED, {"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ],
)
def test_non_null_values_are_still_refused_over_http(http, path: str, payload: dict[str, Any], param: str) -> None:
    _bad_request(_post(http, path, {"max_tokens": 1, **payload} if path != EMBED else payload), param)
