"""AnswerCache: exact and semantic hits, namespaces kept apart, LRU and TTL bounds, typed refusals."""

from __future__ import annotations

import asyncio

import pytest

from gpuprompt.answer_cache import AnswerCache
from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_exact_and_similar_hits_stay_in_their_namespace(embedder) -> None:
    cache: AnswerCache[str] = AnswerCache(embedder, score_threshold=0.85)
    cache.update("What is your return policy?", "model-a", "30 days")
    assert cache.lookup("What is your return policy?", "model-a") == "30 days"
    assert cache.lookup("What's your return policy?", "model-a") == "30 days"
    assert cache.lookup("What's your return policy?", "model-b") is None
    assert cache.lookup("How tall is Mount Everest?", "model-a") is None
    stats = cache.stats()
    # model-b's lookup is a miss too, though that namespace holds nothing yet
    assert (stats.exact_hits, stats.similar_hits, stats.misses) == (1, 1, 2)


def test_update_replaces_and_clear_forgets(embedder) -> None:
    cache: AnswerCache[str] = AnswerCache(embedder)
    cache.update("q", "m", "old")
    cache.update("q", "m", "new")
    assert len(cache) == 1 and cache.lookup("q", "m") == "new"
    cache.update("q", "other", "x")
    cache.clear("m")
    assert cache.lookup("q", "m") is None and cache.lookup("q", "other") == "x"
    cache.clear()
    assert len(cache) == 0


def test_lru_bound_and_ttl(embedder) -> None:
    clock = Clock()
    cache: AnswerCache[int] = AnswerCache(embedder, max_entries=3, ttl_seconds=10, clock=clock)
    for i, text in enumerate(["red dress", "blue shoes", "green hat"]):
        cache.update(text, "m", i)
    assert cache.lookup("red dress", "m") == 0  # now the most recently used
    cache.update("yellow scarf", "m", 3)  # evicts "blue shoes", the least recently used
    assert len(cache) == 3 and cache.stats().evicted == 1
    assert cache.lookup("blue shoes", "m") is None
    clock.now = 11
    assert cache.lookup("red dress", "m") is None
    assert cache.stats().expired >= 1


async def test_async_twins(embedder) -> None:
    cache: AnswerCache[str] = AnswerCache(embedder, score_threshold=0.85)
    await cache.aupdate("Do you ship to Norway?", "m", "yes")
    assert await cache.alookup("Do you ship to Norway?", "m") == "yes"
    assert await cache.alookup("Do you deliver to Norway?", "m") == "yes"
    results = await asyncio.gather(*(cache.alookup(f"question {i}", "m") for i in range(16)))
    assert len(results) == 16


@pytest.mark.parametrize(
    "options",
    [{"score_threshold": 1.5}, {"score_threshold": float("nan")}, {"max_entries": 0}, {"max_entries": True},
     {"ttl_seconds": 0}, {"ttl_seconds": float("inf")}, {"clock": 3}, {"embedder": object()},
     {"embedder": None}],
    ids=repr,
)
def test_bad_options_are_refused(embedder, options: dict) -> None:
    with pytest.raises(ConfigurationError):
        AnswerCache(**{"embedder": embedder, **options})


@pytest.mark.parametrize("prompt", [None, 5, b"x", ["x"], "lone \ud800"], ids=repr)
def test_bad_prompts_are_refused_and_nothing_changes(embedder, prompt: object) -> None:
    cache: AnswerCache[str] = AnswerCache(embedder)
    cache.update("kept", "m", "v")
    with pytest.raises(InvalidInputError):
        cache.update(prompt, "m", "x")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        cache.lookup(prompt, "m")  # type: ignore[arg-type]
    assert len(cache) == 1 and cache.lookup("kept", "m") == "v"
    assert issubclass(InputTypeError, InvalidInputError)


async def test_similarity_text_differs_from_the_exact_key(embedder) -> None:
    """``text=`` sets what similarity is measured on; the exact match stays on the prompt."""
    cache: AnswerCache[str] = AnswerCache(embedder, score_threshold=0.85)
    cache.update('[{"role": "system", "content": "Hi"}]', "m", "as system", text="Hi")
    cache.update('[{"role": "user", "content": "Hi"}]', "m", "as user", text="Hi")
    assert len(cache) == 2
    assert cache.lookup('[{"role": "system", "content": "Hi"}]', "m", text="Hi") == "as system"
    assert await cache.alookup('[{"role": "user", "content": "Hi"}]', "m", text="Hi") == "as user"
    assert cache.lookup("anything else", "m", text="Hi") in ("as system", "as user")  # similar text
    for bad in (5, "lone \ud800"):
        with pytest.raises(InvalidInputError, match="'text'"):
            cache.lookup("p", "m", text=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="'text'"):
            await cache.aupdate("p", "m", "v", text=bad)  # type: ignore[arg-type]
    assert len(cache) == 2


def test_clock_is_probed_at_construction(embedder) -> None:
    with pytest.raises(ConfigurationError, match="'clock\\(\\)'"):
        AnswerCache(embedder, clock=lambda: float("nan"))
    with pytest.raises(ConfigurationError, match="'clock' raised"):
        AnswerCache(embedder, clock=lambda: 1 / 0)


async def test_a_lookup_may_bring_its_own_threshold(embedder) -> None:
    """``score_threshold=`` per lookup (one cache serving callers of several thresholds, as the
    server does); the cache's own is the default and an exact repeat always hits."""
    cache: AnswerCache[str] = AnswerCache(embedder, score_threshold=0.95)
    cache.update("How long does delivery take?", "m", "2-4 days")
    similar = "How many days does shipping take?"  # cosine ~0.71 under the bundled MiniLM
    assert cache.lookup(similar, "m") is None
    assert cache.lookup(similar, "m", score_threshold=0.6) == "2-4 days"
    assert await cache.alookup(similar, "m", score_threshold=0.6) == "2-4 days"
    assert await cache.alookup(similar, "m", score_threshold=0.9) is None
    assert cache.lookup("How long does delivery take?", "m", score_threshold=1.0) == "2-4 days"
    assert cache.lookup(similar, "other", score_threshold=-1.0) is None  # namespaces still never mix
    for bad in (1.5, -2, float("nan"), True, "0.5"):
        with pytest.raises(InvalidInputError, match="'score_threshold'"):
            cache.lookup(similar, "m", score_threshold=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="'score_threshold'"):
            await cache.alookup(similar, "m", score_threshold=bad)  # type: ignore[arg-type]
    assert cache.score_threshold == 0.95 and len(cache) == 1


RAG_FACTS = "\n".join(
    f"Fact {i}: the {colour} {item} is made of {fabric}, costs {10 + i} euros and ships in {i % 5 + 1} days."
    for i, (colour, item, fabric) in enumerate(
        [(c, it, f) for c in ("red", "navy", "green", "white") for it in ("dress", "coat", "shirt", "skirt")
         for f in ("cotton",)]
    )
)


def _rag_prompt(question: str) -> str:
    return f"Answer from the context only.\nContext:\n{RAG_FACTS}\n\nQuestion: {question}"


async def test_a_prompt_longer_than_the_embedder_reads_is_matched_exactly_only(embedder) -> None:
    """A RAG prompt (long context, the question last) past the embedder's window: its vector would
    stand for the context alone, so every question would get the first one's answer."""
    long_prompt = _rag_prompt("Does the red dress shrink?")
    assert embedder.count_tokens([long_prompt], truncate=False)[0] > embedder.max_length
    cache: AnswerCache[str] = AnswerCache(embedder, score_threshold=0.95)
    cache.update(long_prompt, "m", "first answer")
    assert cache.lookup(_rag_prompt("Where do you ship the navy coat?"), "m") is None
    assert await cache.alookup(_rag_prompt("How much is the white skirt?"), "m") is None
    assert cache.lookup(long_prompt, "m") == "first answer"  # an exact repeat still hits
    await cache.aupdate(_rag_prompt("Is the green shirt cotton?"), "m", "second answer")
    assert await cache.alookup(_rag_prompt("Is the green shirt cotton?"), "m") == "second answer"
    assert await cache.alookup(_rag_prompt("Is the green shirt wool?"), "m") is None
    stats = cache.stats()
    assert (stats.exact_hits, stats.similar_hits, stats.misses, stats.entries) == (2, 0, 3, 2)
    # short prompts keep their semantic hits, in the same namespace
    cache.update("What is your return policy?", "m", "30 days")
    assert cache.lookup("What's your return policy?", "m") == "30 days"
    # eviction of exact-only entries leaves the matrix consistent
    small: AnswerCache[int] = AnswerCache(embedder, max_entries=2)
    small.update(long_prompt, "m", 1)
    small.update("red dress", "m", 2)
    small.update("blue shoes", "m", 3)  # evicts the long prompt (it has no row)
    small.update(_rag_prompt("x"), "m", 4)  # evicts "red dress" (a row)
    assert small.lookup("blue shoes", "m") == 3 and small.lookup(_rag_prompt("x"), "m") == 4
    assert small.lookup("red dress", "m") is None and len(small) == 2
