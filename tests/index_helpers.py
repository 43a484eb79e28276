"""Checks shared by the index test modules (VectorIndex and MilvusIndex keep one contract)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np


def check_mmr_batched_with_a_larger_search(index: Any, dim: int) -> None:
    """An MMR request coalesced with a larger search chooses among its own ``fetch_k`` candidates only.

    A batch searches with its largest ``k``; the MMR answer must not depend on who else was
    searching. ``index`` is empty, with a batching window long enough for the two calls to meet.
    """
    vectors = np.random.default_rng(2).standard_normal((300, dim)).astype(np.float32)
    index.add([f"x{i}" for i in range(300)], vectors)
    alone = [h.id for h in index.mmr(vectors[0], k=4, fetch_k=8, lambda_mult=0.0)]

    async def together() -> list[str]:
        picked, _ = await asyncio.gather(
            index.ammr(vectors[0], k=4, fetch_k=8, lambda_mult=0.0), index.asearch(vectors[1:2], k=100)
        )
        return [h.id for h in picked]

    assert asyncio.run(together()) == alone
    assert set(alone) <= {h.id for h in index.search(vectors[:1], k=8)[0]}
