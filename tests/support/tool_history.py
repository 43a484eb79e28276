"""LangChain message lists with tool calls and tool results, and the projection a chat history must
give back unchanged: shared by the in-process and the remote differential tests against
LangChain's own ``InMemoryChatMessageHistory``."""

from __future__ import annotations

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

DIFFERENTIAL: dict[str, list[BaseMessage]] = {
    "plain": [SystemMessage("You sell clothes."), HumanMessage("Hi!"), AIMessage("Hello, how can I help?")],
    "issue": [AIMessage(content="", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c1"}]),
              ToolMessage(content="42", tool_call_id="c1")],
    "parallel-calls": [
        HumanMessage("Price and stock of the Aurora dress?"),
        AIMessage("Let me look both up.", tool_calls=[
            {"name": "price", "args": {"sku": "AUR-1", "currency": "EUR"}, "id": "call_a"},
            {"name": "stock", "args": {"sku": "AUR-1", "sizes": ["S", "M"], "nested": {"deep": [1.5, None, True]}},
             "id": "call_b"}]),
        ToolMessage("49.0", tool_call_id="call_a", name="price"),
        ToolMessage("stock service timed out", tool_call_id="call_b", name="stock", status="error"),
        AIMessage("It costs 49 EUR; stock is unknown right now."),
        HumanMessage('naïve 日本 \n {"json": 1}'),
    ],
    "empty-result": [AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": "x"}]),
                     ToolMessage("", tool_call_id="x", name="lookup", status="success"),
                     AIMessage("nothing found")],
}


def shape(messages: list[BaseMessage]) -> list[tuple]:
    """What a history must give back: the types, the content, the calls (name, args, id) and the
    tool-result fields (tool_call_id, name, status)."""
    out = []
    for m in messages:
        calls = [(c["name"], c["args"], c["id"]) for c in getattr(m, "tool_calls", [])]
        out.append((type(m).__name__, m.content, calls, getattr(m, "tool_call_id", None), m.name,
                    getattr(m, "status", None)))
    return out
