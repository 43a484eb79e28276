"""The transformers backend's prompt-prefix cache: reused keys and values give the answers the
model gives without them, and are reported as ``Usage.cached_tokens`` as vLLM reports its hits.

Greedy decoding in float32 (the session engine's settings), so answers do not depend on how a
batch was laid out or what it reused.
"""

from __future__ import annotations

import pytest
from support.engines import ENGINE_OPTIONS

from gpuprompt.llm import GenerationRequest, LLMEngine
from gpuprompt.llm.backends._prefix_cache import MIN_TOKENS, PrefixCache, shared_prefix

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
    first = tf_engine.generate(requests)  # [shared system prompt][padding][question]: kept afterwards
    again = tf_engine.generate(requests)  # starts from the kept system prompt
    assert [r.text for r in first] == [r.text for r in again] == [r.text for r in alone]
    assert {r.usage.cached_tokens for r in first} == {0}
    [cached] = {r.usage.cached_tokens for r in again}
    prompt = min(r.usage.prompt_tokens for r in again)
    assert 100 < cached < prompt  # the system prompt, not the questions


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


def _filled(tokens: int, seed: int):
    """A cache of two layers holding ``tokens`` positions for a batch of two, as generate leaves it."""
    import torch

    cache = PrefixCache(_config(), max_bytes=1 << 20).empty()
    generator = torch.Generator().manual_seed(seed)
    for layer in range(2):
        cache.update(torch.randn(2, 1, tokens, 8, generator=generator),
                     torch.randn(2, 1, tokens, 8, generator=generator), layer)
    return cache


def test_only_plain_key_value_layers_take_part() -> None:
    from transformers import MistralConfig

    assert PrefixCache.supports(_config())
    sliding = MistralConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
                            intermediate_size=32, vocab_size=64, sliding_window=8)
    assert not PrefixCache.supports(sliding)


def test_plan_reuses_the_longest_kept_prefix_and_leaves_each_row_a_token() -> None:
    import torch

    cache = PrefixCache(_config(), max_bytes=1 << 20)
    base = list(range(40))
    assert cache.plan([base + [50], base + [51, 52]]) == type(cache.plan([base]))(40, 0)  # nothing kept yet
    filled = _filled(45, seed=0)
    cache.store(base, filled)
    plan = cache.plan([base[:30] + [60, 61]])
    assert (plan.shared, plan.cached) == (31, 30)
    assert torch.equal(plan.past.layers[1].keys, filled.layers[1].keys[:1, :, :30])
    plan = cache.plan([base, base])  # identical rows: the last token is still computed
    assert (plan.shared, plan.cached, plan.past.layers[0].keys.shape[0]) == (39, 39, 2)
    assert cache.plan([[63] * 40]).cached == 0
    assert cache.plan([base[:MIN_TOKENS - 1] + [60]] * 2).shared == 0  # too short to bother
    assert cache.stats()["hits"] == 2


def test_entries_are_extended_kept_once_and_evicted_within_the_budget() -> None:
    one = 2 * 2 * 1 * 8 * 4  # bytes per position: 2 layers x (keys, values) x 1 head x 8 dims x float32
    cache = PrefixCache(_config(), max_bytes=100 * one)
    a = list(range(30))
    cache.store(a, _filled(30, seed=1))
    cache.store(a[:20], _filled(30, seed=1))  # inside the kept entry: nothing new
    assert cache.stats()["entries"] == 1
    cache.store(a + [7] * 10, _filled(40, seed=1))  # extends it: replaces it
    assert cache.stats() | {"lookups": 0, "hits": 0} == {"entries": 1, "tokens": 40, "bytes": 40 * one,
                                                          "lookups": 0, "hits": 0}
    b = [9] * 50
    cache.store(b, _filled(50, seed=2))
    cache.store([8] * 30, _filled(30, seed=3))  # over 100 positions: the least recently used goes
    assert cache.stats()["tokens"] == 80
    assert cache.plan([a + [7] * 10 + [1]]).cached == 0 and cache.plan([b + [1]]).cached == 50
    cache.store([5] * 200, _filled(200, seed=4))  # larger than the budget: not kept
    assert cache.stats()["tokens"] == 80
    cache.reset()
    assert cache.stats()["entries"] == 0 and cache.stats()["bytes"] == 0


@pytest.mark.parametrize(("rows", "expected"), [([[1, 2, 3], [1, 2, 4]], 2), ([[1, 2], [1, 2, 3]], 2),
                                                 ([[5], [6]], 0), ([[1, 2, 3]], 3)])
def test_shared_prefix(rows, expected) -> None:
    assert shared_prefix(rows) == expected
