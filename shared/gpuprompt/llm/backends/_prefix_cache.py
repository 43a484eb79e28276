"""Prompt-prefix reuse for the transformers backend: the KV cache of recent prompts, kept so a
later batch that starts with the same tokens computes only the rest.

vLLM caches prompt blocks on its own (``enable_prefix_caching``); ``model.generate`` recomputes
every prompt token every time. A chat's turn repeats the conversation so far, and requests with
tools repeat their ~250-token system prompt and tool list, so on CPU most of a reply's time to
first token is spent recomputing what the previous request already computed.

How a batch uses it (:meth:`PrefixCache.plan`, then :meth:`PrefixCache.store`):

- The rows of a batch share their first ``shared`` tokens (the whole prompt but its last token
  for a batch of one). They are laid out as ``[shared][padding][rest of the row]`` instead of
  left-padded: the attention mask hides the padding and ``generate`` derives positions from the
  mask, so each row computes exactly what it would alone, and the first ``shared`` positions of
  every row hold the same keys and values.
- If a kept entry starts with some of those tokens, its keys and values are handed to
  ``generate`` as ``past_key_values`` (copied across the batch) and only the tokens after them
  are computed (``cached`` tokens, reported in ``Usage.cached_tokens`` as vLLM reports its hits).
- After the batch, the first ``shared`` positions of row 0 are kept as a new entry (an entry
  that the new one extends is dropped). Entries are evicted least recently used first, within a
  byte budget.

Only models whose cache is a plain per-layer key/value stack (transformers' ``DynamicLayer`` for
every layer) take part: a sliding-window or recurrent layer cannot be cut at a prefix.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PrefixCache", "PrefixPlan"]

MIN_TOKENS = 16
"""Shorter shared prefixes are neither kept nor looked up: they save less than the copy costs."""


@dataclass(frozen=True)
class PrefixPlan:
    """How one batch is laid out and what it reuses.

    Attributes:
        shared: tokens every row starts with that sit before the padding (0 = plain left padding).
        cached: of those, the tokens whose keys and values come from a kept entry.
        past: the ``past_key_values`` to hand to ``generate`` (None when nothing is reused).
        epoch: the cache's reset count when planned (a batch planned before a reset keeps nothing).
    """

    shared: int
    cached: int
    past: Any = None
    epoch: int = 0


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    array: np.ndarray  # the same tokens, for fast comparison
    layers: list[tuple[Any, Any]]  # (keys, values) per layer, batch 1, ``tokens`` long
    nbytes: int


def _common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def shared_prefix(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all ``rows`` have in common."""
    first = np.asarray(rows[0], dtype=np.int64)
    n = len(first)
    for row in rows[1:]:
        n = _common(first[:n], np.asarray(row, dtype=np.int64))
    return n


class PrefixCache:
    """A byte-bounded LRU of prompt prefixes' keys and values for one model.

    Used from the backend's one batch thread; :meth:`reset` and :meth:`stats` may be called
    from any thread.

    Args:
        config: the model's config (its cache layout is built from it).
        max_bytes: most bytes of keys and values kept, on the model's device.
        max_entries: most prefixes kept.
    """

    def __init__(self, config: Any, *, max_bytes: int, max_entries: int = 64) -> None:
        self._config = config
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.lookups = 0
        self._epoch = 0

    @staticmethod
    def supports(config: Any) -> bool:
        """Whether a model with this config keeps a plain key/value stack in every layer."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        try:
            layers = DynamicCache(config=config).layers
        except Exception:  # a model transformers builds no dynamic cache for
            return False
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    # ------------------------------------------------------------------ a batch
    def plan(self, rows: Sequence[Sequence[int]]) -> PrefixPlan:
        """The layout of a batch of prompts and the kept keys and values it can start from.

        Every row keeps at least its last token to compute (``generate`` needs one to predict
        the next).
        """
        shared = min(shared_prefix(rows), min(len(row) for row in rows) - 1)
        if shared < MIN_TOKENS:
            return PrefixPlan(0, 0)
        head = np.asarray(rows[0][:shared], dtype=np.int64)
        with self._lock:
            epoch = self._epoch
            self.lookups += 1
            best, length = None, 0
            for entry in self._entries.values():
                n = _common(entry.array, head)
                if n > length:
                    best, length = entry, n
            if best is None or length < MIN_TOKENS:
                return PrefixPlan(shared, 0, epoch=epoch)
            self._entries.move_to_end(best.tokens)
            self.hits += 1
        return PrefixPlan(shared, length, self._past(best, length, len(rows)), epoch)

    def empty(self) -> Any:
        """A fresh cache for ``generate`` to fill (so :meth:`store` can read it afterwards)."""
        from transformers import DynamicCache

        return DynamicCache(config=self._config)

    def _past(self, entry: _Entry, length: int, batch: int) -> Any:
        past = self.empty()
        for index, (keys, values) in enumerate(entry.layers):
            # DynamicLayer.update concatenates onto an empty tensor: the expanded view is copied.
            past.update(
                keys[:, :, :length].expand(batch, -1, -1, -1),
                values[:, :, :length].expand(batch, -1, -1, -1),
                index,
            )
        return past

    def store(self, tokens: Sequence[int], past: Any, epoch: int | None = None) -> None:
        """Keep the first ``len(tokens)`` positions of row 0 of ``past`` (a cache ``generate``
        filled for a batch laid out by :meth:`plan`) as the entry for ``tokens``.

        ``epoch`` is the plan's: after a :meth:`reset` since then, nothing is kept (a caller that
        got its answer and reset the cache must not find that batch's prompt kept afterwards).
        """
        key = tuple(tokens)
        if len(key) < MIN_TOKENS:
            return
        with self._lock:
            if epoch is not None and epoch != self._epoch:
                return
            for kept in self._entries:
                if kept[: len(key)] == key:  # already kept, or inside a longer entry
                    self._entries.move_to_end(kept)
                    return
        layers = [
            (layer.keys[:1, :, : len(key)].clone(), layer.values[:1, :, : len(key)].clone())
            for layer in past.layers
        ]
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        with self._lock:
            if epoch is not None and epoch != self._epoch:
                return
            for kept in [kept for kept in self._entries if key[: len(kept)] == kept]:
                self._bytes -= self._entries.pop(kept).nbytes  # the new entry extends it
            self._entries[key] = _Entry(key, np.asarray(key, dtype=np.int64), layers, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes

    # ------------------------------------------------------------------ management
    def reset(self) -> None:
        """Forget every kept prefix."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._epoch += 1

    def stats(self) -> dict[str, int]:
        """Entries, tokens and bytes kept; lookups and hits so far."""
        with self._lock:
            return {
                "entries": len(self._entries),
                "tokens": sum(len(key) for key in self._entries),
                "bytes": self._bytes,
                "lookups": self.lookups,
                "hits": self.hits,
            }
