"""GPUPromptLLM as a LlamaIndex ``FunctionCallingLLM``: ``chat_with_tools`` (sync, async, streaming),
``get_tool_calls_from_response``, tool calls and results in the history, ``predict_and_call``,
and ``FunctionAgent`` / ``AgentWorkflow`` over two tools, on both backends.

The bundled SmolLM2-135M calls tools poorly. These tests check the protocol, not the model's
judgement: a forced call (``tool_required`` or a named ``tool_choice``) is constrained by the core's
guided decoding, so its shape (a bound tool's name, schema-valid JSON arguments, an id) is
guaranteed whatever the model; which tool a free choice picks and which values it writes are not
asserted, and the agent runs are made deterministic by their structure (see each docstring).
"""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools import FunctionTool

from gpuprompt.errors import InputTypeError, InvalidInputError
from llamaindex_gpuprompt import GPUPromptLLM

QUESTION = "How much does the Aurora dress cost in US dollars?"
CALLS: list[tuple[str, dict]] = []  # what the tools were called with, in order


def get_price(product: str) -> str:
    """Look up the price in euros of a product sold in the shop."""
    CALLS.append(("get_price", {"product": product}))
    return "The Aurora dress costs 40 euros."


def eur_to_usd(amount_eur: float) -> str:
    """Convert an amount of euros to US dollars."""
    CALLS.append(("eur_to_usd", {"amount_eur": amount_eur}))
    return f"{amount_eur} euros is {amount_eur * 1.25:.2f} US dollars."


PRICE = FunctionTool.from_defaults(fn=get_price)
CONVERT = FunctionTool.from_defaults(fn=eur_to_usd)
TOOLS = [PRICE, CONVERT]
BY_NAME = {tool.metadata.name: tool for tool in TOOLS}


@pytest.fixture(params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def llm(request: pytest.FixtureRequest) -> GPUPromptLLM:
    """A GPUPromptLLM with room for a tool call, on the session's engine of each backend."""
    base = request.getfixturevalue("li_llm" if request.param == "transformers" else "li_vllm")
    return GPUPromptLLM(engine=base.engine, max_tokens=64)


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


def _assert_valid_call(selection: ToolSelection, names: tuple[str, ...] = tuple(BY_NAME)) -> None:
    assert isinstance(selection, ToolSelection)
    assert selection.tool_name in names
    assert selection.tool_id.startswith("call_")
    BY_NAME[selection.tool_name].metadata.fn_schema.model_validate(selection.tool_kwargs)  # schema-valid


def _response_calls(response: ChatResponse) -> list[tuple[str, str, dict]]:
    """(id, name, args) from both places LlamaIndex keeps tool calls; they must agree."""
    blocks = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
    dicts = response.message.additional_kwargs.get("tool_calls", [])
    from_blocks = [(b.tool_call_id, b.tool_name, json.loads(b.tool_kwargs)) for b in blocks]
    from_dicts = [(d["id"], d["function"]["name"], json.loads(d["function"]["arguments"])) for d in dicts]
    assert from_blocks == from_dicts
    return from_blocks


# ------------------------------------------------------------------ the FunctionCallingLLM contract
def test_is_a_function_calling_llm(llm: GPUPromptLLM) -> None:
    from llama_index.core.llms.function_calling import FunctionCallingLLM

    assert isinstance(llm, FunctionCallingLLM)
    assert llm.metadata.is_function_calling_model is True


def test_chat_with_tools_required_returns_a_well_formed_call(llm: GPUPromptLLM) -> None:
    response = llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_required=True)
    assert response.raw["finish_reason"] == "tool_calls"
    calls = _response_calls(response)
    assert len(calls) == 1  # allow_parallel_tool_calls=False (LlamaIndex's default): at most one
    [selection] = llm.get_tool_calls_from_response(response)
    _assert_valid_call(selection)
    assert (selection.tool_id, selection.tool_name, selection.tool_kwargs) == calls[0]


def test_a_named_tool_choice_forces_that_tool(llm: GPUPromptLLM) -> None:
    for name in BY_NAME:
        response = llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_choice=name)
        [selection] = llm.get_tool_calls_from_response(response)
        _assert_valid_call(selection, (name,))


def test_tool_choice_none_answers_in_prose(llm: GPUPromptLLM) -> None:
    response = llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_choice="none", max_tokens=8)
    assert response.message.content
    assert response.raw["finish_reason"] in ("stop", "length")
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(InvalidInputError, match="expected at least one tool call"):
        llm.get_tool_calls_from_response(response)
    with pytest.raises(ValueError):  # what LlamaIndex callers catch
        llm.get_tool_calls_from_response(response)


def test_tool_required_on_the_llm_forces_a_call_unless_a_choice_is_named(llm: GPUPromptLLM) -> None:
    forced = GPUPromptLLM(engine=llm.engine, max_tokens=64, tool_required=True)
    [selection] = forced.get_tool_calls_from_response(forced.chat_with_tools(TOOLS, user_msg="Hello!"))
    _assert_valid_call(selection)
    prose = forced.chat_with_tools(TOOLS, user_msg="Hello!", tool_choice="none", max_tokens=4)
    assert forced.get_tool_calls_from_response(prose, error_on_no_tool_call=False) == []


async def test_async_and_streaming_give_the_same_call(llm: GPUPromptLLM) -> None:
    """Greedy decoding: the sync, async and streamed replies make the same call (ids differ)."""
    expected = llm.get_tool_calls_from_response(llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_required=True))
    key = [(s.tool_name, s.tool_kwargs) for s in expected]

    response = await llm.achat_with_tools(TOOLS, user_msg=QUESTION, tool_required=True)
    assert [(s.tool_name, s.tool_kwargs) for s in llm.get_tool_calls_from_response(response)] == key

    chunks = list(llm.stream_chat_with_tools(TOOLS, user_msg=QUESTION, tool_required=True))
    final = chunks[-1]
    assert final.raw["finish_reason"] == "tool_calls"
    assert [(s.tool_name, s.tool_kwargs) for s in llm.get_tool_calls_from_response(final)] == key
    _response_calls(final)
    # Every chunk parses (partial arguments included): what FunctionAgent does while streaming.
    for chunk in chunks:
        llm.get_tool_calls_from_response(chunk, error_on_no_tool_call=False)

    achunks = [c async for c in await llm.astream_chat_with_tools(TOOLS, user_msg=QUESTION, tool_required=True)]
    assert [(s.tool_name, s.tool_kwargs) for s in llm.get_tool_calls_from_response(achunks[-1])] == key


def test_tool_calls_and_results_in_the_history_in_either_form(llm: GPUPromptLLM) -> None:
    """An assistant call kept as ToolCallBlocks or as OpenAI dicts, and its result as a TOOL
    message, reach the model as the same prompt (the same prompt token count)."""
    call_id, args = "call_0123456789abcdef01234567", {"product": "Aurora dress"}
    as_blocks = ChatMessage(
        role=MessageRole.ASSISTANT,
        blocks=[TextBlock(text=""), ToolCallBlock(tool_call_id=call_id, tool_name="get_price", tool_kwargs=args)],
    )
    as_dicts = ChatMessage(
        role=MessageRole.ASSISTANT,
        content="",
        additional_kwargs={
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "get_price", "arguments": json.dumps(args)}}
            ]
        },
    )
    result = ChatMessage(role=MessageRole.TOOL, content=get_price("Aurora dress"), additional_kwargs={"tool_call_id": call_id})
    user = ChatMessage(role=MessageRole.USER, content=QUESTION)
    first = llm.chat_with_tools(TOOLS, chat_history=[user, as_blocks, result], tool_choice="eur_to_usd")
    second = llm.chat_with_tools(TOOLS, chat_history=[user, as_dicts, result], tool_choice="eur_to_usd")
    assert first.raw["usage"]["prompt_tokens"] == second.raw["usage"]["prompt_tokens"]
    without = llm.chat_with_tools(TOOLS, chat_history=[user], tool_choice="eur_to_usd")
    assert first.raw["usage"]["prompt_tokens"] > without.raw["usage"]["prompt_tokens"]  # the turns were sent
    [selection] = llm.get_tool_calls_from_response(first)
    _assert_valid_call(selection, ("eur_to_usd",))


def test_chat_history_is_not_modified(llm: GPUPromptLLM) -> None:
    history = [ChatMessage(role=MessageRole.SYSTEM, content="You are a shop assistant.")]
    llm.chat_with_tools(TOOLS, user_msg=QUESTION, chat_history=history, tool_required=True, max_tokens=48)
    assert len(history) == 1


def test_predict_and_call_runs_the_chosen_tool(llm: GPUPromptLLM) -> None:
    output = llm.predict_and_call([PRICE], user_msg=QUESTION, tool_required=True)
    assert output.response == "The Aurora dress costs 40 euros."
    assert [name for name, _ in CALLS] == ["get_price"]
    assert output.sources[0].tool_name == "get_price" and not output.sources[0].is_error


def test_bad_tool_input_raises_typed_errors(llm: GPUPromptLLM) -> None:
    with pytest.raises(InputTypeError, match="'tools' must be a list of tools"):
        llm.chat_with_tools(PRICE, user_msg=QUESTION)
    with pytest.raises(InputTypeError, match=r"'tools\[1\]' must be a LlamaIndex tool"):
        llm.chat_with_tools([PRICE, "eur_to_usd"], user_msg=QUESTION)
    with pytest.raises(InvalidInputError, match="'tool_choice'"):
        llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_choice="no_such_tool")
    call = ToolCallBlock(tool_call_id="call_1", tool_name="get_price", tool_kwargs={})
    with pytest.raises(InvalidInputError, match=r"'messages\[0\]' holds tool calls but its role is 'user'"):
        llm.chat([ChatMessage(role=MessageRole.USER, blocks=[call])])
    bad_result = ChatMessage(role=MessageRole.TOOL, content="40", additional_kwargs={"tool_call_id": 7})
    with pytest.raises(InvalidInputError, match=r"additional_kwargs\[\\?\"tool_call_id\\?\"\]' must be the str id"):
        llm.chat([ChatMessage(role="user", content="hi"), bad_result])
    with pytest.raises(InputTypeError, match="'response' must be a ChatResponse"):
        llm.get_tool_calls_from_response("not a response")


# ------------------------------------------------------------------ agents
async def _run(agent, question: str, **kwargs) -> tuple[str, list]:
    from llama_index.core.agent.workflow import ToolCallResult

    handler = agent.run(user_msg=question, **kwargs)
    results = [event async for event in handler.stream_events() if isinstance(event, ToolCallResult)]
    return str(await handler), results


async def test_function_agent_answers_a_two_step_question_with_two_tools(llm: GPUPromptLLM) -> None:
    """A FunctionAgent (streaming, its default) answers "the price in dollars" in two steps, one
    per tool, the second sending the first's call and result back to the model from memory.

    Deterministic by structure, not by the model's judgement: each step names the tool to call
    (``initial_tool_choice``), the LLM must call a tool (``tool_required``) and both tools are
    ``return_direct``, so each step is exactly one forced, schema-valid call whose output is the
    step's answer. Which values the model writes into a call is not asserted (the 135M model may
    convert the wrong amount); that the calls, ids, results and history travel is.
    """
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.memory import ChatMemoryBuffer

    tools = [
        FunctionTool.from_defaults(fn=get_price, return_direct=True),
        FunctionTool.from_defaults(fn=eur_to_usd, return_direct=True),
    ]
    agent_llm = GPUPromptLLM(engine=llm.engine, max_tokens=64, tool_required=True)
    agent = FunctionAgent(tools=tools, llm=agent_llm, initial_tool_choice="get_price")
    memory = ChatMemoryBuffer.from_defaults(llm=agent_llm)  # the conversation, across both steps

    answer, results = await _run(agent, "What does the Aurora dress cost?", memory=memory)
    assert answer == "The Aurora dress costs 40 euros."
    assert [r.tool_name for r in results] == ["get_price"]
    first_id = results[0].tool_id
    assert first_id.startswith("call_")
    PRICE.metadata.fn_schema.model_validate(results[0].tool_kwargs)

    agent.initial_tool_choice = "eur_to_usd"
    requests: list[list[ChatMessage]] = []

    class Recorder(BaseEventHandler):
        def handle(self, event, **kwargs) -> None:
            if event.class_name() == "LLMChatStartEvent":
                requests.append(list(event.messages))

    recorder = Recorder()
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(recorder)
    try:
        answer, results = await _run(agent, "What is that in US dollars?", memory=memory)
    finally:
        dispatcher.event_handlers.remove(recorder)
    assert [r.tool_name for r in results] == ["eur_to_usd"]
    amount = results[0].tool_kwargs["amount_eur"]
    assert answer == f"{amount} euros is {amount * 1.25:.2f} US dollars."
    assert [name for name, _ in CALLS] == ["get_price", "eur_to_usd"]
    # The second step's request held the first step's call and its result, linked by the id.
    [request] = requests
    calls = [b for m in request for b in m.blocks if isinstance(b, ToolCallBlock)]
    tool_results = [m for m in request if m.role == MessageRole.TOOL]
    assert [(c.tool_call_id, c.tool_name) for c in calls] == [(first_id, "get_price")]
    assert [m.additional_kwargs["tool_call_id"] for m in tool_results] == [first_id]
    assert tool_results[0].content == "The Aurora dress costs 40 euros."


async def test_agent_workflow_runs_the_agent(llm: GPUPromptLLM) -> None:
    """AgentWorkflow over one FunctionAgent (no handoff: a 135M model would pick the target by
    judgement); the forced call's output is the workflow's answer."""
    from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent

    agent_llm = GPUPromptLLM(engine=llm.engine, max_tokens=64, tool_required=True)
    agent = FunctionAgent(
        name="shop",
        description="Answers questions about prices.",
        tools=[FunctionTool.from_defaults(fn=get_price, return_direct=True), CONVERT],
        llm=agent_llm,
        initial_tool_choice="get_price",
        streaming=False,
    )
    workflow = AgentWorkflow(agents=[agent])
    answer, results = await _run(workflow, "What does the Aurora dress cost?")
    assert answer == "The Aurora dress costs 40 euros."
    assert [r.tool_name for r in results] == ["get_price"]


class NestedAddress(BaseModel):
    city: str
    country: str


class NestedCustomer(BaseModel):
    name: str
    address: NestedAddress


class RegisterArgs(BaseModel):
    customer: NestedCustomer


def register(customer: NestedCustomer) -> str:
    """Register a customer."""
    return "ok"


def test_chat_with_tools_takes_a_tool_whose_argument_is_a_nested_model(li_llm: GPUPromptLLM) -> None:
    # The schema is given: this module's postponed annotations keep LlamaIndex from resolving the
    # signature's nested model itself.
    tool = FunctionTool.from_defaults(fn=register, fn_schema=RegisterArgs)
    assert "$defs" in json.dumps(tool.metadata.get_parameters_dict())  # "#/$defs/..." references
    llm = GPUPromptLLM(engine=li_llm.engine, max_tokens=80)
    response = llm.chat_with_tools([tool], user_msg="Register Bob from Paris, France.", tool_required=True)
    assert response.raw["finish_reason"] == "tool_calls"
    [selection] = llm.get_tool_calls_from_response(response)
    assert selection.tool_name == "register"
    NestedCustomer.model_validate(selection.tool_kwargs["customer"])
