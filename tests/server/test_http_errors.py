"""Every client error over raw HTTP: the status, and an OpenAI-style body naming the field at fault."""

from __future__ import annotations

from typing import Any

import pytest

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Hi"}]


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return error


def test_malformed_json_is_400(http) -> None:
    error = _error(http.post(CHAT, content=b'{"messages": [', headers={"content-type": "application/json"}), 400)
    assert "not valid JSON" in error["message"]
    assert error["code"] == "invalid_json"


def test_a_body_not_sent_as_json_is_400(http) -> None:
    error = _error(http.post(CHAT, content=b"messages=hi", headers={"content-type": "text/plain"}), 400)
    assert "Content-Type: application/json" in error["message"]


def test_a_body_that_is_not_an_object_is_400(http) -> None:
    error = _error(http.post(CHAT, json=[1, 2]), 400)
    assert "JSON object" in error["message"]


@pytest.mark.parametrize(
    ("payload", "param", "fragment"),
    [
        ({"model": "x"}, "messages", "'messages' is required"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "'robot'"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "'messages[0].content'"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content", "text only"),
        ({"messages": USER, "temperature": 3}, "temperature", "'temperature' must be a finite number"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens", "'max_tokens' must be an int"),
        ({"messages": USER, "n": 0}, "n", "'n'"),
        ({"messages": USER, "stop": ["x"] * 17}, "stop", "at most 16"),
        ({"messages": USER, "response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ],
)
def test_bad_chat_fields_are_400_naming_the_field(http, payload, param, fragment) -> None:
    # OpenAI and vLLM answer 400 for a request that fails validation (not FastAPI's 422).
    error = _error(http.post(CHAT, json=payload), 400)
    assert error["param"] == param
    assert fragment in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("payload", "param", "fragment"),
    [
        ({"messages": USER, "stream": True, "n": 2}, "n", "'n' must be 1"),
        ({"messages": USER, "logprobs": True}, "logprobs", "'logprobs'"),
        ({"messages": USER, "top_p": 0}, "top_p", "'top_p'"),
    ],
)
def test_requests_the_engine_cannot_serve_are_400(http, payload, param, fragment) -> None:
    error = _error(http.post(CHAT, json=payload), 400)
    assert error["param"] == param
    assert fragment in error["message"]


def test_embedding_input_errors(http, embedder) -> None:
    error = _error(http.post("/v1/embeddings", json={"input": []}), 400)
    assert error["param"] == "input"
    assert "at least one text" in error["message"]
    error = _error(http.post("/v1/embeddings", json={}), 400)
    assert error["param"] == "input"
    error = _error(http.post("/v1/embeddings", json={"input": [[15339, 200000]]}), 400)
    assert error["param"] == "input"
    assert "check_embedding_ctx_length=False" in error["message"]
    error = _error(http.post("/v1/embeddings", json={"input": "x", "dimensions": 1536}), 400)
    assert error["param"] == "dimensions"
    assert str(embedder.dim) in error["message"]
    error = _error(http.post("/v1/embeddings", json={"input": "x", "encoding_format": "int8"}), 400)
    assert error["param"] == "encoding_format"
    error = _error(http.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"}), 404)
    assert error["code"] == "model_not_found"



@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('{"input": ["a", null]}', "'input[1]' must be a string like the first item"),
        ('{"input": [true]}', "'input[0]' must be a string"),  # a bool is not a token id
        ('{"input": [15339, true]}', "'input[1]' must be a token id"),
        ('{"input": ["a", "\\ud800"]}', "'input[1]' must be valid Unicode"),
        ('{"input": [[15339], [1, "x"]]}', "'input[1]' must be a list of token ids"),
    ],
)
def test_a_bad_embedding_input_item_is_named_once(http, body: str, named: str) -> None:
    error = _error(http.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json"}), 400)
    assert error["param"].startswith("input")
    assert named in error["message"] and "valid integer" not in error["message"], error["message"]


def test_unknown_routes_and_methods(http) -> None:
    assert _error(http.get("/v1/nothing-here"), 404)["code"] == "404"
    assert _error(http.get(CHAT), 405)["code"] == "405"
    error = _error(http.get("/v1/models/gpt-4"), 404)
    assert error["code"] == "model_not_found"


def test_collection_errors(http) -> None:
    error = _error(http.post("/v1/collections/never-made/query", json={"query": "red"}), 404)
    assert error["code"] == "collection_not_found"
    assert "POST /v1/collections/never-made/documents" in error["message"]
    _error(http.post("/v1/collections/never-made/chat", json={"session_id": "s", "question": "q"}), 404)
    error = _error(http.post("/v1/collections/bad name!/documents", json={"documents": ["x"]}), 400)
    assert error["param"] == "name"
    error = _error(http.post("/v1/collections/c1/documents", json={"documents": ["a", "b"], "ids": ["1"]}), 400)
    assert "'ids' must hold one id per document (2) (got 1)" in error["message"]
    assert error["param"] == "ids"
    error = _error(http.post("/v1/collections/c1/documents", json={"documents": ["a"], "extra": 1}), 400)
    assert error["param"] == "extra"
    # None of the rejected calls created the collection.
    assert "c1" not in [c["name"] for c in http.get("/v1/collections").json()["data"]]
