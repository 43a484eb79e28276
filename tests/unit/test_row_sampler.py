"""RowSampler draws what transformers' own sampling draws: the same warpers in the same order
(temperature, top-k, top-p, min-p), then one multinomial draw from the row's seeded generator."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpuprompt.llm.backends._guided import RowSampler  # noqa: E402


@dataclass
class _Request:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None


@dataclass
class _Row:
    request: _Request
    done: bool = False
    job: SimpleNamespace = field(init=False)

    def __post_init__(self) -> None:
        self.job = SimpleNamespace(prepared=SimpleNamespace(request=self.request))


def _stock_draw(logits, request: _Request) -> int:
    """transformers' sampling of one row: its warpers, then multinomial with the request's seed."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList([TemperatureLogitsWarper(request.temperature)])
    if request.top_k:
        warpers.append(TopKLogitsWarper(request.top_k))
    if request.top_p < 1.0:
        warpers.append(TopPLogitsWarper(request.top_p))
    if request.min_p > 0:
        warpers.append(MinPLogitsWarper(request.min_p))
    scores = warpers(None, logits[None].clone())
    generator = torch.Generator().manual_seed(request.seed)
    return int(torch.multinomial(scores.softmax(-1)[0], 1, generator=generator))


@pytest.mark.parametrize(
    "request_",
    [_Request(temperature=1.0, seed=1), _Request(temperature=0.7, top_p=0.9, seed=2),
     _Request(temperature=1.3, top_k=20, seed=3), _Request(temperature=1.0, min_p=0.05, seed=4),
     _Request(temperature=0.5, top_k=50, top_p=0.8, min_p=0.02, seed=5)],
    ids=["plain", "top_p", "top_k", "min_p", "all"],
)
def test_each_row_draws_as_transformers_samples_it(request_: _Request) -> None:
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(0)) * 3
    rows = [_Row(_Request()), _Row(request_), _Row(_Request(temperature=1.0, seed=9))]
    scores = RowSampler(rows, "cpu")(None, logits.clone())
    assert torch.equal(scores[0], logits[0])  # a greedy row is left to greedy decoding
    drawn = int(scores[1].argmax())
    assert drawn == _stock_draw(logits[1], request_)
    assert torch.isinf(scores[1]).sum() == 499  # every other token is ruled out


def test_a_seeded_row_draws_the_same_in_any_batch() -> None:
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(1)).repeat(4, 1)
    seeded = _Request(temperature=1.0, seed=7)
    together = RowSampler([_Row(seeded), _Row(_Request(temperature=1.0, seed=8)), _Row(seeded), _Row(seeded)], "cpu")
    steps = [together(None, logits.clone()).argmax(-1).tolist() for _ in range(5)]
    alone = RowSampler([_Row(seeded)], "cpu")
    single = [int(alone(None, logits[:1].clone()).argmax()) for _ in range(5)]
    assert [s[0] for s in steps] == [s[2] for s in steps] == [s[3] for s in steps] == single


def test_rows_done_or_with_nothing_left_are_untouched() -> None:
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(2))
    logits[1] = -float("inf")  # every token masked (a grammar with no way on)
    rows = [_Row(_Request(temperature=1.0, seed=1), done=True), _Row(_Request(temperature=1.0, seed=1))]
    scores = RowSampler(rows, "cpu")(None, logits.clone())
    assert torch.equal(scores[0], logits[0]) and torch.equal(scores[1], logits[1])
