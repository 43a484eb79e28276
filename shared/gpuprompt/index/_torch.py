"""Exact search with torch: the backend for CUDA (fp16) and the exact kernel every path falls back to.

Scores are computed block by block and merged into a running top-k, so memory stays bounded
(``budget_bytes`` per block) whatever the collection size.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt.errors import DeviceOutOfMemoryError
from gpuprompt.index._store import Allowed, Change, Store

if TYPE_CHECKING:
    import torch

__all__ = ["FLOAT16_MAX", "TorchBackend", "exact_topk", "l2_scores_from_keys", "normalize_rows"]

FLOAT16_MAX = 65504.0
"""The largest float16 value: what the fp16 storage can hold under the ``"ip"`` and ``"l2"`` metrics."""

_QUERY_CHUNK = 8192
_SUBSET_FRACTION = 0.25  # a filter selecting fewer rows than this gathers them instead of masking


def _budget(device: str) -> int:
    return (256 << 20) if device.startswith("cuda") else (64 << 20)


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """Unit-length rows (float32), safe for any finite values: zero rows stay zero.

    Each row is first divided by its largest absolute value, so the norm is computed on values in
    [-1, 1] and cannot overflow (``torch.nn.functional.normalize`` of a row of 1e20s gives zeros).
    """
    import torch

    x = x.float()
    scale = x.abs().amax(dim=1, keepdim=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.nn.functional.normalize(x / scale, dim=1)


def exact_topk(
    queries: torch.Tensor,
    matrix: torch.Tensor,
    k: int,
    *,
    l2_norms: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    budget_bytes: int = 64 << 20,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by dot product (or by L2 when ``l2_norms`` is given), in bounded memory.

    Args:
        queries: ``(q, d)`` in the matrix's dtype and device.
        matrix: ``(n, d)``.
        k: results per query (cut to ``n``).
        l2_norms: squared norms of the matrix rows, float32 ``(n,)``: rank by L2 distance; the
            returned keys are ``2 q.x - |x|^2`` (see :func:`l2_scores_from_keys`).
        mask: bool ``(n,)``: only these rows may be returned.
        budget_bytes: the most memory one block of scores may take.

    Returns:
        ``(keys, rows)``: float32 ``(q, k)`` ranking keys (descending) and int64 ``(q, k)`` rows;
        a row is -1 where fewer than ``k`` rows were allowed.
    """
    import torch

    n, q = matrix.shape[0], queries.shape[0]
    k = min(k, n)
    device = matrix.device
    if k <= 0 or q == 0:
        return (
            torch.empty((q, 0), dtype=torch.float32, device=device),
            torch.empty((q, 0), dtype=torch.long, device=device),
        )
    if q > _QUERY_CHUNK:
        parts = [
            exact_topk(
                queries[i : i + _QUERY_CHUNK], matrix, k, l2_norms=l2_norms, mask=mask, budget_bytes=budget_bytes
            )
            for i in range(0, q, _QUERY_CHUNK)
        ]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    block_rows = max(1024, budget_bytes // (4 * q))
    best_keys: torch.Tensor | None = None
    best_rows: torch.Tensor | None = None
    for start in range(0, n, block_rows):
        stop = min(n, start + block_rows)
        keys = (queries @ matrix[start:stop].T).float()
        if l2_norms is not None:
            keys.mul_(2.0).sub_(l2_norms[start:stop])
        # topk ranks NaN first: a NaN key (an overflow in low precision) must rank last instead.
        keys.nan_to_num_(nan=-math.inf)
        if mask is not None:
            keys.masked_fill_(~mask[start:stop], -math.inf)
        values, rows = keys.topk(min(k, stop - start), dim=1)
        rows += start
        if best_keys is None:
            best_keys, best_rows = values, rows
        else:
            merged_keys = torch.cat([best_keys, values], dim=1)
            merged_rows = torch.cat([best_rows, rows], dim=1)
            best_keys, order = merged_keys.topk(k, dim=1)
            best_rows = merged_rows.gather(1, order)
    assert best_keys is not None and best_rows is not None
    if mask is not None:
        best_rows = torch.where(mask[best_rows], best_rows, torch.full_like(best_rows, -1))
    return best_keys, best_rows


def l2_scores_from_keys(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Turn :func:`exact_topk` L2 keys into scores ``1 / (1 + squared distance)``."""
    qn = queries.float().pow(2).sum(dim=1, keepdim=True)
    return 1.0 / (1.0 + (qn - keys).clamp_min(0.0))


class TorchBackend:
    """All vectors in one device matrix, rows mirroring the store's rows; exact search.

    Args:
        dim: vector dimension.
        metric: ``"cosine"`` (rows stored normalised), ``"ip"`` or ``"l2"``.
        device: a resolved torch device string.
        dtype: ``"float16"`` / ``"bfloat16"`` / ``"float32"``; None = fp16 on CUDA, fp32 elsewhere.
    """

    name = "torch"
    exact = True

    def __init__(self, dim: int, metric: str, device: str, dtype: str | None = None) -> None:
        import torch

        self.dim = dim
        self.metric = metric
        self.device = device
        self.dtype_name = dtype or ("float16" if device.startswith("cuda") else "float32")
        self._dtype = getattr(torch, self.dtype_name)
        self._matrix = torch.empty((0, dim), dtype=self._dtype, device=device)
        self._norms = torch.empty(0, dtype=torch.float32, device=device)
        self._size = 0

    def __repr__(self) -> str:
        return f"<TorchBackend {self.device} {self.dtype_name} rows={self._size}>"

    def describe(self) -> str:
        """A short label for reprs and reports."""
        return f"torch:{self.device}:{self.dtype_name}"

    @property
    def tombstones(self) -> int:
        """Always 0: rows are removed for real."""
        return 0

    @property
    def max_abs(self) -> float | None:
        """The largest absolute value a stored vector may hold, or None for no limit beyond float32.

        fp16 storage holds at most :data:`FLOAT16_MAX`; cosine rows are normalised before they are
        stored, so only ``"ip"`` and ``"l2"`` are limited.
        """
        return FLOAT16_MAX if self.dtype_name == "float16" and self.metric != "cosine" else None

    # ------------------------------------------------------------------ writes
    def _prepare(self, vectors: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        x = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.device)
        if self.metric == "cosine":
            return normalize_rows(x).to(self._dtype), torch.ones(x.shape[0], dtype=torch.float32, device=self.device)
        return x.to(self._dtype), x.pow(2).sum(dim=1)

    def _reserve(self, size: int) -> None:
        import torch

        capacity = self._matrix.shape[0]
        if size <= capacity:
            return
        grown = max(size, capacity * 2, 1024)
        matrix = torch.empty((grown, self.dim), dtype=self._dtype, device=self.device)
        matrix[: self._size] = self._matrix[: self._size]
        norms = torch.empty(grown, dtype=torch.float32, device=self.device)
        norms[: self._size] = self._norms[: self._size]
        self._matrix, self._norms = matrix, norms

    def rebuild(self, store: Store) -> None:
        """Replace the contents with the store's vectors, row for row."""
        self._load(store.vectors)

    def _load(self, vectors: np.ndarray) -> None:
        import torch

        self._matrix = torch.empty((0, self.dim), dtype=self._dtype, device=self.device)
        self._norms = torch.empty(0, dtype=torch.float32, device=self.device)
        self._size = 0
        self._guard(lambda: self._reserve(vectors.shape[0]))
        for start in range(0, vectors.shape[0], 65536):
            chunk = vectors[start : start + 65536]
            x, norms = self._guard(lambda chunk=chunk: self._prepare(chunk))
            self._matrix[start : start + chunk.shape[0]] = x
            self._norms[start : start + chunk.shape[0]] = norms
        self._size = vectors.shape[0]

    def apply(self, change: Change) -> None:
        """Mirror one store change (writes rows, moves rows, resizes)."""
        import torch

        if change.rows.size:
            self._guard(lambda: self._reserve(change.size))
            x, norms = self._guard(lambda: self._prepare(change.vectors))
            rows = torch.from_numpy(change.rows).to(self.device)
            self._matrix.index_copy_(0, rows, x)
            self._norms.index_copy_(0, rows, norms)
        if change.move_src.size:
            src = torch.from_numpy(change.move_src).to(self.device)
            dst = torch.from_numpy(change.move_dst).to(self.device)
            self._matrix.index_copy_(0, dst, self._matrix.index_select(0, src))
            self._norms.index_copy_(0, dst, self._norms.index_select(0, src))
        self._size = change.size

    def reset(self) -> None:
        """Drop every row."""
        self._load(np.empty((0, self.dim), dtype=np.float32))

    @property
    def needs_compaction(self) -> bool:
        """Never: rows are removed for real."""
        return False

    # ------------------------------------------------------------------ reads
    def queries(self, queries: Any) -> torch.Tensor:
        """Queries as a float32 device tensor (normalised for cosine)."""
        import torch

        if isinstance(queries, np.ndarray):
            x = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(self.device)
        else:
            x = queries.to(self.device, torch.float32)
        if self.metric == "cosine":
            x = normalize_rows(x)
        return x

    def search(self, queries: Any, k: int, allowed: Allowed | None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k.

        Returns:
            ``(scores, rows)`` as numpy ``(q, k')`` arrays; rows are store rows, -1 for padding.
        """
        import torch

        q = self.queries(queries)
        n = self._size
        matrix = self._matrix[:n]
        norms = self._norms[:n] if self.metric == "l2" else None
        subset: torch.Tensor | None = None
        mask: torch.Tensor | None = None
        if allowed is not None:
            if allowed.count <= _SUBSET_FRACTION * n:
                subset = allowed.derived.get("torch_rows")
                if subset is None:
                    subset = torch.from_numpy(allowed.rows).to(self.device)
                    allowed.derived["torch_rows"] = subset
                matrix = matrix.index_select(0, subset)
                norms = norms.index_select(0, subset) if norms is not None else None
            else:
                mask = allowed.derived.get("torch_mask")
                if mask is None:
                    mask = torch.from_numpy(allowed.mask).to(self.device)
                    allowed.derived["torch_mask"] = mask

        # |q|^2 - 2 q.x + |x|^2 cancels catastrophically in half precision for near neighbours:
        # fetch twice as many, then rescore those as sum((x - q)^2) in float32 and keep the best k.
        rescore = self.metric == "l2" and self.dtype_name != "float32"
        fetch = min(2 * k, matrix.shape[0]) if rescore else k

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            with torch.inference_mode():
                keys, rows = exact_topk(
                    q.to(self._dtype), matrix, fetch, l2_norms=norms, mask=mask, budget_bytes=_budget(self.device)
                )
                if rescore and rows.numel():
                    candidates = matrix[rows.clamp_min(0)].float()  # (q, fetch, d)
                    d2 = (candidates - q.unsqueeze(1)).pow(2).sum(dim=2)
                    d2 = d2.masked_fill(rows < 0, math.inf)
                    d2, order = d2.topk(min(k, d2.shape[1]), dim=1, largest=False)
                    rows = rows.gather(1, order)
                    keys = 1.0 / (1.0 + d2)
                elif self.metric == "l2":
                    keys = l2_scores_from_keys(keys, q)
                if subset is not None and rows.numel():
                    rows = subset[rows]
                return keys, rows

        keys, rows = self._guard(run)
        return keys.cpu().numpy(), rows.cpu().numpy()

    def gather(self, rows: np.ndarray) -> torch.Tensor:
        """The stored vectors of ``rows`` as float32 on the device (normalised for cosine)."""
        import torch

        index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(self.device)
        return self._matrix.index_select(0, index).float()

    # ------------------------------------------------------------------ helpers
    def _guard(self, fn: Any) -> Any:
        import torch

        try:
            return fn()
        except torch.cuda.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            raise DeviceOutOfMemoryError(
                f"out of device memory in the torch index backend on {self.device} ({self._size} rows of "
                f"dim {self.dim}, {self.dtype_name}); use dtype='float16', a smaller batch, or backend='faiss'."
            ) from exc
