"""ContextCache with tool calls: turns carry calls and results exactly, through MemoryStore and the
record format (old records included); what is embedded and counted; windows keep a call and its
results together (both or neither) and never return a result whose call is gone."""

from __future__ import annotations

import itertools
import json
import struct

import numpy as np
import pytest

from gpuprompt import ContextCache
from gpuprompt.context._types import memory_text
from gpuprompt.context._window import select_units
from gpuprompt.context.stores import MemoryStore, TurnRecord
from gpuprompt.context.stores._protocol import decode_record, encode_record
from gpuprompt.errors import InputTypeError, InvalidInputError, SnapshotError
from gpuprompt.llm import GenerationRequest, ToolCall


def call(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


SHOP = [
    {"role": "system", "content": "You are the shop's assistant."},
    {"role": "user", "content": "Where is my order 4417?"},
    {"role": "assistant", "content": "", "tool_calls": [call("c1", "order_status", {"order_id": 4417})]},
    {"role": "tool", "content": "shipped yesterday from the Oslo warehouse", "tool_call_id": "c1",
     "name": "order_status", "status": "success"},
    {"role": "assistant", "content": "Your order shipped yesterday from Oslo."},
    {"role": "user", "content": "Do you sell leather hiking boots, and at what price?"},
    {"role": "assistant", "content": "Let me check both.",
     "tool_calls": [call("c2", "stock", {"item": "boots"}), call("c3", "price", {"item": "boots", "cur": "EUR"})]},
    {"role": "tool", "content": "12 pairs in stock", "tool_call_id": "c2", "name": "stock"},
    {"role": "tool", "content": "price service unavailable", "tool_call_id": "c3", "name": "price",
     "status": "error"},
    {"role": "assistant", "content": "We have 12 pairs; the price is not available right now."},
    {"role": "user", "content": "Can I pay with a gift card?"},
]


@pytest.fixture
def shop(embedder) -> ContextCache:
    cache = ContextCache(embedder)
    cache.extend("s", SHOP)
    return cache


def _check_units(window, turns) -> None:
    """Every call in the window has all its results there, and every result its call."""
    kept = {t.index for t in window}
    for turn in turns:
        if turn.tool_calls and turn.index in kept:
            ids = {c.id for c in turn.tool_calls}
            results = {t.index for t in turns if t.role == "tool" and t.tool_call_id in ids}
            assert results <= kept, (turn.index, kept)
        if turn.role == "tool" and turn.index in kept:
            callers = [t.index for t in turns if any(c.id == turn.tool_call_id for c in t.tool_calls)]
            assert callers and callers[-1] in kept, (turn.index, kept)


# ---------------------------------------------------------------------------------------- turns
def test_messages_round_trip_exactly(shop: ContextCache) -> None:
    turns = shop.turns("s")
    assert [t.as_message() for t in turns] == SHOP
    assert turns[2].tool_calls == (ToolCall("c1", "order_status", '{"order_id": 4417}'),)
    assert (turns[3].tool_call_id, turns[3].name, turns[3].status) == ("c1", "order_status", "success")
    assert turns[7].status is None and turns[8].status == "error"
    # A stored conversation is a valid request, tool turns included.
    GenerationRequest(messages=[t.as_message() for t in turns])
    # Plain turns keep their plain message.
    assert turns[1].as_message() == {"role": "user", "content": "Where is my order 4417?"}


def test_what_is_embedded_and_counted_includes_the_calls(embedder, shop: ContextCache) -> None:
    turns = shop.turns("s")
    assert memory_text(turns[2]) == 'order_status({"order_id": 4417})'
    assert memory_text(turns[6]) == 'Let me check both.\nstock({"item": "boots"})\nprice({"item": "boots", "cur": "EUR"})'
    assert memory_text(turns[3]) == turns[3].text
    assert [t.tokens for t in turns] == embedder.count_tokens([memory_text(t) for t in turns], truncate=False)
    session = shop._sessions["s"]
    expected = embedder.embed_tensor([memory_text(turns[2])])[0].to(session.vectors.device)
    assert float((session.vectors[2] - expected).abs().max()) < 1e-5


def test_call_forms_and_append_of_a_message(embedder) -> None:
    cache = ContextCache(embedder)
    stored = cache.extend("s", [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "name": "f", "arguments": {"x": 1}}]},
        {"role": "assistant", "tool_calls": [ToolCall("b", "g", "{}")]},
        ("user", "a pair still works"),
    ])
    assert stored[0].text == "" and stored[0].tool_calls == (ToolCall("a", "f", '{"x": 1}'),)
    assert stored[1].tool_calls == (ToolCall("b", "g", "{}"),)
    turn = cache.append("s", {"role": "tool", "content": "1", "tool_call_id": "a"})
    assert (turn.role, turn.text, turn.tool_call_id, turn.name, turn.status) == ("tool", "1", "a", None, None)
    assert cache.append("s", "user", "plain").as_message() == {"role": "user", "content": "plain"}
    # A call without an id gets a stable one: the same history gives the same prompt every time.
    first = cache.extend("t", [{"role": "assistant", "tool_calls": [{"name": "f", "arguments": "{}"}]}])
    again = cache.extend("u", [{"role": "assistant", "tool_calls": [{"name": "f", "arguments": "{}"}]}])
    assert first[0].tool_calls[0].id == again[0].tool_calls[0].id


BAD_TURNS = [
    ({"role": "user", "content": "x", "tool_calls": [call("c", "f", {})]}, InvalidInputError,
     "turns[0]['tool_calls']' is set on a 'user' turn"),
    ({"role": "assistant", "content": "x", "tool_call_id": "c"}, InvalidInputError, "turns[0]['tool_call_id']"),
    ({"role": "user", "content": "x", "status": "success"}, InvalidInputError, "turns[0]['status']"),
    ({"role": "tool", "content": "x", "status": "failed"}, InvalidInputError, "'turns[0]['status']' must be one of"),
    ({"role": "tool", "content": "x", "status": 1}, InputTypeError, "turns[0]['status']"),
    ({"role": "tool", "content": "x", "tool_call_id": ""}, InvalidInputError, "turns[0]['tool_call_id']"),
    ({"role": "tool", "content": "x", "tool_call_id": 7}, InputTypeError, "turns[0]['tool_call_id']"),
    ({"role": "tool", "content": "x", "name": "bad name!"}, InvalidInputError, "turns[0]['name']"),
    ({"role": "assistant", "content": "", "tool_calls": "f()"}, InputTypeError, "turns[0]['tool_calls']"),
    ({"role": "assistant", "content": "", "tool_calls": [call("c", "bad name!", {})]}, InvalidInputError,
     "turns[0]['tool_calls'][0].name"),
    ({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "f", "arguments": "[1]"}]},
     InvalidInputError, "turns[0]['tool_calls'][0].arguments"),
    ({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "f", "arguments": '{"a": "\ud800"}'}]},
     InvalidInputError, "turns[0]['tool_calls'][0].arguments"),
    ({"role": "assistant", "content": "", "tool_calls": [call(f"c{i}", "f", {}) for i in range(129)]},
     InvalidInputError, "at most 128 calls"),
    ({"role": "assistant", "tool_calls": []}, InputTypeError, "'role' and 'content'"),
    ({"role": "user", "content": None, "tool_calls": [call("c", "f", {})]}, InputTypeError, "turns[0]['content']"),
]


@pytest.mark.parametrize(("turn", "error", "fragment"), BAD_TURNS)
def test_bad_tool_fields_are_refused_and_store_nothing(embedder, turn, error, fragment) -> None:
    cache = ContextCache(embedder)
    cache.append("s", "user", "kept")
    with pytest.raises(error) as caught:
        cache.extend("s", [turn])
    assert fragment in str(caught.value)
    assert [t.text for t in cache.turns("s")] == ["kept"]


def test_a_participant_name_on_a_plain_turn_is_ignored_as_in_a_request(embedder) -> None:
    cache = ContextCache(embedder)
    turn = cache.append("s", {"role": "user", "content": "hi", "name": "ana"})
    assert turn.as_message() == {"role": "user", "content": "hi"}


# ---------------------------------------------------------------------------------------- windows
QUERIES = [None, "Where is my order, has it shipped?", "boots price and stock", "gift card payment"]


def test_windows_keep_a_call_and_its_results_together(shop: ContextCache) -> None:
    turns = shop.turns("s")
    seen = set()
    for query, max_turns, recent, max_tokens in itertools.product(
        QUERIES, range(0, 13), [None, 0, 1, 2, 5], [None, 0, 15, 40, 10_000]
    ):
        window = shop.window("s", query=query, max_turns=max_turns, max_tokens=max_tokens, recent=recent)
        assert len(window) <= max_turns
        assert max_tokens is None or sum(t.tokens for t in window) <= max_tokens
        assert window == sorted(window, key=lambda t: t.index)
        _check_units(window, turns)
        seen.add(tuple(t.index for t in window))
    assert len(seen) > 20  # the grid really varied the windows


def test_window_units_by_recency_relevance_and_tokens(shop: ContextCache) -> None:
    # Latest first: the gift card question, the answer before it, then the boots unit of 3 turns.
    assert [t.index for t in shop.window("s", max_turns=2)] == [9, 10]
    assert [t.index for t in shop.window("s", max_turns=4)] == [9, 10]  # the unit of 3 does not fit: stop
    assert [t.index for t in shop.window("s", max_turns=5)] == [6, 7, 8, 9, 10]
    assert [t.index for t in shop.window("s", max_turns=6)] == [5, 6, 7, 8, 9, 10]
    # Relevance: the order question pulls in the call and its result, as one unit.
    picked = [t.index for t in shop.window("s", query="Where is my order, has it shipped?", max_turns=4, recent=1)]
    assert 10 in picked and {2, 3} <= set(picked)
    # A token budget drops a unit whole.
    full = shop.window("s", query="boots price and stock", max_turns=6, recent=1)
    assert {5, 6, 7} <= {t.index for t in full}
    budget = sum(t.tokens for t in full) - 1
    trimmed = shop.window("s", query="boots price and stock", max_turns=6, recent=1, max_tokens=budget)
    assert sum(t.tokens for t in trimmed) <= budget
    _check_units(trimmed, shop.turns("s"))


def test_a_result_whose_call_was_dropped_is_never_windowed(embedder) -> None:
    cache = ContextCache(embedder, max_turns_per_session=3)
    cache.extend("s", [SHOP[1], SHOP[2], SHOP[3]])  # question, call, result
    cache.append("s", "user", "Thanks! And the invoice?")  # the cap drops the question
    assert [t.index for t in cache.window("s", max_turns=10)] == [1, 2, 3]
    cache.append("s", "assistant", "The invoice is in your inbox.")  # ... and now the call
    assert [t.role for t in cache.turns("s")] == ["tool", "user", "assistant"]  # still listed
    for query in (None, "shipped yesterday from the Oslo warehouse"):
        assert [t.index for t in cache.window("s", query=query, max_turns=10, recent=0)] == [3, 4]
    # A result never stored with a call: the same.
    cache.extend("t", [("user", "hi"), {"role": "tool", "content": "x", "tool_call_id": "nope"}])
    assert [t.text for t in cache.window("t", query="x", max_turns=5)] == ["hi"]


def test_results_join_their_call_by_id_or_by_position(embedder) -> None:
    cache = ContextCache(embedder)
    cache.extend("s", [
        {"role": "assistant", "content": "", "tool_calls": [call("a", "f", {})]},
        ("user", "while you look, one more thing"),
        {"role": "tool", "content": "result of a", "tool_call_id": "a"},  # by id, after another turn
        {"role": "assistant", "content": "", "tool_calls": [call("b", "g", {})]},
        {"role": "tool", "content": "id-less result of b"},  # by position: right after its call
        ("user", "and?"),
        {"role": "tool", "content": "id-less, after a user turn"},  # no call before it: never windowed
    ])
    assert [t.index for t in cache.window("s", max_turns=10)] == [0, 1, 2, 3, 4, 5]
    assert [t.index for t in cache.window("s", max_turns=3)] == [3, 4, 5]
    assert [t.index for t in cache.window("s", max_turns=2)] == [5]


def test_without_tool_turns_units_choose_as_the_plain_path(embedder, memory_chat) -> None:
    """The grouped selection with one-turn units agrees with ContextCache's plain path on every budget."""
    cache, chat = memory_chat
    turns = cache.turns("s")
    assert not cache._sessions["s"].tools
    vectors = embedder.embed_tensor([t.text for t in turns])
    for query in QUERIES:
        scores = None
        if query is not None:
            scores = (vectors @ embedder.embed_tensor([query])[0]).tolist()
        for max_turns, recent, max_tokens in itertools.product(range(1, 9), [None, 0, 1, 3], [None, 12, 30]):
            plain = [t.index for t in cache.window("s", query=query, max_turns=max_turns, max_tokens=max_tokens,
                                                   recent=recent)]
            units = [[i] for i in range(len(turns))]
            assert select_units(turns, units, scores, max_turns, max_tokens, recent) == plain, (query, max_turns)


@pytest.fixture
def memory_chat(embedder):
    chat = [("user", "I'm looking for a red summer dress."),
            ("assistant", "The Aurora dress is red, 100% cotton, and costs 49 euros."),
            ("user", "Do you deliver to Norway?"), ("assistant", "Yes, delivery to Norway takes four days."),
            ("user", "Can I pay with an invoice?"), ("assistant", "Invoices are available for orders above 100 euros."),
            ("user", "Do you sell gift cards?")]
    cache = ContextCache(embedder)
    cache.extend("s", chat)
    return cache, chat


# ---------------------------------------------------------------------------------------- stores
def test_tool_turns_round_trip_through_a_memory_store(embedder) -> None:
    store = MemoryStore()
    a, b = ContextCache(embedder, store=store), ContextCache(embedder, store=store)
    written = a.extend("s", SHOP)
    assert b.turns("s") == written == a.turns("s")
    assert [t.as_message() for t in b.turns("s")] == SHOP
    assert b.window("s", query="boots", max_turns=5) == a.window("s", query="boots", max_turns=5)
    _check_units(b.window("s", query="boots", max_turns=5), written)


def test_record_with_tool_fields_round_trips_and_a_plain_one_keeps_the_old_bytes() -> None:
    vector = np.array([0.5, -1.0, 2.0, 0.25], dtype="<f4").tobytes()
    calls = (ToolCall("c1", "f", '{"x": 1, "s": "naïve"}'), ToolCall("c2", "g", "{}"))
    for record in (
        TurnRecord("assistant", "", 3, 1_764_700_000.5, vector, tool_calls=calls),
        TurnRecord("tool", "42", 1, 1_764_700_000.5, vector, tool_call_id="c1", name="f", status="error"),
        TurnRecord("tool", "42", 1, 1_764_700_000.5, vector),
    ):
        back = decode_record(encode_record(record), 9, 4)
        assert back == TurnRecord(record.role, record.text, record.tokens, record.created_at, vector, 9,
                                  record.tool_calls, record.tool_call_id, record.name, record.status)
    # A turn without tool fields is written byte for byte as before they existed ...
    header = b'{"role":"user","text":"hi","tokens":1,"created_at":1764700000.5}'
    old = struct.pack("<BI", 1, len(header)) + header + vector
    assert encode_record(TurnRecord("user", "hi", 1, 1_764_700_000.5, vector)) == old
    # ... and such a record, stored before the change, loads as a turn without them.
    assert decode_record(old, 0, 4) == TurnRecord("user", "hi", 1, 1_764_700_000.5, vector, 0)


@pytest.mark.parametrize(
    "extra",
    [
        ',"tool_calls":{"id":"c"}',
        ',"tool_calls":[{"id":"c","name":"f"}]',
        ',"tool_calls":[{"id":"c","name":"bad name","arguments":"{}"}]',
        ',"tool_calls":[{"id":"c","name":"f","arguments":"[]"}]',
        ',"tool_calls":["c"]',
        ',"status":"maybe"',
        ',"tool_call_id":5',
        ',"name":""',
    ],
)
def test_damaged_tool_fields_are_refused(extra) -> None:
    header = ('{"role":"tool","text":"x","tokens":1,"created_at":1.5' + extra + "}").encode()
    with pytest.raises(SnapshotError, match="stored turn 2"):
        decode_record(struct.pack("<BI", 1, len(header)) + header + bytes(16), 2, 4)


def test_a_store_refuses_malformed_tool_fields_before_writing() -> None:
    store = MemoryStore()
    vector = bytes(16)
    for record, error in (
        (TurnRecord("assistant", "", 1, 1.0, vector, tool_calls=[ToolCall("c", "f", "{}")]), InputTypeError),
        (TurnRecord("tool", "", 1, 1.0, vector, status="ok"), InvalidInputError),
        (TurnRecord("tool", "", 1, 1.0, vector, tool_call_id=""), InvalidInputError),
    ):
        with pytest.raises(error, match=r"records\[0\]"):
            store.append("s", [record], embedder="e", dim=4)
    assert store.load("s") is None
