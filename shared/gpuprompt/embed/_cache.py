"""EmbeddingCache: content-addressed embeddings kept in one device tensor (LRU)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["EmbeddingCache"]


class EmbeddingCache:
    """Content-addressed embeddings kept in one device tensor, bounded by entries (LRU).

    Keys are digests of (model id, text). Rows live in a preallocated tensor on the device that
    grows by doubling up to ``capacity``; evicted rows are reused.

    Args:
        dim: embedding dimension.
        capacity: most entries kept.
        device: torch device string.
    """

    def __init__(self, dim: int, capacity: int, device: str) -> None:
        import torch

        self.dim = dim
        self.capacity = capacity
        self.device = device
        self._lock = threading.Lock()
        self._slots: OrderedDict[bytes, int] = OrderedDict()
        self._free: list[int] = []
        self._storage = torch.empty((min(capacity, 1024), dim), dtype=torch.float32, device=device)
        self._used = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._slots)

    def __repr__(self) -> str:
        return f"<EmbeddingCache {len(self)}/{self.capacity} dim={self.dim} device={self.device!r}>"

    def gather(self, keys: Sequence[bytes]) -> tuple[torch.Tensor, list[int]]:
        """Copy out the cached rows for ``keys``.

        Returns:
            ``(rows, positions)``: a ``(m, dim)`` tensor of the hits and their positions in ``keys``.
        """
        import torch

        with self._lock:
            positions: list[int] = []
            slots: list[int] = []
            for position, key in enumerate(keys):
                slot = self._slots.get(key)
                if slot is not None:
                    self._slots.move_to_end(key)
                    positions.append(position)
                    slots.append(slot)
            if not slots:
                return torch.empty((0, self.dim), dtype=torch.float32, device=self.device), positions
            index = torch.tensor(slots, dtype=torch.long, device=self.device)
            return self._storage.index_select(0, index), positions

    def put(self, keys: Sequence[bytes], rows: torch.Tensor) -> None:
        """Store ``rows[i]`` under ``keys[i]``, evicting least recently used entries if full."""
        import torch

        if self.capacity == 0 or not keys:
            return
        with self._lock:
            # A call with more new rows than the whole cache keeps its last `capacity` rows.
            self.evictions += max(0, len(keys) - self.capacity)
            slots: list[int] = []
            rows_kept: list[int] = []
            for i, key in enumerate(keys[-self.capacity :]):
                slot = self._slots.get(key)
                if slot is None:
                    slot = self._allocate()
                    self._slots[key] = slot
                else:
                    self._slots.move_to_end(key)
                slots.append(slot)
                rows_kept.append(i + max(0, len(keys) - self.capacity))
            index = torch.tensor(slots, dtype=torch.long, device=self.device)
            source = rows[torch.tensor(rows_kept, dtype=torch.long, device=rows.device)]
            self._storage.index_copy_(0, index, source.to(self.device, torch.float32))

    def _allocate(self) -> int:
        import torch

        if self._free:
            return self._free.pop()
        if self._used < self.capacity:
            if self._used == self._storage.shape[0]:
                grown = min(self.capacity, self._storage.shape[0] * 2)
                storage = torch.empty((grown, self.dim), dtype=torch.float32, device=self.device)
                storage[: self._used] = self._storage[: self._used]
                self._storage = storage
            self._used += 1
            return self._used - 1
        _, slot = self._slots.popitem(last=False)
        self.evictions += 1
        return slot

    def clear(self) -> None:
        """Drop every entry (the storage is kept for reuse)."""
        with self._lock:
            self._free.extend(self._slots.values())
            self._slots.clear()
