"""The gate in front of the routes: API key (401), body size (413), admission control (429)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from server_helpers import LiveServer, start_server, wait_until

KEY = "s3cret-key"
LIMIT = 4096


@pytest.fixture(scope="module")
def guarded(embedder, server_llm) -> Iterator[LiveServer]:
    server = start_server(
        embedder=embedder, llm=server_llm, api_key=KEY, max_body_bytes=LIMIT, max_in_flight=1, retry_after_s=7
    )
    yield server
    server.stop()


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_health_needs_no_key(guarded) -> None:
    with guarded.client() as http:
        response = http.get("/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}, {"x-api-key": "nope"}],
)
def test_missing_or_wrong_key_is_401(guarded, headers) -> None:
    with guarded.client() as http:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/embeddings"), ("GET", "/metrics")):
            response = http.request(method, path, headers=headers, json={"input": "x"} if method == "POST" else None)
            assert response.status_code == 401, (path, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
            error = response.json()["error"]
            assert error["type"] == "authentication_error"
            assert "Authorization: Bearer" in error["message"]


def test_right_key_in_any_supported_header_passes(guarded) -> None:
    with guarded.client() as http:
        for headers in (_auth(), {"api-key": KEY}, {"x-api-key": KEY}):
            assert http.get("/v1/models", headers=headers).status_code == 200


def test_openai_client_with_and_without_the_key(guarded, embedder) -> None:
    bad = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.embeddings.create(model=embedder.model_id, input="x")
    good = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0)
    assert len(good.embeddings.create(model=embedder.model_id, input="x").data[0].embedding) == embedder.dim


def test_body_over_the_limit_is_413_by_content_length(guarded) -> None:
    body = json.dumps({"input": ["word " * 100] * 10}).encode()
    assert len(body) > LIMIT
    with guarded.client() as http:
        response = http.post("/v1/embeddings", content=body, headers={**_auth(), "content-type": "application/json"})
    assert response.status_code == 413
    error = response.json()["error"]
    assert f"at most {LIMIT} bytes" in error["message"]
    assert str(len(body)) in error["message"]
    assert error["code"] == "request_too_large"


def test_body_over_the_limit_is_413_when_streamed_without_length(guarded) -> None:
    body = json.dumps({"input": ["word " * 100] * 10}).encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    with guarded.client() as http:
        response = http.post("/v1/embeddings", content=chunks(), headers={**_auth(), "content-type": "application/json"})
    assert response.status_code == 413
    assert f"at most {LIMIT} bytes" in response.json()["error"]["message"]


def test_chunked_body_under_the_limit_is_served(guarded) -> None:
    body = json.dumps({"input": ["a small text"]}).encode()
    with guarded.client() as http:
        response = http.post(
            "/v1/embeddings", content=iter([body[:10], body[10:]]), headers={**_auth(), "content-type": "application/json"}
        )
    assert response.status_code == 200, response.text


def test_over_max_in_flight_is_429_with_retry_after(guarded) -> None:
    slow = {"messages": [{"role": "user", "content": "Tell me a long story about a dress."}], "max_tokens": 200,
            "temperature": 0, "stream": True}
    with guarded.client() as http, guarded.client() as other:
        with http.stream("POST", "/v1/chat/completions", json=slow, headers=_auth()) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")  # the stream holds the only slot now
            refused = other.post("/v1/embeddings", json={"input": "x"}, headers=_auth())
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "7"
            assert refused.json()["error"]["type"] == "rate_limit_error"
            # The unversioned routes TEI, vLLM and Cohere clients call are model requests too.
            for path in ("/rerank", "/v2/rerank", "/score", "/tokenize"):
                assert other.post(path, json={}, headers=_auth()).status_code == 429, path
            # Reads are not model requests: they are still served.
            assert other.get("/v1/models", headers=_auth()).status_code == 200
        # Closing the stream frees the slot (the server notices the disconnect).
        assert wait_until(lambda: other.post("/v1/embeddings", json={"input": "x"}, headers=_auth()).status_code == 200)
