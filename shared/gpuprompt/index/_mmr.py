"""Maximal marginal relevance for VectorIndex: the greedy algorithm and the checks of an MMR request.

The index fetches ``fetch_k`` candidates with an ordinary (filtered) search; this module re-ranks them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt.errors import InvalidInputError
from gpuprompt.index._checks import check_k, check_lambda, is_tensor

if TYPE_CHECKING:
    import torch

    from gpuprompt.index._store import Store

__all__ = ["check_mmr", "check_one_query", "mmr_rerank", "mmr_select"]


def check_mmr(k: Any, fetch_k: Any, lambda_mult: Any) -> tuple[int, int, float]:
    """``(k, candidates to fetch, lambda_mult)`` of an MMR request; fetches at least ``k``.

    Raises:
        InvalidInputError: ``k`` or ``fetch_k`` < 1, ``lambda_mult`` outside [0, 1].
    """
    k = check_k(k)
    fetch_k = check_k(fetch_k, "fetch_k")
    return k, max(k, fetch_k), check_lambda(lambda_mult)


def check_one_query(queries: Any, dim: int) -> None:
    """Refuse a query matrix that is not exactly one vector (MMR re-ranks for one query)."""
    if queries.shape[0] != 1:
        raise InvalidInputError(
            f"'query' must be one vector of shape ({dim},) (got {queries.shape[0]} vectors); call mmr once per query."
        )


def mmr_select(query: torch.Tensor, candidates: torch.Tensor, k: int, lambda_mult: float) -> list[int]:
    """Greedy maximal marginal relevance over ``candidates`` (rows), by cosine similarity.

    Step one picks the candidate most similar to ``query``; each next step picks the argmax of
    ``lambda_mult * sim(query, c) - (1 - lambda_mult) * max_{p picked} sim(c, p)`` (first index on
    ties). Runs on the candidates' device without a host sync per step.

    Returns:
        Candidate positions in pick order (``min(k, len(candidates))`` of them).
    """
    import torch

    from gpuprompt.index._torch import normalize_rows

    with torch.inference_mode():
        c = normalize_rows(candidates)
        q = normalize_rows(query.reshape(1, -1))
        m = c.shape[0]
        k = min(k, m)
        if k <= 0:
            return []
        to_query = (c @ q.T).squeeze(1)
        between = c @ c.T
        picked = torch.empty(k, dtype=torch.long, device=c.device)
        taken = torch.zeros(m, dtype=torch.bool, device=c.device)
        first = torch.argmax(to_query)
        picked[0] = first
        taken[first] = True
        redundancy = between[first].clone()
        for step in range(1, k):
            score = lambda_mult * to_query - (1.0 - lambda_mult) * redundancy
            score = score.masked_fill(taken, -math.inf)
            best = torch.argmax(score)
            picked[step] = best
            taken[best] = True
            redundancy = torch.maximum(redundancy, between[best])
        return picked.cpu().tolist()


def mmr_rerank(
    query: Any, scores: np.ndarray, rows: np.ndarray, *, store: Store, backend: Any, k: int, lambda_mult: float
) -> tuple[np.ndarray, np.ndarray]:
    """The MMR selection of one query's candidates, as ``(scores, rows)`` in pick order.

    Args:
        query: the query vector (numpy or a torch tensor).
        scores: the candidates' scores under the index's metric (kept on the hits).
        rows: the candidates' store rows; -1 marks a missing candidate.
        store: the record store (the candidates' vectors, when the backend keeps none on a device).
        backend: the backend in use; the torch backend's device copy is gathered from.
        k: how many to pick.
        lambda_mult: relevance (1) versus diversity (0).
    """
    import torch

    from gpuprompt.index._torch import TorchBackend

    valid = rows >= 0
    scores, rows = scores[valid], rows[valid]
    if rows.size == 0:
        return scores, rows
    if isinstance(backend, TorchBackend):
        candidates = backend.gather(rows)
    else:
        candidates = torch.from_numpy(store.vectors[rows])
    device = candidates.device
    query = query.to(device, torch.float32) if is_tensor(query) else torch.from_numpy(np.asarray(query)).to(device)
    order = mmr_select(query, candidates, k, lambda_mult)
    return scores[order], rows[order]
