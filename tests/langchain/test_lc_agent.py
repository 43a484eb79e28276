"""LangChain v1 ``create_agent`` over ChatGPUPrompt: a real tool loop (two tools, three model
steps) ending in a structured answer (``response_format=Schema``), on both backends.

What is tested is the protocol, not the model's judgement. The bundled SmolLM2-135M calls tools
poorly when left to choose, so the agent's steps are fixed by the ``tool_choice`` it uses, set per
step by a ``wrap_model_call`` middleware (LangChain's own hook for this): step 1 must call
``lookup_order``, step 2 must call ``shipping_eta`` (one call each, ``parallel_tool_calls=False``),
step 3 must answer (``tool_choice="none"``) under the response format. The core decodes a forced
call under the tool's argument schema and the answer under ``OrderReport``'s schema, so the shapes
are guaranteed: every step checks a real round trip -- LangChain tool calls -> core tool calls ->
typed ``tool_calls`` -> the tools run -> ``ToolMessage`` results -> core ``tool`` turns with their
``tool_call_id`` -> the next step -> a JSON answer parsed into ``structured_response``. Which
order id or city the model puts in the arguments is its own judgement and is not asserted. The
schemas bound their values (an order number up to 99999, short strings): left unbounded, the
135M model writes digits until ``max_tokens`` ends the reply mid-call, and the grammar enforces
the bounds, so every reply completes.

Steps 1 and 2 unset the agent's response format (``request.override(response_format=None)``):
the core refuses a forced tool call together with a response format (a forced call has no prose
to format); step 3 keeps it, so the answer goes through ``ProviderStrategy`` -- the strategy
``create_agent`` picks because ``ChatGPUPrompt.profile["structured_output"]`` is True.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from langchain_gpuprompt import ChatGPUPrompt
from langchain_gpuprompt._chat_convert import core_messages

CALLS: list[tuple[str, dict[str, Any]]] = []


class OrderQuery(BaseModel):
    order_id: int = Field(ge=1, le=99999, description="the order number")


class CityQuery(BaseModel):
    city: str = Field(max_length=24, description="the city the parcel ships from")


@tool(args_schema=OrderQuery)
def lookup_order(order_id: int) -> str:
    """Look up an order by its number: where it ships from and its status."""
    CALLS.append(("lookup_order", {"order_id": order_id}))
    return f"Order {order_id}: packed, ships from Lyon today."


@tool(args_schema=CityQuery)
def shipping_eta(city: str) -> str:
    """Days a parcel takes to arrive from a city."""
    CALLS.append(("shipping_eta", {"city": city}))
    return "Parcels from that city arrive in 3 days."


class OrderReport(BaseModel):
    """The agent's final answer."""

    order_id: int = Field(ge=1, le=99999, description="the order number")
    status: str = Field(max_length=48, description="the order's status, in a few words")
    eta_days: int = Field(ge=0, le=60, description="days until delivery")


class ScriptedToolChoice(AgentMiddleware):
    """Fixes which step does what through ``tool_choice`` (see the module docstring)."""

    @staticmethod
    def _step(request: ModelRequest) -> ModelRequest:
        done = sum(1 for m in request.messages if isinstance(m, AIMessage) and m.tool_calls)
        settings = {**request.model_settings, "parallel_tool_calls": False}
        if done < 2:
            name = ("lookup_order", "shipping_eta")[done]
            return request.override(tool_choice=name, response_format=None, model_settings=settings)
        return request.override(model_settings={**request.model_settings, "tool_choice": "none"})

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        return handler(self._step(request))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        return await handler(self._step(request))


class ModelInputs(BaseCallbackHandler):
    """Records the messages each model step received."""

    def __init__(self) -> None:
        self.steps: list[list[BaseMessage]] = []

    def on_chat_model_start(self, serialized: Any, messages: list[list[BaseMessage]], **kwargs: Any) -> None:
        self.steps.append(list(messages[0]))


@pytest.fixture(params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def agent_model(request: pytest.FixtureRequest) -> ChatGPUPrompt:
    base = request.getfixturevalue("lc_chat" if request.param == "transformers" else "lc_chat_vllm")
    return base.model_copy(update={"max_tokens": 96})  # the session's engine, more room for JSON


QUESTION = "Where is my order 42 and when will it arrive? Check the order, then the shipping time."


def _check_run(result: dict[str, Any], inputs: ModelInputs) -> None:
    messages = result["messages"]
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage", "ToolMessage", "AIMessage"], kinds
    first, second, answer = messages[1], messages[3], messages[5]
    assert [c["name"] for c in first.tool_calls] == ["lookup_order"]
    assert [c["name"] for c in second.tool_calls] == ["shipping_eta"]
    assert isinstance(first.tool_calls[0]["args"]["order_id"], int)
    assert isinstance(second.tool_calls[0]["args"]["city"], str)
    # The tools really ran, with the model's arguments, and their results were linked to the calls.
    assert CALLS == [("lookup_order", first.tool_calls[0]["args"]), ("shipping_eta", second.tool_calls[0]["args"])]
    assert messages[2].tool_call_id == first.tool_calls[0]["id"] and messages[2].content.startswith("Order ")
    assert messages[4].tool_call_id == second.tool_calls[0]["id"]
    for message in (first, second):
        assert message.response_metadata["finish_reason"] == "tool_calls"
        assert message.response_metadata["model_provider"] == "gpuprompt"
    # Three model steps; each later step sent the earlier results to the core as tool turns.
    assert len(inputs.steps) == 3
    sent = core_messages(inputs.steps[2])
    assert [t["role"] for t in sent] == ["user", "assistant", "tool", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == sent[2]["tool_call_id"] == first.tool_calls[0]["id"]
    # Step 3 answered under the response format: no call, JSON parsed into the schema.
    assert not answer.tool_calls and answer.response_metadata["finish_reason"] == "stop"
    report = result["structured_response"]
    assert isinstance(report, OrderReport)
    assert OrderReport.model_validate_json(answer.content) == report
    assert answer.usage_metadata["input_tokens"] > 0


def test_create_agent_runs_a_three_step_tool_loop_with_a_structured_answer(agent_model: ChatGPUPrompt) -> None:
    CALLS.clear()
    agent = create_agent(agent_model, [lookup_order, shipping_eta], response_format=OrderReport,
                         middleware=[ScriptedToolChoice()])
    inputs = ModelInputs()
    result = agent.invoke({"messages": [HumanMessage(QUESTION)]}, config={"callbacks": [inputs]})
    _check_run(result, inputs)


async def test_create_agent_async(agent_model: ChatGPUPrompt) -> None:
    CALLS.clear()
    agent = create_agent(agent_model, [lookup_order, shipping_eta], response_format=OrderReport,
                         middleware=[ScriptedToolChoice()])
    inputs = ModelInputs()
    result = await agent.ainvoke({"messages": [HumanMessage(QUESTION)]}, config={"callbacks": [inputs]})
    _check_run(result, inputs)


def test_profile_makes_create_agent_use_native_structured_output() -> None:
    """``create_agent`` picks ProviderStrategy (the model's own JSON-schema decoding) from the profile."""
    from langchain.agents.factory import _supports_provider_strategy

    model = ChatGPUPrompt(backend="transformers")
    assert model.profile["tool_calling"] and model.profile["tool_choice"] and model.profile["structured_output"]
    assert model.profile["max_input_tokens"] == model.max_model_len and not model.profile["image_inputs"]
    assert _supports_provider_strategy(model, tools=[lookup_order])
    assert model._engine_cache is None  # the profile is static: nothing loaded


class Money(BaseModel):
    amount: int = Field(ge=0, le=99999)
    currency: str = Field(max_length=3)


class PriceReport(BaseModel):
    """A product and its price (a nested model: its JSON schema has ``$defs`` and ``$ref``)."""

    product: str = Field(max_length=40)
    price: Money


def test_create_agent_takes_a_nested_response_format(lc_chat: ChatGPUPrompt) -> None:
    # The README's example with a nested answer: create_agent binds it as the model's own structured
    # output (ProviderStrategy) beside the tools; the nested schema's $defs must reach the grammar.
    model = ChatGPUPrompt(backend=lc_chat.backend, max_tokens=96, temperature=0.0)
    agent = create_agent(model, [lookup_order], response_format=PriceReport)
    result = agent.invoke({"messages": [HumanMessage("How much is the Aurora dress?")]})
    report = result["structured_response"]
    assert isinstance(report, PriceReport) and isinstance(report.price, Money)
