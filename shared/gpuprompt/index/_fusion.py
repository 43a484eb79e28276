"""Hybrid search: the checks of a lexical or hybrid request and the fusion of its two legs.

Two ways to fuse the dense leg's and the lexical leg's candidates (each leg fetches ``fetch_k``
under the same filter):

* ``"rrf"`` (the default): reciprocal rank fusion, ``sum over legs of 1 / (rrf_k + rank)`` with
  ranks from 1 and ``rrf_k = 60``. Scale-free, so it needs no tuning: the safe choice when the two
  legs' scores mean different things (they do: cosine vs BM25).
* ``"weighted"`` (chosen by passing ``alpha``): each leg's scores min-max normalised over its own
  candidates to [0, 1], then ``alpha * dense + (1 - alpha) * lexical`` (a document missing from a
  leg scores 0 there), ``alpha`` in LlamaIndex's meaning: 1 is dense only, 0 lexical only. Tune it
  when one leg is known to be the stronger one (exact codes: lower alpha).

Ties keep the better dense rank, then the row order: results never depend on batch-mates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuprompt.errors import InputTypeError, InvalidInputError, describe
from gpuprompt.validation import check_int, check_str

__all__ = ["DEFAULT_RRF_K", "FUSIONS", "Fusion", "check_fusion", "check_query_texts", "fuse", "fetch_for"]

DEFAULT_RRF_K = 60
FUSIONS = ("rrf", "weighted")
_MAX = 2**31 - 1


@dataclass(frozen=True)
class Fusion:
    """How one hybrid request fuses its legs (checked).

    Attributes:
        method: ``"rrf"`` or ``"weighted"``.
        alpha: the dense leg's weight for ``"weighted"`` (None for ``"rrf"``).
        rrf_k: the RRF constant.
        fetch_k: candidates each leg fetches (at least ``k``).
    """

    method: str
    alpha: float | None
    rrf_k: int
    fetch_k: int


def fetch_for(k: int, fetch_k: int | None) -> int:
    """The candidates each leg fetches: ``fetch_k``, else ``max(20, 4 * k)``."""
    return max(k, fetch_k if fetch_k is not None else max(20, 4 * k))


def check_fusion(k: int, *, alpha: Any = None, fusion: Any = None, fetch_k: Any = None,
                 rrf_k: Any = DEFAULT_RRF_K) -> Fusion:
    """Check a hybrid request's fusion arguments.

    Raises:
        InvalidInputError: ``alpha`` outside [0, 1], NaN or a bool; ``alpha`` with ``fusion="rrf"``;
            an unknown ``fusion``; ``fetch_k`` < ``k``; ``rrf_k`` < 1.
    """
    if fusion is not None and fusion not in FUSIONS:
        raise InvalidInputError(f"'fusion' must be one of {list(FUSIONS)} or None (got {describe(fusion)}).")
    if alpha is not None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) \
                or not 0.0 <= alpha <= 1.0:
            raise InvalidInputError(
                f"'alpha' must be a number from 0 (lexical only) to 1 (dense only), or None for rank fusion (got "
                f"{describe(alpha)})."
            )
        if fusion == "rrf":
            raise InvalidInputError(
                "'alpha' weighs normalised scores (fusion='weighted'); reciprocal rank fusion (fusion='rrf') takes no "
                "weight: drop one of the two."
            )
        method = "weighted"
    else:
        method = fusion or "rrf"
        if method == "weighted":
            alpha = 0.5
    check_int(fetch_k, "fetch_k", min=1, max=_MAX, allow_none=True)
    if fetch_k is not None and fetch_k < k:
        raise InvalidInputError(f"'fetch_k' must be at least 'k' ({k}) (got {fetch_k}): each leg fetches fetch_k "
                                "candidates, of which k are kept.")
    rrf = int(check_int(rrf_k, "rrf_k", min=1, max=_MAX))  # type: ignore[arg-type]
    return Fusion(method, float(alpha) if alpha is not None else None, rrf, fetch_for(k, fetch_k))


def check_query_texts(texts: Any, name: str = "texts") -> list[str]:
    """Query texts of the lexical leg: a list of well-formed str, none empty or only whitespace.

    Raises:
        InputTypeError: a bare str, a non-list, or an item that is not a str (named by index).
        InvalidInputError: an empty or whitespace-only text, or one with a lone surrogate.
    """
    if isinstance(texts, (str, bytes)):
        raise InputTypeError(f"'{name}' must be a list of str, got a bare {type(texts).__name__}; wrap it in a list.")
    if not isinstance(texts, Sequence):
        raise InputTypeError(f"'{name}' must be a list of str (got {describe(texts)}).")
    out = []
    for i, text in enumerate(texts):
        checked = check_str(text, f"{name}[{i}]")
        assert checked is not None
        if not checked.strip():
            raise InvalidInputError(f"'{name}[{i}]' must hold words for the lexical leg to match (got "
                                    f"{describe(text)}); a blank query matches nothing.")
        out.append(checked)
    return out


def fuse(dense: tuple[np.ndarray, np.ndarray] | None, lexical: tuple[np.ndarray, np.ndarray] | None,
         fusion: Fusion, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best rows of the two legs' candidates (each ``(scores, rows)`` best first; a leg
    may be None when the fusion weighs it 0), as ``(fused scores, rows)``."""
    legs = [leg for leg in (dense, lexical) if leg is not None]
    if not legs:
        return np.empty(0, dtype=np.float32), np.empty(0, dtype=np.int64)
    rows = np.unique(np.concatenate([leg[1][leg[1] >= 0] for leg in legs]))
    if rows.size == 0:
        return np.empty(0, dtype=np.float32), np.empty(0, dtype=np.int64)
    position = {int(row): i for i, row in enumerate(rows.tolist())}
    total = np.zeros(rows.shape[0], dtype=np.float64)
    dense_rank = np.full(rows.shape[0], np.iinfo(np.int64).max, dtype=np.int64)
    for leg_number, leg in enumerate((dense, lexical)):
        if leg is None:
            continue
        scores, leg_rows = leg
        valid = leg_rows >= 0
        scores, leg_rows = scores[valid].astype(np.float64), leg_rows[valid]
        if leg_rows.size == 0:
            continue
        at = np.fromiter((position[int(r)] for r in leg_rows.tolist()), dtype=np.int64, count=leg_rows.size)
        if leg_number == 0:
            dense_rank[at] = np.arange(leg_rows.size)
        if fusion.method == "rrf":
            total[at] += 1.0 / (fusion.rrf_k + np.arange(1, leg_rows.size + 1))
        else:
            assert fusion.alpha is not None
            weight = fusion.alpha if leg_number == 0 else 1.0 - fusion.alpha
            low, high = float(scores.min()), float(scores.max())
            normal = (scores - low) / (high - low) if high > low else np.ones_like(scores)
            total[at] += weight * normal
    order = np.lexsort((rows, dense_rank, -total))[:k]
    return total[order].astype(np.float32), rows[order].astype(np.int64)
