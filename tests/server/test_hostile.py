"""Hostile requests over raw HTTP: no input a schema can reject reaches the core as a 500.

Every refused request gets 400 in OpenAI's error shape (never FastAPI's 422), naming the field;
errors (400s and 500s alike) keep the client's keep-alive connection open; collections are capped
in number and size, start no thread until searched, and close their index when deleted.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from server_helpers import LiveServer, metric_samples, start_server, wait_until

from gpuprompt.batching import PRIORITY_MAX, PRIORITY_MIN

CHAT = "/v1/chat/completions"
EMBED = "/v1/embeddings"
USER = [{"role": "user", "content": "Hi"}]
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
NAN = float("nan")
INF = float("inf")


# ---------------------------------------------------------------------------------------- helpers
def _post(http: httpx.Client, path: str, payload: Any) -> httpx.Response:
    """POST ``payload`` as a hostile client would: ``json.dumps`` writes NaN / Infinity literals and
    escapes lone surrogates as ``\\ud800`` (httpx's own ``json=`` refuses both)."""
    return http.post(path, content=json.dumps(payload).encode(), headers={"content-type": "application/json"})


def _raw(http: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return http.post(path, content=body, headers={"content-type": "application/json"})


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI error object of ``response``, after checking its status and shape."""
    assert response.status_code == status, response.text
    body = response.json()  # always valid JSON (and UTF-8), even when the input was not
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


def _bad_request(response: httpx.Response, param: str | None = None) -> dict[str, Any]:
    error = _error(response, 400)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param), (error, param)
    return error


def _deep_list(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _deep_dict(depth: int, key: str = "a") -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {key: value}
    return value


def _deep_filter(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"price": {"$lt": 100}}
    for _ in range(depth):
        value = {"$not": value}
    return value


def _local_port(response: httpx.Response) -> int:
    """The client-side port of the connection that carried ``response``."""
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


def _collections(http: httpx.Client) -> dict[str, int]:
    return {c["name"]: c["count"] for c in http.get("/v1/collections").json()["data"]}


def _search_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "gpuprompt-index-search" and t.is_alive())


# ---------------------------------------------------------------------------------------- 1. bounds
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 2**70),
        ("seed", -(2**70)),
        ("seed", INT64_MAX + 1),
        ("priority", 10**30),
        ("priority", -(10**30)),
        ("priority", PRIORITY_MAX + 1),
        ("max_tokens", 2**31),
        ("max_tokens", 10**30),
        ("max_tokens", True),
        ("max_tokens", 1.5),
        ("max_completion_tokens", 10**30),
        ("n", 10**30),
        ("n", 17),
        ("temperature", NAN),
        ("temperature", INF),
        ("temperature", 1e308),
        ("temperature", "0.5"),
        ("top_p", -INF),
        ("top_p", NAN),
    ],
)
def test_out_of_range_numbers_are_400_not_500(http, field: str, value: Any) -> None:
    error = _bad_request(_post(http, CHAT, {"messages": USER, "max_tokens": 1, field: value}), field)
    assert f"'{field}'" in error["message"]
    assert error["code"] == "invalid_value"


def test_the_edges_of_every_range_are_served(http) -> None:
    base = {"messages": USER, "max_tokens": 1, "temperature": 1.0}
    for extra in (
        {"seed": INT64_MAX, "n": 2},  # choice 1 uses seed + 1: it wraps inside int64
        {"seed": INT64_MIN},
        {"seed": -1},
        {"priority": PRIORITY_MIN},
        {"priority": PRIORITY_MAX},
        {"temperature": 2.0, "top_p": 1.0},
    ):
        response = _post(http, CHAT, {**base, **extra})
        assert response.status_code == 200, (extra, response.text)


def test_the_openai_client_gets_a_bad_request_error(openai_client) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.chat.completions.create(model="x", messages=USER, max_tokens=1, seed=2**70)
    assert raised.value.status_code == 400


# ---------------------------------------------------------------------------------------- 2. strings
@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]}, "messages[0].name"),
        ({"messages": USER, "model": "\ud800"}, "model"),
        ({"messages": USER, "stop": ["ok", "\ud800"]}, "stop"),
        ({"messages": USER, "stop": "\ud800"}, "stop"),
        ({"messages": USER, "stop": [""]}, "stop"),
        ({"messages": USER, "user": "\udc00"}, "user"),
        ({"messages": USER, "tools": [{"type": "function", "function": {"name": "\ud800"}}]}, "tools"),
    ],
)
def test_lone_surrogates_in_chat_strings_are_400(http, payload: dict[str, Any], param: str) -> None:
    _bad_request(_post(http, CHAT, {"max_tokens": 1, **payload}), param)


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"input": "\ud800"}, "input"),
        ({"input": ["fine", "bad \udfff"]}, "input"),
        ({"input": "x", "model": "\ud800"}, "model"),
        ({"input": "x", "user": "\ud800"}, "user"),
        ({"input": "x", "dimensions": 10**30}, "dimensions"),
        ({"input": "x", "dimensions": True}, "dimensions"),
        ({"input": [[10**30]]}, "input"),
        ({"input": {"text": "x"}}, "input"),
        ({"input": [None]}, "input"),
    ],
)
def test_hostile_embedding_requests_are_400(http, payload: dict[str, Any], param: str) -> None:
    _bad_request(_post(http, EMBED, payload), param)


# ---------------------------------------------------------------------------------------- 3. nesting
def test_deep_json_schema_and_tools_are_400(http) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": _deep_dict(600)}}
    error = _bad_request(_post(http, CHAT, {"messages": USER, "response_format": schema}), "response_format")
    assert "nested at most" in error["message"]
    _bad_request(_post(http, CHAT, {"messages": USER, "tools": [_deep_dict(600)]}), "tools")
    nan_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"maximum": NAN}}}
    _bad_request(_post(http, CHAT, {"messages": USER, "response_format": nan_schema}), "response_format")


def test_a_filter_600_deep_is_400_not_a_recursion_error(http) -> None:
    docs = {"documents": ["a red dress"], "ids": ["d1"], "metadatas": [{"price": 49}]}
    assert _post(http, "/v1/collections/hostile-filter/documents", docs).status_code == 200
    for depth in (33, 600):  # (json.dumps in this client cannot write much deeper)
        deep = _deep_filter(depth)
        error = _bad_request(
            _post(http, "/v1/collections/hostile-filter/query", {"query": "x", "filter": deep}), "filter"
        )
        assert "nested at most" in error["message"]
        chat = {"session_id": "s", "question": "q", "filter": deep, "max_tokens": 1}
        _bad_request(_post(http, "/v1/collections/hostile-filter/chat", chat), "filter")
    # A filter that is merely odd is a FilterError (400 invalid_filter), not a 500.
    for odd in ({"price": {"$lt": NAN}}, {"price": {"$lt": 10**30}}, {"$and": "x"}, {"$or": []}, {"\ud800": 1}):
        response = _post(http, "/v1/collections/hostile-filter/query", {"query": "x", "filter": odd})
        assert response.status_code in (200, 400), (odd, response.text)
        if response.status_code == 400:
            _bad_request(response, "filter")


@pytest.mark.parametrize(
    ("metadata", "fragment"),
    [
        ({"big": 2**70}, "64 bits"),
        ({"nan": NAN}, "finite"),
        ({"inf": -INF}, "finite"),
        ({"deep": _deep_dict(600)}, "nested at most"),
        ({"deep": _deep_list(600)}, "nested at most"),
        ({"\ud800": 1}, "Unicode"),
        ({"text": "x\udfffy"}, "Unicode"),
        ({"list": [1, "\ud800"]}, "Unicode"),
    ],
)
def test_metadata_must_be_json_representable(http, metadata: dict[str, Any], fragment: str) -> None:
    payload = {"documents": ["a"], "ids": ["m1"], "metadatas": [metadata]}
    error = _bad_request(_post(http, "/v1/collections/hostile-meta/documents", payload), "metadatas[0]")
    assert fragment in error["message"]
    assert "hostile-meta" not in _collections(http)  # nothing was created


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        ("documents", {"documents": ["\ud800"]}, "documents[0]"),
        ("documents", {"documents": ["a"], "ids": ["\ud800"]}, "ids[0]"),
        ("documents", {"documents": ["a"], "ids": [""]}, "ids[0]"),
        ("documents", {"documents": ["a"], "ids": ["x" * 257]}, "ids[0]"),
        ("documents", {"documents": []}, "documents"),
        ("documents", {"documents": ["a"] * 2049}, "documents"),
        ("documents", {"documents": "a"}, "documents"),
        ("documents", {"documents": [{"text": "a"}]}, "documents[0]"),
        ("documents", {"documents": ["a"], "metadatas": "x"}, "metadatas"),
        ("documents", {"documents": ["a"], "metadatas": [[1]]}, "metadatas[0]"),
        ("documents/delete", {"ids": ["\ud800"]}, "ids[0]"),
        ("documents/delete", {"ids": []}, "ids"),
        ("query", {"query": "\ud800"}, "query"),
        ("query", {"query": ""}, "query"),
        ("query", {"query": "x", "k": 10**30}, "k"),
        ("query", {"query": "x", "k": True}, "k"),
        ("query", {"query": "x", "filter": [1]}, "filter"),
        ("chat", {"session_id": "\ud800", "question": "q"}, "session_id"),
        ("chat", {"session_id": "s" * 257, "question": "q"}, "session_id"),
        ("chat", {"session_id": "s", "question": "\udfff"}, "question"),
        ("chat", {"session_id": "s", "question": "q", "k": 10**30}, "k"),
        ("chat", {"session_id": "s", "question": "q", "max_tokens": 10**30}, "max_tokens"),
        ("chat", {"session_id": "s", "question": "q", "max_tokens": NAN}, "max_tokens"),
    ],
)
def test_hostile_collection_requests_are_400(http, path: str, payload: dict[str, Any], param: str) -> None:
    _bad_request(_post(http, f"/v1/collections/hostile-fields/{path}", payload), param)
    assert "hostile-fields" not in _collections(http)


# ---------------------------------------------------------------------------------------- 4. raw bodies
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,  # past json.loads' recursion limit
        b'{"messages": ' + b"1" * 5000 + b"}",  # past Python's 4300-digit int limit
        b"\xff\xfe\x00{}",  # not UTF-8
        b'{"messages": [' + b'{"a":' * 20_000,
        b"NaN",
        b"null",
        b'"\\ud800"',
        b"{}" * 3,
    ],
)
def test_unreadable_bodies_are_400(http, body: bytes) -> None:
    for path in (CHAT, EMBED, "/v1/collections/hostile-raw/documents", "/v1/collections/hostile-raw/query"):
        _bad_request(_raw(http, path, body))


@pytest.mark.parametrize("body", [b"[" * 100_000, b"\xff\xfe", b"1" * 5000, b'{"input": "x"}'])
def test_bodies_not_sent_as_json_are_400(http, body: bytes) -> None:
    response = http.post(EMBED, content=body, headers={"content-type": "text/plain"})
    error = _bad_request(response)
    assert error["code"] == "invalid_json"
    assert "Content-Type: application/json" in error["message"]


def test_an_error_that_quotes_a_lone_surrogate_still_renders(http) -> None:
    # The unknown key is echoed in the message and param: it is escaped, not a UnicodeEncodeError.
    body = b'{"documents": ["x"], "\\ud800": 1}'
    error = _bad_request(_raw(http, "/v1/collections/hostile-raw/documents", body))
    assert "\\ud800" in error["message"]
    response = _raw(
        http,
        "/v1/collections/hostile-raw/documents",
        b'{"documents": ["x"], "metadatas": [{"a": 1}], "ids": ["i"], "x": {"\\udfff": [1]}}',
    )
    _bad_request(response)


def test_a_huge_string_within_the_body_limit_is_not_a_500(http) -> None:
    huge = "word " * 400_000  # 2 MB
    response = _post(http, CHAT, {"messages": [{"role": "user", "content": huge}], "max_tokens": 1})
    error = _bad_request(response, "messages")
    assert error["code"] == "context_length_exceeded"
    # in the server's terms: the library's truncate='left' is not a request field
    assert "--max-model-len" in error["message"] and "truncate" not in error["message"]


@pytest.mark.parametrize("field", ["stream", "echo", "logprobs", "parallel_tool_calls"])
@pytest.mark.parametrize("value", ["yes", 1, "false"])
def test_a_true_false_field_takes_only_true_or_false(http, field: str, value) -> None:
    route = "/v1/completions" if field == "echo" else CHAT
    body = {"prompt": "Hi"} if field == "echo" else {"messages": [{"role": "user", "content": "Hi"}]}
    response = _post(http, route, {**body, "max_tokens": 1, field: value})
    assert field in (_bad_request(response)["param"] or "")


# ---------------------------------------------------------------------------------------- 5. names
@pytest.mark.parametrize(
    "name", ["%00", "%2e%2e", "..", ".hidden", "-x", "a%2Fb", "%F0%9F%98%80", "%ED%A0%80", "c%00", "a" * 65, "a%20b"]
)
def test_odd_collection_names_are_refused_not_500(http, name: str) -> None:
    for method, path, payload in (
        ("POST", f"/v1/collections/{name}/documents", {"documents": ["x"]}),
        ("POST", f"/v1/collections/{name}/query", {"query": "x"}),
        ("POST", f"/v1/collections/{name}/chat", {"session_id": "s", "question": "q"}),
        ("DELETE", f"/v1/collections/{name}", None),
        ("DELETE", f"/v1/collections/{name}/sessions/s", None),
    ):
        response = http.request(method, path, json=payload)
        if not response.request.url.path.startswith("/v1/collections/"):
            # The client resolved '..' into another route (/v1/sessions/s): no collection was named.
            assert response.status_code < 500, (method, path, response.text)
            continue
        # 400 when the name reaches the route; 404/405 when the path no longer matches one.
        assert response.status_code in (400, 404, 405), (method, path, response.text)
        _error(response, response.status_code)
    assert all(n[0].isalnum() for n in _collections(http))


def test_session_ids_in_paths_are_bounded(http) -> None:
    assert _post(http, "/v1/collections/hostile-session/documents", {"documents": ["x"]}).status_code == 200
    _bad_request(http.delete("/v1/collections/hostile-session/sessions/" + "s" * 257), "session_id")
    assert http.delete("/v1/collections/hostile-session/sessions/%ED%A0%80").status_code == 200


# ---------------------------------------------------------------------------------------- 6. fuzz
_HOSTILE: list[Any] = [
    None,
    True,
    -1,
    0,
    2**70,
    -(2**70),
    1e308,
    NAN,
    INF,
    "",
    "\ud800",
    "x" * 5000,
    [],
    [[]],
    {},
    [None],
    ["\ud800"],
    [""],
    {"\ud800": 1},
    {"$and": []},
    [2**70],
    [NAN],
    {"a": NAN},
    3.5,
    "5",
    _deep_list(600),
    _deep_dict(600),
    ["x"] * 3000,
]
_ROUTES: dict[str, tuple[dict[str, Any], list[str]]] = {
    CHAT: (
        {"messages": USER, "max_tokens": 1, "temperature": 0},
        [
            "seed",
            "priority",
            "n",
            "top_p",
            "stop",
            "stream_options",
            "response_format",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "logprobs",
            "max_completion_tokens",
            "model",
            "user",
            "top_k",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "logit_bias",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "functions",
            "metadata",
        ],
    ),
    "/v1/completions": (
        {"prompt": "Hi", "max_tokens": 1, "temperature": 0},
        ["echo", "n", "best_of", "suffix", "logprobs", "stop", "seed", "top_k", "logit_bias", "stream"],
    ),
    EMBED: ({"input": "hello"}, ["model", "dimensions", "encoding_format", "user"]),
    "/v1/collections/hostile-fuzz/documents": ({"documents": ["x"], "ids": ["i1"], "metadatas": [{"a": 1}]}, []),
    "/v1/collections/hostile-fuzz/documents/delete": ({"ids": ["zz"]}, []),
    "/v1/collections/hostile-fuzz/query": ({"query": "dress", "k": 2, "filter": {"p": 1}}, []),
    "/v1/collections/hostile-fuzz/chat": ({"session_id": "s", "question": "dress?", "max_tokens": 1, "k": 1}, []),
}


def test_no_hostile_field_value_is_a_500(http) -> None:
    docs = {"documents": ["a red dress", "blue jeans"], "metadatas": [{"p": 1}, {"p": 2}]}
    assert _post(http, "/v1/collections/hostile-fuzz/documents", docs).status_code == 200
    failures = []
    for path, (base, extra) in _ROUTES.items():
        for field in [*base, *extra]:
            for value in _HOSTILE:
                if field == "max_tokens" and value in (None, True):
                    continue  # valid: would generate the server's default answer length
                response = _post(http, path, {**base, field: value})
                if response.status_code >= 500 or response.status_code == 422:
                    failures.append((path, field, repr(value)[:40], response.status_code, response.text[:200]))
                elif response.status_code >= 400:
                    _error(response, response.status_code)
    for value in _HOSTILE:
        for key in ("role", "content", "name"):
            message = {"role": "user", "content": "Hi", key: value}
            response = _post(http, CHAT, {"messages": [message], "max_tokens": 1, "temperature": 0})
            if response.status_code >= 500:
                failures.append(("message", key, repr(value)[:40], response.status_code, response.text[:200]))
        for payload in (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": value}]}], "max_tokens": 1},
            {
                "messages": USER,
                "max_tokens": 1,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": value}},
            },
        ):
            response = _post(http, CHAT, payload)
            if response.status_code >= 500:
                failures.append(("chat", "nested", repr(value)[:40], response.status_code, response.text[:200]))
        for path, payload in (
            ("documents", {"documents": ["x"], "metadatas": [{"k": value}]}),
            ("query", {"query": "x", "filter": {"p": value}}),
            ("query", {"query": "x", "filter": {"p": {"$gt": value}}}),
            ("query", {"query": "x", "filter": {"p": {"$in": value}}}),
        ):
            response = _post(http, f"/v1/collections/hostile-fuzz/{path}", payload)
            if response.status_code >= 500:
                failures.append((path, "nested", repr(value)[:40], response.status_code, response.text[:200]))
    assert not failures, failures


# ---------------------------------------------------------------------------------------- 7. keep-alive
def test_errors_keep_the_connection_alive(live, monkeypatch) -> None:
    from gpuprompt.errors import EngineError

    state = live.state

    async def crash(texts: list[str]) -> list[int]:
        raise RuntimeError("an unexpected bug")

    with live.client() as http:
        port = _local_port(http.get("/v1/models"))
        ports = {port}
        _bad_request(_post(http, CHAT, {"messages": USER, "seed": 2**70}), "seed")  # 400 (validation)
        ports.add(_local_port(http.get("/v1/models")))
        _error(http.post("/v1/collections/never-made-here/query", json={"query": "x"}), 404)  # ApiError
        ports.add(_local_port(http.get("/v1/models")))
        monkeypatch.setattr(state, "count_tokens", crash)
        response = http.post(EMBED, json={"input": "keep-alive probe"})
        error = _error(response, 500)  # an unexpected exception: a JSON 500, details only in the log
        assert error["type"] == "server_error"
        assert "an unexpected bug" not in error["message"]
        assert response.headers.get("connection", "").lower() != "close"
        ports.add(_local_port(response))
        ports.add(_local_port(http.get("/v1/models")))

        async def engine_failure(texts: list[str]) -> list[int]:
            raise EngineError("the backend failed")

        monkeypatch.setattr(state, "count_tokens", engine_failure)
        error = _error(http.post(EMBED, json={"input": "keep-alive probe"}), 500)
        assert error["code"] == "EngineError"
        monkeypatch.undo()
        after = http.get("/v1/models")
        assert after.status_code == 200
        ports.add(_local_port(after))
    assert ports == {port}, "an error response closed the connection: the client had to reconnect"


def test_an_unexpected_500_is_counted_in_the_metrics(live, monkeypatch) -> None:
    async def crash(texts: list[str]) -> list[int]:
        raise RuntimeError("an unexpected bug")

    def served_500s(http: httpx.Client) -> float:
        key = ("gpuprompt_http_requests_total", (("method", "POST"), ("route", "/v1/embeddings"), ("status", "500")))
        return metric_samples(http).get(key, 0.0)

    with live.client() as http:
        before = served_500s(http)
        monkeypatch.setattr(live.state, "count_tokens", crash)
        assert http.post(EMBED, json={"input": "metrics probe"}).status_code == 500
        monkeypatch.undo()
        assert served_500s(http) == before + 1


# ---------------------------------------------------------------------------------------- 8. caps
@pytest.fixture(scope="module")
def capped(embedder, server_llm) -> Iterator[LiveServer]:
    """A server holding at most 2 collections of at most 5 records each."""
    server = start_server(embedder=embedder, llm=server_llm, max_collections=2, max_collection_records=5)
    yield server
    server.stop()


@pytest.fixture()
def small(capped: LiveServer) -> Iterator[httpx.Client]:
    """A client of the capped server, which starts each test with no collection."""
    with capped.client() as http:
        for name in _collections(http):
            assert http.delete(f"/v1/collections/{name}").status_code == 200
        yield http


def _add(http: httpx.Client, name: str, ids: list[str]) -> httpx.Response:
    return http.post(f"/v1/collections/{name}/documents", json={"documents": [f"text {i}" for i in ids], "ids": ids})


def test_the_number_of_collections_is_capped(small, capped) -> None:
    assert _add(small, "one", ["a"]).status_code == 200
    assert _add(small, "two", ["a"]).status_code == 200
    response = _add(small, "three", ["a"])
    error = _error(response, 409)
    assert error["code"] == "collection_limit_reached"
    assert "2 collections" in error["message"] and "max_collections" in error["message"]
    assert response.headers["x-should-retry"] == "false"  # the openai client must not retry it
    assert set(_collections(small)) == {"one", "two"}
    assert _add(small, "one", ["b"]).status_code == 200  # existing collections still take records
    assert small.delete("/v1/collections/two").status_code == 200
    assert _add(small, "three", ["a"]).status_code == 200
    assert set(_collections(small)) == {"one", "three"}
    assert len(capped.state.collections) == 2


def test_concurrent_creations_never_pass_the_cap(small, capped) -> None:
    def create(i: int) -> int:
        with capped.client() as http:
            return _add(http, f"race-{i}", ["a"]).status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(create, range(8)))
    assert sorted(statuses) == [200, 200] + [409] * 6
    assert len(_collections(small)) == 2


def test_the_records_of_a_collection_are_capped(small) -> None:
    assert _add(small, "full", ["1", "2", "3", "4"]).status_code == 200
    error = _error(_add(small, "full", ["5", "6"]), 409)
    assert error["code"] == "collection_full"
    assert "5 records" in error["message"] and "max_collection_records" in error["message"]
    assert _collections(small)["full"] == 4  # nothing was stored
    # Replacing records takes no room: 4 replaced + 1 new fits exactly.
    response = _add(small, "full", ["1", "2", "3", "4", "5"])
    assert response.status_code == 200, response.text
    assert response.json()["count"] == 5
    assert _error(_add(small, "full", ["6"]), 409)["code"] == "collection_full"
    assert _add(small, "full", ["5"]).status_code == 200
    deleted = small.post("/v1/collections/full/documents/delete", json={"ids": ["1"]}).json()
    assert deleted["count"] == 4
    assert _add(small, "full", ["6"]).status_code == 200


def test_a_refused_first_upsert_leaves_no_collection(small, capped) -> None:
    error = _error(_add(small, "too-big", ["1", "2", "3", "4", "5", "6"]), 409)
    assert error["code"] == "collection_full"
    assert "too-big" not in _collections(small)
    assert len(capped.state.collections) == 0


def test_indexes_start_no_thread_until_searched_and_close_when_deleted(small, capped) -> None:
    before = _search_threads()
    assert _add(small, "lazy", ["1", "2"]).status_code == 200
    assert _add(small, "lazy-too", ["1"]).status_code == 200
    assert _search_threads() == before  # upserts alone start no search thread
    index = capped.state.collections.get("lazy").index
    assert small.post("/v1/collections/lazy/query", json={"query": "text", "k": 1}).status_code == 200
    assert _search_threads() == before + 1
    assert small.delete("/v1/collections/lazy").status_code == 200
    assert wait_until(lambda: _search_threads() == before)  # its batcher thread ended
    from gpuprompt.errors import ClosedError

    with pytest.raises(ClosedError):
        index.search([[1.0] * index.dim], 1)  # the dropped index was closed


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"max_collections": -1}, "'max_collections' must be an int >= 0"),
        ({"max_collections": True}, "'max_collections'"),
        ({"max_collection_records": 0}, "'max_collection_records' must be an int >= 1"),
        ({"max_collection_records": 1.5}, "'max_collection_records'"),
    ],
)
def test_bad_collection_limits_are_configuration_errors(options: dict[str, Any], fragment: str) -> None:
    from gpuprompt.errors import ConfigurationError
    from gpuprompt.server import ServerConfig

    with pytest.raises(ConfigurationError) as info:
        ServerConfig(**options)
    assert fragment in str(info.value)
    defaults = ServerConfig()
    assert (defaults.max_collections, defaults.max_collection_records) == (64, 1_000_000)
