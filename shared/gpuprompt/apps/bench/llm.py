"""LLM scenarios: concurrent chat requests (``llm-concurrency``) against langchain-huggingface's
``ChatHuggingFace`` over ``HuggingFacePipeline`` called one request after another, and the prefix
cache on a long system prompt (``llm-prefix-cache``), in the same run."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

from gpuprompt.apps.bench._load import in_thread
from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario
from gpuprompt.errors import ConfigurationError

__all__: list[str] = []

_TOPICS = [
    "returning a dress that shrank in the wash",
    "choosing the right size of running shoes",
    "caring for a wool sweater",
    "what to pack for a rainy city break",
    "how to remove a red wine stain from cotton",
    "picking a winter coat for very cold weather",
    "the difference between linen and cotton shirts",
    "how to store leather boots over the summer",
]

BACKEND_ENV = "GPUPROMPT_BENCH_LLM_BACKEND"
"""``llm-prefix-cache``: the backend to measure (one per process); default vLLM when installed."""

_BENCH_MAX_MODEL_LEN = 4096  # room for the ~1,800-token catalogue plus five turns


def chat_requests(n: int, max_tokens: int, salt: str = "") -> list[list[dict[str, str]]]:
    """``n`` distinct customer-service chats that each invite a long answer (deterministic)."""
    out = []
    for i in range(n):
        topic = _TOPICS[i % len(_TOPICS)]
        out.append(
            [
                {"role": "system", "content": "You are a friendly, detailed support agent of an online clothing shop."},
                {"role": "user", "content": f"{salt}Customer #{i}: please explain in detail {topic}."},
            ]
        )
    return out


def _engine(backend: str) -> Any:
    from gpuprompt.runtime import get_runtime

    # One engine per backend for the whole bench process (vLLM starts once, ~30 s on CPU).
    return get_runtime().llm(backend=backend, max_model_len=_BENCH_MAX_MODEL_LEN).load()


def _backends() -> list[str]:
    from gpuprompt.llm.backends._vllm import vllm_available

    return ["transformers", "vllm"] if vllm_available() else ["transformers"]


def _stock_chat(max_new_tokens: int) -> Any:
    """The stock LangChain stack: ChatHuggingFace over a local HuggingFacePipeline (greedy)."""
    from langchain_huggingface import ChatHuggingFace, HuggingFacePipeline

    from gpuprompt.device import resolve_device
    from gpuprompt.models import resolve_chat_model

    folder = resolve_chat_model(None)
    pipeline = HuggingFacePipeline.from_model_id(
        model_id=folder,
        task="text-generation",
        device_map=resolve_device("auto"),
        pipeline_kwargs={"max_new_tokens": max_new_tokens, "do_sample": False, "return_full_text": False},
    )
    return ChatHuggingFace(llm=pipeline, model_id=folder)


def _lc_messages(messages: list[dict[str, str]]) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    kinds = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    return [kinds[m["role"]](content=m["content"]) for m in messages]


def _burst(engine: Any, chats: list[list[dict[str, str]]], max_tokens: int) -> dict[str, float]:
    """All chats at once as concurrent ``agenerate`` tasks; tokens/s over the burst, latencies."""
    from gpuprompt.llm import GenerationRequest

    async def run() -> tuple[float, list[Any]]:
        requests = [GenerationRequest(messages=m, max_tokens=max_tokens) for m in chats]
        started = time.perf_counter()
        results = await asyncio.gather(*(engine.agenerate(r) for r in requests))
        return time.perf_counter() - started, results

    wall, results = asyncio.run(run())
    tokens = sum(r.usage.completion_tokens for r in results)
    return {
        "tok_s": tokens / wall,
        "tokens": float(tokens),
        "p50_s": statistics.median(r.timings.total_s for r in results),
        "ttft_p50_s": statistics.median(r.timings.ttft_s for r in results),
    }


@scenario(
    "llm-concurrency",
    "16 concurrent chat requests, 64 new tokens each, bundled SmolLM2-135M-Instruct, greedy: stock "
    "ChatHuggingFace over HuggingFacePipeline called one request after another vs gpuprompt LLMEngine "
    "(agenerate, all 16 in flight) on each available backend (transformers padded batches, vLLM).",
)
def llm_concurrency(ctx: BenchContext) -> ScenarioResult:
    from transformers import AutoTokenizer

    from gpuprompt.models import resolve_chat_model

    n, max_tokens = 16, 64
    # Stock calls run one after another, so its tokens/s does not depend on how many it serves:
    # the quick variant times fewer of them.
    stock_n = 3 if ctx.quick else n
    tokenizer = AutoTokenizer.from_pretrained(resolve_chat_model(None))
    stock = _stock_chat(max_tokens)
    backends = _backends()
    engines = {name: _engine(name) for name in backends}
    warm = chat_requests(2, max_tokens, "warm-up ")
    in_thread(lambda: stock.invoke(_lc_messages(warm[0])))
    for engine in engines.values():
        _burst(engine, warm, 8)
    run_id = iter(range(10**6))

    def measure() -> dict[str, float]:
        chats = chat_requests(n, max_tokens, f"run {next(run_id)}: ")  # fresh prompts: no prefix reuse
        figures: dict[str, float] = {}

        def sequential() -> tuple[int, float, list[float]]:
            started = time.perf_counter()
            tokens, latencies = 0, []
            for messages in chats[:stock_n]:
                t0 = time.perf_counter()
                reply = stock.invoke(_lc_messages(messages))
                latencies.append(time.perf_counter() - t0)
                tokens += len(tokenizer(str(reply.content), add_special_tokens=False)["input_ids"])
            return tokens, time.perf_counter() - started, latencies

        stock_tokens, stock_wall, latencies = in_thread(sequential)
        figures["stock_tok_s"] = stock_tokens / stock_wall
        figures["stock_p50_s"] = statistics.median(latencies)
        for name, engine in engines.items():
            ours = _burst(engine, chats, max_tokens)
            figures[f"{name}_tok_s"] = ours["tok_s"]
            figures[f"{name}_p50_s"] = ours["p50_s"]
            figures[f"{name}_ttft_p50_s"] = ours["ttft_p50_s"]
            figures[f"{name}_ratio"] = ours["tok_s"] / figures["stock_tok_s"]
        return figures

    metrics, runs = ctx.repeat(measure)
    best = max(backends, key=lambda name: metrics[f"{name}_ratio"])
    ratio = metrics[f"{best}_ratio"]
    labels = ["stock ChatHuggingFace (sequential)"] + [f"gpuprompt LLMEngine ({name})" for name in backends]
    values = [metrics["stock_tok_s"]] + [metrics[f"{name}_tok_s"] for name in backends]
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal=">= 6x the stock tokens/s (best backend) with 16 chat requests in flight",
        goal_met=ratio >= 6.0,
        chart=Chart(kind="bar", title=f"{n} concurrent chats, {max_tokens} new tokens each", ylabel="tokens / second",
                    labels=labels, values=values),
        ratio=ratio,
        ratio_label=f"LLM tokens/s, {n} concurrent chats ({best})",
        notes=(
            f"Greedy, {max_tokens} new tokens at most (answers may end earlier at end-of-sequence; tokens are "
            f"counted as generated). Stock: {stock_n} requests timed one after another (its rate does not "
            f"depend on the count). Ours: {n} concurrent agenerate tasks per backend ({', '.join(backends)}); "
            "the transformers backend forms left-padded batches through the MicroBatcher, vLLM batches "
            "continuously. Stock calls run on a short-lived thread of their own (a thread that ran torch "
            "work slows torch on other threads of the process afterwards)."
        ),
    )


def catalogue(tokens: int, count: Any) -> str:
    """A product catalogue system prompt of about ``tokens`` tokens (``count`` counts tokens)."""
    colours = ["red", "navy", "olive", "black", "white", "mustard", "grey", "teal"]
    products = ["linen dress", "slim jeans", "wool sweater", "rain jacket", "trail sneakers", "silk scarf"]
    header = (
        "You are the support assistant of Northwind Apparel. Answer only from this catalogue; quote the "
        "SKU and price. Catalogue:\n"
    )
    lines: list[str] = []
    i = 0
    while True:
        colour, product = colours[i % len(colours)], products[(i // len(colours)) % len(products)]
        lines.append(f"SKU-{1000 + i}: {colour} {product}, sizes XS-XL, {19 + (i * 7) % 180}.00 EUR, wash at 30C.")
        i += 1
        if i % 10 == 0 and count(header + "\n".join(lines)) >= tokens:
            return header + "\n".join(lines)


_QUESTIONS = [
    "Do you have the red linen dress in size M?",
    "How much is the navy wool sweater?",
    "Which rain jacket is the cheapest?",
    "Can I wash the olive slim jeans at 40 degrees?",
    "Recommend a gift under 50 EUR.",
]


@scenario(
    "llm-prefix-cache",
    "A 5-turn support chat over a ~1,800-token catalogue system prompt: time to first token of turn 5 "
    "with the engine's prefix cache warm vs after reset_prefix_cache(), and the stock ChatHuggingFace "
    "(one new token) on the same turn-5 prompt. The backend: vLLM when installed, else transformers; "
    f"${BACKEND_ENV}=transformers (or vllm) picks one.",
)
def llm_prefix_cache(ctx: BenchContext) -> ScenarioResult:
    from gpuprompt.llm import GenerationRequest

    backend = os.environ.get(BACKEND_ENV) or ("vllm" if "vllm" in _backends() else "transformers")
    if backend not in _backends():
        raise ConfigurationError(f"${BACKEND_ENV} must be one of {_backends()} here (got {backend!r}).")
    engine = _engine(backend)
    answer_tokens = 24
    system = catalogue(1800, lambda text: engine.count_tokens(text))
    stock = _stock_chat(1)
    run_id = iter(range(10**6))

    def conversation(salt: str) -> tuple[list[dict[str, str]], Any]:
        """Turns 1-4 answered by the engine, and the turn-5 request."""
        messages = [{"role": "system", "content": system}]
        for question in _QUESTIONS[:-1]:
            messages.append({"role": "user", "content": salt + question})
            [reply] = engine.generate([GenerationRequest(messages=messages, max_tokens=answer_tokens)])
            messages.append({"role": "assistant", "content": reply.text})
        messages.append({"role": "user", "content": salt + _QUESTIONS[-1]})
        return messages, GenerationRequest(messages=messages, max_tokens=answer_tokens)

    # One unmeasured session first: the engine's first long prompts pay one-off start-up costs.
    _, first = conversation("(warm-up) ")
    engine.generate([first])
    in_thread(lambda: stock.invoke(_lc_messages([{"role": "system", "content": system}, {"role": "user", "content": "Hi"}])))

    def measure() -> dict[str, float]:
        salt = f"(session {next(run_id)}) "
        engine.reset_prefix_cache()
        messages, turn5 = conversation(salt)
        [warm] = engine.generate([turn5])
        engine.reset_prefix_cache()
        [cold] = engine.generate([turn5])
        figures = {
            "prompt_tokens": float(warm.usage.prompt_tokens),
            "cached_tokens": float(warm.usage.cached_tokens),
            "warm_ttft_ms": warm.timings.ttft_s * 1000,
            "cold_ttft_ms": cold.timings.ttft_s * 1000,
            "warm_over_cold": warm.timings.ttft_s / cold.timings.ttft_s,
        }
        started = time.perf_counter()
        in_thread(lambda: stock.invoke(_lc_messages(messages)))
        figures["stock_ttft_ms"] = (time.perf_counter() - started) * 1000
        return figures

    metrics, runs = ctx.repeat(measure)
    labels = ["stock ChatHuggingFace (1 token)", "gpuprompt, prefix cache reset", "gpuprompt, prefix cache warm"]
    values = [metrics["stock_ttft_ms"], metrics["cold_ttft_ms"], metrics["warm_ttft_ms"]]
    ratio = metrics["warm_over_cold"]
    return ScenarioResult(
        metrics=metrics,
        runs=runs,
        goal="turn-5 time to first token with the prefix cache <= 0.15x the same turn after a cache reset",
        goal_met=ratio <= 0.15,
        chart=Chart(kind="bar", title=f"Turn 5 of a chat over a {int(metrics['prompt_tokens'])}-token prompt ({backend})",
                    ylabel="time to first token (ms)", labels=labels, values=values),
        ratio=1.0 / ratio,
        ratio_label="turn-5 time to first token, cold / warm prefix cache",
        notes=(
            f"Backend {backend}; each run is a new session (the questions carry a session tag), turns 1-4 are "
            f"answered with {answer_tokens} new tokens, then turn 5 is timed with the cache as the conversation "
            "left it and again right after reset_prefix_cache(). One backend per process (two LLM engines in one "
            "process share its cores). "
            + "The stock figure is ChatHuggingFace generating one token for the same turn-5 prompt."
        ),
    )
