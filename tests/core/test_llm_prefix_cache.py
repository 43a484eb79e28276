"""The transformers backend's prompt-prefix cache: reused keys and values give the answers the
model gives without them, and are reported as ``Usage.cached_tokens`` as vLLM reports its hits.

Greedy decoding in float32 (the session engine's settings), so answers do not depend on how a
batch was laid out or what it reused.
"""

from __future__ import annotations

import pytest
from support.engines import ENGINE_OPTIONS

from gpuprompt.llm import GenerationRequest, LLMEngine
from gpuprompt.llm.backends._prefix_cache import MIN_TOKENS, PrefixCache, layout

SYSTEM = "You answer questions about the shop: dresses, sweaters, jeans and rain jackets. " * 12
QUESTIONS = ["Which dress is red?", "How much is the navy sweater in size M, please?", "Hi",
             "Recommend a gift under 50 EUR for my sister."]


def ask(question: str, max_tokens: int = 6) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                             max_tokens=max_tokens)


def test_a_batch_that_reuses_a_prefix_answers_as_each_prompt_alone(tf_engine: LLMEngine) -> None:
    requests = [ask(q) for q in QUESTIONS]
    alone = []
    for request in requests:
        assert tf_engine.reset_prefix_cache()
        [result] = tf_engine.generate([request])
        assert result.usage.cached_tokens == 0
        alone.append(result)
    assert tf_engine.reset_prefix_cache()
    first = tf_engine.generate(requests)  # left-padded; each row's prompt is kept afterwards
    again = tf_engine.generate(requests)  # each row starts from its kept prompt
    assert [r.text for r in first] == [r.text for r in again] == [r.text for r in alone]
    assert {r.usage.cached_tokens for r in first} == {0}
    assert [r.usage.cached_tokens for r in again] == [r.usage.prompt_tokens - 1 for r in again]
    # A new question over the same system prompt reuses the system prompt, next to a row that
    # shares nothing with anything kept (a different system prompt): each row looks up alone.
    other = GenerationRequest(messages=[{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Which sweater is warmest, wool or cotton?"}],
                              max_tokens=6)
    mixed = tf_engine.generate([ask("Do you sell green rain jackets?"), other])
    assert 100 < mixed[0].usage.cached_tokens < mixed[0].usage.prompt_tokens - 5
    assert mixed[1].usage.cached_tokens == 0
    assert tf_engine.reset_prefix_cache()
    cold = tf_engine.generate([ask("Do you sell green rain jackets?"), other])
    assert [r.text for r in cold] == [r.text for r in mixed]


def test_a_conversation_reuses_the_previous_turn(tf_engine: LLMEngine) -> None:
    assert tf_engine.capabilities["prefix_cache"]
    assert tf_engine.reset_prefix_cache()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Do you sell rain jackets?"}]
    [turn1] = tf_engine.generate([GenerationRequest(messages=messages, max_tokens=6)])
    messages += [{"role": "assistant", "content": turn1.text}, {"role": "user", "content": "In green?"}]
    [turn2] = tf_engine.generate([GenerationRequest(messages=messages, max_tokens=6)])
    # Everything turn 1's prompt held but the last token, which its own batch had to compute.
    assert turn2.usage.cached_tokens >= turn1.usage.prompt_tokens - 1
    assert tf_engine.reset_prefix_cache()
    [cold] = tf_engine.generate([GenerationRequest(messages=messages, max_tokens=6)])
    assert cold.usage.cached_tokens == 0 and cold.text == turn2.text


def test_greedy_and_seeded_rows_share_a_batch_and_answer_as_alone(tf_engine: LLMEngine) -> None:
    """One generate call for any mix of sampling settings: each seeded row draws from its own
    generator, so it gets the same tokens in any batch, and greedy rows stay greedy."""
    messages = ask("Name a colour.").messages
    one, two = (GenerationRequest(messages=messages, max_tokens=6, temperature=1.0, top_p=0.9, seed=s) for s in (1, 2))
    greedy = GenerationRequest(messages=messages, max_tokens=6)
    assert tf_engine.reset_prefix_cache()
    batch = tf_engine.generate([one, two, greedy, one])
    assert batch[0].text == batch[3].text
    alone = [tf_engine.generate([request])[0] for request in (two, greedy, one)]
    assert [r.text for r in alone] == [r.text for r in batch[1:]]
    assert all(r.usage.cached_tokens > 0 for r in alone)  # the batch kept the shared prompt


def test_turned_off_it_keeps_nothing() -> None:
    engine = LLMEngine(backend="transformers", **{**ENGINE_OPTIONS, "enable_prefix_caching": False}).load()
    try:
        assert not engine.capabilities["prefix_cache"]
        assert engine.reset_prefix_cache() is False
        results = engine.generate([ask("Hi", 2)]) + engine.generate([ask("Hi", 2)])
        assert [r.usage.cached_tokens for r in results] == [0, 0]
    finally:
        engine.close()


# ---------------------------------------------------------------------- the cache itself
def _config(**overrides):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
                       intermediate_size=32, vocab_size=64, **overrides)


ONE = 2 * 2 * 1 * 8 * 4  # bytes per position: 2 layers x (keys, values) x 1 head x 8 dims x float32


def _run(cache: PrefixCache, rows: list[list[int]], seed: int = 0):
    """Plan ``rows``, fill the cache as generate would (random keys and values where the plan has
    none), keep the prompts; returns the plan and the filled cache."""
    import torch

    plan = cache.plan(rows)
    width, _ = layout(rows, plan.cached)
    generator = torch.Generator().manual_seed(seed)
    for index in range(2):
        new = width - plan.width
        plan.past.update(torch.randn(len(rows), 1, new, 8, generator=generator),
                         torch.randn(len(rows), 1, new, 8, generator=generator), index)
    cache.store(rows, plan, plan.past)
    return plan


def test_only_plain_key_value_models_take_part() -> None:
    from types import SimpleNamespace

    from transformers import GenerationConfig, MistralConfig

    def model(config, **generation):
        return SimpleNamespace(config=config, generation_config=GenerationConfig(**generation))

    assert PrefixCache.supports(model(_config()))
    sliding = MistralConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
                            intermediate_size=32, vocab_size=64, sliding_window=8)
    assert not PrefixCache.supports(model(sliding))
    assert not PrefixCache.supports(model(_config(), cache_implementation="static"))  # generate refuses ours
    assert not PrefixCache.supports(model(_config(), prefill_chunk_size=32))  # restarts at position 0

    class RwkvForCausalLM:  # transformers' own list of models without a default dynamic cache
        config = _config()
        generation_config = GenerationConfig()

        @classmethod
        def _supports_default_dynamic_cache(cls) -> bool:
            return False

    assert not PrefixCache.supports(RwkvForCausalLM())


def test_each_row_reuses_its_own_longest_kept_prompt() -> None:
    import torch

    cache = PrefixCache(_config(), max_bytes=1 << 20)
    a, b = list(range(40)), [63] * 30
    first = _run(cache, [a, b])
    assert first.cached == (0, 0) and cache.stats()["entries"] == 2
    kept_a = cache._entries[tuple(a)].layers[1][0]
    plan = cache.plan([a[:30] + [60, 61], [5] * 20, b + [1]])
    assert plan.cached == (30, 0, 30) and plan.width == 30
    keys = plan.past.layers[1].keys
    assert torch.equal(keys[0, :, :30], kept_a[0, :, :30])
    assert torch.count_nonzero(keys[1]) == 0  # nothing kept for that row: zeros, masked by the layout
    plan = cache.plan([a, a])  # identical rows: the last token is still computed
    assert plan.cached == (39, 39)
    assert cache.plan([a[: MIN_TOKENS - 1] + [60]]).cached == (0,)  # too short to bother


def test_kept_prompts_are_gathered_from_where_the_layout_put_them() -> None:
    import torch

    cache = PrefixCache(_config(), max_bytes=1 << 20)
    a = list(range(40))
    _run(cache, [a], seed=1)
    longer = a + [7] * 10
    plan = _run(cache, [longer, [9] * 20], seed=2)  # row 0 reuses 40 positions, then 10 new ones
    assert plan.cached == (40, 0)
    width, positions = layout([longer, [9] * 20], plan.cached)
    assert positions[0] == list(range(40)) + list(range(width - 10, width))
    kept = cache._entries[tuple(longer)].layers[0][0]
    assert torch.equal(kept[0], plan.past.layers[0].keys[0][:, positions[0]])
    assert tuple(a) not in cache._entries  # the longer prompt replaced the one it extends


def test_entries_are_kept_once_and_evicted_within_the_budget() -> None:
    cache = PrefixCache(_config(), max_bytes=100 * ONE)
    a = list(range(30))
    _run(cache, [a])
    _run(cache, [a[:20]])  # inside the kept prompt: nothing new
    assert cache.stats() | {"lookups": 0, "hits": 0} == {"entries": 1, "tokens": 30, "bytes": 30 * ONE,
                                                          "lookups": 0, "hits": 0}
    b = [9] * 50
    _run(cache, [b])
    _run(cache, [[8] * 30])  # over 100 positions: the least recently used goes
    assert cache.stats()["tokens"] == 80
    assert cache.plan([a + [1]]).cached == (0,) and cache.plan([b + [1]]).cached == (50,)
    _run(cache, [[5] * 200])  # larger than the budget: not kept
    assert cache.stats()["tokens"] == 80


def test_a_reset_between_plan_and_store_keeps_nothing() -> None:
    import torch

    cache = PrefixCache(_config(), max_bytes=1 << 20)
    rows = [list(range(30))]
    plan = cache.plan(rows)
    for index in range(2):
        plan.past.update(torch.zeros(1, 1, 30, 8), torch.zeros(1, 1, 30, 8), index)
    cache.reset()
    cache.store(rows, plan, plan.past)
    assert cache.stats()["entries"] == 0
