"""``agent-tools``: concurrent tool-calling agents (two tools, three model steps per run) on
LangChain v1's ``create_agent`` over ``ChatGPUPrompt``, against the stock path that exists for the
same local model: ``ChatHuggingFace`` over ``HuggingFacePipeline`` has no tool calling for it
(``bind_tools`` passes OpenAI tool dicts that a local pipeline ignores, and no reply is parsed into
tool calls), so the stock agent is the loop people write by hand -- tools listed in the system
prompt, a JSON call asked for, the first JSON object of the reply parsed."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from gpuprompt.apps.bench._load import Load, in_thread, task_load
from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario

__all__: list[str] = []

_STEPS = ("lookup_order", "shipping_eta")
"""The forced call of step 1 and step 2; step 3 answers in prose."""

_TOOL_SPECS = [
    {"name": "lookup_order", "description": "Look up an order by its number: its status and where it ships from.",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "integer", "minimum": 1, "maximum": 99999}}, "required": ["order_id"]}},
    {"name": "shipping_eta", "description": "Days a parcel takes to arrive from a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}},
]
_CITIES = ["Lyon", "Porto", "Gdansk", "Turin", "Ghent", "Bilbao", "Graz", "Aarhus"]


def _run_tool(name: str, args: dict[str, Any]) -> str:
    """The two tools' deterministic results (the same on both sides)."""
    if name == "lookup_order":
        order = args.get("order_id", 0)
        return f"Order {order}: packed, ships from {_CITIES[int(order) % len(_CITIES)] if isinstance(order, int) else 'Lyon'} today."
    return f"Parcels from {args.get('city', 'there')} arrive in 3 days."


def _questions(n: int, salt: str) -> list[str]:
    return [f"{salt}Where is my order {1000 + 7 * i} and when will it arrive? Check the order, then the shipping "
            "time, then tell me." for i in range(n)]


# ---------------------------------------------------------------------- ours: create_agent
def _our_agent(backend: str, max_tokens: int) -> Any:
    """``create_agent(ChatGPUPrompt, tools)`` whose steps are fixed by ``tool_choice`` (a middleware)."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.messages import AIMessage
    from langchain_core.tools import StructuredTool

    from gpuprompt.apps.bench.llm import _BENCH_MAX_MODEL_LEN
    from langchain_gpuprompt import ChatGPUPrompt

    class ForcedSteps(AgentMiddleware):
        @staticmethod
        def _step(request: Any) -> Any:
            done = sum(1 for m in request.messages if isinstance(m, AIMessage) and m.tool_calls)
            settings = {**request.model_settings, "parallel_tool_calls": False}
            if done < len(_STEPS):
                return request.override(tool_choice=_STEPS[done], model_settings=settings)
            return request.override(tool_choice="none")

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            return handler(self._step(request))

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            return await handler(self._step(request))

    def tool_of(spec: dict[str, Any]) -> Any:
        return StructuredTool.from_function(
            func=lambda **args: _run_tool(spec["name"], args), name=spec["name"], description=spec["description"],
            args_schema=spec["parameters"],
        )

    model = ChatGPUPrompt(backend=backend, max_tokens=max_tokens, max_model_len=_BENCH_MAX_MODEL_LEN)
    return create_agent(model, [tool_of(spec) for spec in _TOOL_SPECS], middleware=[ForcedSteps()],
                        system_prompt="You are the support agent of an online clothing shop.")


def _our_burst(agent: Any, questions: list[str]) -> tuple[Load, int]:
    """Every run as a concurrent ``ainvoke`` task; returns the load and the runs that took the 3 steps."""
    from langchain_core.messages import HumanMessage

    async def run(question: str) -> list[Any]:
        return (await agent.ainvoke({"messages": [HumanMessage(question)]}))["messages"]

    load = task_load(run, questions)
    complete = sum(1 for messages in load.results
                   if [m.tool_calls[0]["name"] for m in messages if getattr(m, "tool_calls", None)] == list(_STEPS))
    return load, complete


# ---------------------------------------------------------------------- stock: hand-written loop
_STOCK_SYSTEM = (
    "You are the support agent of an online clothing shop. You can call these tools:\n"
    + "\n".join(json.dumps(spec) for spec in _TOOL_SPECS)
    + '\nTo call a tool, reply with one JSON object {"name": <tool name>, "arguments": {<argument>: <value>}}.'
)


def _stock_run(chat: Any, question: str) -> tuple[int, float]:
    """One agent run on the stock chat model: the same three steps, the calls asked for in the
    prompt and parsed from the reply (a failed parse runs the tool with default arguments, so both
    sides take the same steps). Returns (calls parsed correctly, seconds)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    started = time.perf_counter()
    messages: list[Any] = [SystemMessage(_STOCK_SYSTEM)]
    ask = f"{question}\nCall the tool {_STEPS[0]} now."
    parsed = 0
    for step, name in enumerate(_STEPS):
        messages.append(HumanMessage(ask))
        reply = str(chat.invoke(messages).content)
        messages.append(AIMessage(reply))
        args: dict[str, Any] = {}
        start = reply.find("{")
        try:
            call = json.JSONDecoder().raw_decode(reply[start:])[0] if start >= 0 else None
            if isinstance(call, dict) and call.get("name") == name and isinstance(call.get("arguments"), dict):
                args, parsed = call["arguments"], parsed + 1
        except ValueError:
            pass
        nxt = f"Call the tool {_STEPS[step + 1]} now." if step + 1 < len(_STEPS) else (
            "Now answer the customer in one or two sentences.")
        ask = f"Result of {name}: {_run_tool(name, args)}\n{nxt}"
    messages.append(HumanMessage(ask))
    chat.invoke(messages)
    return parsed, time.perf_counter() - started


@scenario(
    "agent-tools",
    "16 concurrent tool-calling agent runs (2 tools, 3 model steps each: forced call of lookup_order, "
    "forced call of shipping_eta, prose answer), bundled SmolLM2-135M-Instruct, greedy: LangChain v1 "
    "create_agent over ChatGPUPrompt (core tool calling, guided decoding, all runs in flight) on each "
    "available backend vs the stock path that exists -- ChatHuggingFace over HuggingFacePipeline has no "
    "tool calling for a local model, so the stock agent is a hand-written prompt + JSON-parse loop, "
    "runs one after another. Steps/s = model steps completed per second.",
)
def agent_tools(ctx: BenchContext) -> ScenarioResult:
    import importlib.util

    from gpuprompt.apps.bench.llm import _backends, _stock_chat
    from gpuprompt.errors import ConfigurationError

    if importlib.util.find_spec("langchain") is None or importlib.util.find_spec("langchain.agents") is None:
        raise ConfigurationError("agent-tools needs LangChain v1's create_agent: pip install 'langchain>=1'.")
    n, max_tokens, steps = (8 if ctx.quick else 16), 48, len(_STEPS) + 1
    # Stock runs go one after another (a local pipeline serves one call at a time), so its rate does
    # not depend on how many it serves: the quick variant times fewer.
    stock_n = 1 if ctx.quick else 3
    stock = _stock_chat(max_tokens)
    backends = _backends()
    agents = {name: _our_agent(name, max_tokens) for name in backends}
    in_thread(lambda: stock.invoke(_questions(1, "warm-up ")[0]))  # loads the pipeline's first-call state
    for agent in agents.values():
        _our_burst(agent, _questions(2, "warm-up "))
    run_id = iter(range(10**6))

    def measure() -> dict[str, float]:
        questions = _questions(n, f"(run {next(run_id)}) ")  # fresh prompts: no prefix reuse across runs

        def sequential() -> tuple[int, float, list[float]]:
            started, parsed, latencies = time.perf_counter(), 0, []
            for question in questions[:stock_n]:
                ok, seconds = _stock_run(stock, question)
                parsed, latencies = parsed + ok, [*latencies, seconds]
            return parsed, time.perf_counter() - started, latencies

        parsed, stock_wall, latencies = in_thread(sequential)
        figures = {
            "stock_steps_s": stock_n * steps / stock_wall,
            "stock_run_p50_s": statistics.median(latencies),
            "stock_calls_parsed": parsed / (stock_n * len(_STEPS)),
        }
        for name, agent in agents.items():
            load, complete = _our_burst(agent, questions)
            figures[f"{name}_steps_s"] = load.per_s * steps  # runs/s x steps per run
            figures[f"{name}_run_p50_s"] = load.p50_s
            figures[f"{name}_run_p95_s"] = load.p95_s
            figures[f"{name}_runs_complete"] = complete / n
            figures[f"{name}_ratio"] = figures[f"{name}_steps_s"] / figures["stock_steps_s"]
        return figures

    metrics, runs = ctx.repeat(measure)
    best = max(backends, key=lambda name: metrics[f"{name}_ratio"])
    ratio = metrics[f"{best}_ratio"]
    labels = ["stock ChatHuggingFace, hand-written loop"] + [f"create_agent + ChatGPUPrompt ({b})" for b in backends]
    values = [metrics["stock_steps_s"]] + [metrics[f"{b}_steps_s"] for b in backends]
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal=f">= 5x the stock steps/s (best backend) with {n} agent runs in flight, every run taking its 3 steps",
        goal_met=ratio >= 5.0 and all(metrics[f"{b}_runs_complete"] == 1.0 for b in backends),
        chart=Chart(kind="bar", title=f"{n} concurrent agent runs, 2 tools, {steps} model steps each",
                    ylabel="model steps / second", labels=labels, values=values),
        ratio=ratio,
        ratio_label=f"agent steps/s, {n} concurrent runs ({best})",
        notes=(
            f"Greedy, {max_tokens} new tokens at most per step. Ours: LangChain v1 create_agent over ChatGPUPrompt, "
            f"{n} runs as concurrent ainvoke tasks per backend ({', '.join(backends)}); a middleware fixes each "
            "step through tool_choice (step 1 lookup_order, step 2 shipping_eta, one call each; step 3 "
            "tool_choice='none'), the core decodes each forced call under the tool's schema, so every run takes "
            "the same 3 steps (runs_complete = share of runs whose calls were exactly those). Stock: there is no "
            "stock tool calling for a local model (ChatHuggingFace over HuggingFacePipeline parses no tool "
            f"calls), so the same 3 steps run as a hand-written loop -- tools listed in the system prompt, the "
            "call asked for by name, the first JSON object of the reply parsed (calls_parsed = share parsed as a call of the "
            "right tool; a failed parse runs the tool with default arguments so the steps stay the same). "
            f"{stock_n} stock run(s) timed one after another, on a short-lived thread of their own."
        ),
    )
