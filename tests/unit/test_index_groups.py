"""Grouped search: one best record per group, k groups, over-fetching as needed, sync == async."""

from __future__ import annotations

import numpy as np
import pytest

from gpuprompt import VectorIndex
from gpuprompt.errors import InvalidInputError


def _index() -> tuple[VectorIndex, np.ndarray]:
    rng = np.random.default_rng(3)
    index = VectorIndex(8, backend="torch", device="cpu")
    query = rng.normal(size=8).astype("float32")
    # item-0 has 10 records all very close to the query: a plain top-k would return only item-0.
    close = query + 0.01 * rng.normal(size=(10, 8)).astype("float32")
    far = rng.normal(size=(20, 8)).astype("float32")
    ids = [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(20)]
    metas = [{"item": "item-0", "ns": {"0": "x"}} for _ in range(10)] + [
        {"item": f"item-{1 + i // 2}", "ns": {"0": "x" if i % 3 else "y"}} for i in range(20)
    ]
    index.add(ids, np.vstack([close, far]), metadatas=metas)
    return index, query


def _reference(index: VectorIndex, query: np.ndarray, k: int, fields: list[str], flt=None) -> list[str]:
    best: dict[tuple, tuple[float, str]] = {}
    for hit in index.search(query, index.count, filter=flt)[0]:
        group = tuple(hit.metadata.get(f) if "." not in f else hit.metadata["ns"]["0"] for f in fields)
        best.setdefault(group, (hit.score, hit.id))
    return [hit_id for _, hit_id in sorted(best.values(), key=lambda pair: -pair[0])][:k]


@pytest.mark.parametrize("k", [1, 3, 5, 50])
def test_groups_match_a_brute_force_reference(k: int) -> None:
    index, query = _index()
    hits = index.search_groups(query, k, group_by="item")
    assert [h.id for h in hits] == _reference(index, query, k, ["item"])
    assert len({h.metadata["item"] for h in hits}) == len(hits)
    both = index.search_groups(query, k, group_by=["item", "ns.0"], filter={"ns.0": "x"})
    assert [h.id for h in both] == _reference(index, query, k, ["item", "ns.0"], {"ns.0": "x"})


async def test_async_equals_sync() -> None:
    index, query = _index()
    assert [h.id for h in await index.asearch_groups(query, 4, group_by="item")] == [
        h.id for h in index.search_groups(query, 4, group_by="item")
    ]


@pytest.mark.parametrize("bad", [{"k": 0}, {"group_by": ""}, {"group_by": []}, {"group_by": 3}, {"group_by": [None]}], ids=repr)
def test_bad_arguments_are_typed(bad: dict) -> None:
    index, query = _index()
    args = {"k": 2, "group_by": "item", **bad}
    with pytest.raises(InvalidInputError):
        index.search_groups(query, args["k"], group_by=args["group_by"])


def test_empty_index() -> None:
    assert VectorIndex(4).search_groups(np.ones(4, dtype="float32"), 3, group_by="item") == []
