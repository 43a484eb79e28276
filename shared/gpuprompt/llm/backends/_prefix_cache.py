"""Prompt-prefix reuse for the transformers backend: the KV cache of recent prompts, kept so a
later request that starts with the same tokens computes only the rest.

vLLM caches prompt blocks on its own (``enable_prefix_caching``); ``model.generate`` recomputes
every prompt token every time. A chat's turn repeats the conversation so far, and requests with
tools repeat their ~250-token system prompt and tool list, so on CPU most of a reply's time to
first token is spent recomputing what an earlier request already computed.

How a batch uses it (:meth:`PrefixCache.plan`, then :meth:`PrefixCache.store`):

- Each row looks up, on its own, the kept prompt that shares the most leading tokens with it
  (``cached`` tokens; at least its last token is left to compute). Rows with different system
  prompts, or none kept, share a batch with rows that hit.
- The batch is laid out as ``[row's cached tokens][padding][rest of the row]``, the cached zone
  as wide as the longest hit: the kept keys and values fill it (zeros under the padding) and go
  to ``generate`` as ``past_key_values``, so only the rest is computed. The attention mask hides
  the padding and ``generate`` derives positions from the mask, so each row computes exactly what
  it would alone. Without any hit this is plain left padding.
- After the batch, each row's prompt is kept (its keys and values gathered from the cache
  ``generate`` filled); a kept prompt that the new one extends is dropped. Entries are evicted
  least recently used first, within a byte budget. Hits are reported in ``Usage.cached_tokens``,
  as vLLM reports its own.

Only models that keep a plain per-layer key/value stack take part (:meth:`PrefixCache.supports`):
a sliding-window or recurrent layer cannot be cut at a prefix.
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
"""Shorter hits are not used and shorter prompts not kept: they save less than the copy costs."""


@dataclass(frozen=True)
class PrefixPlan:
    """How one batch is laid out and what it reuses.

    Attributes:
        cached: per row, its leading tokens whose keys and values come from a kept prompt.
        past: the ``past_key_values`` to hand to ``generate``: the kept keys and values, as wide
            as the longest hit, or an empty cache for ``generate`` to fill.
        epoch: the cache's reset count when planned (a batch planned before a reset keeps nothing).
    """

    cached: tuple[int, ...]
    past: Any
    epoch: int = 0

    @property
    def width(self) -> int:
        """The cached zone at the start of every row (0 = plain left padding)."""
        return max(self.cached, default=0)


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


def layout(rows: Sequence[Sequence[int]], cached: Sequence[int]) -> tuple[int, list[list[int]]]:
    """The padded width of a batch laid out for ``cached`` and, per row, the positions of its
    prompt tokens in it (``[cached][padding][rest]``; plain left padding when nothing is cached)."""
    head = max(cached, default=0)
    width = head + max(len(row) - hit for row, hit in zip(rows, cached))
    return width, [list(range(hit)) + list(range(width - len(row) + hit, width)) for row, hit in zip(rows, cached)]


class PrefixCache:
    """A byte-bounded LRU of prompts' keys and values for one model.

    Used from the backend's one batch thread; :meth:`reset` and :meth:`stats` may be called
    from any thread.

    Args:
        config: the model's config (its cache layout is built from it).
        max_bytes: most bytes of keys and values kept, on the model's device.
        max_entries: most prompts kept.
    """

    def __init__(self, config: Any, *, max_bytes: int, max_entries: int = 64) -> None:
        self._config = config
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._epoch = 0
        self.lookups = 0
        self.hits = 0

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether ``model`` keeps a plain key/value stack in every layer that ``generate`` will
        take as ``past_key_values`` and compute on from."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        default = getattr(type(model), "_supports_default_dynamic_cache", None)
        if default is not None and not default():  # recurrent or custom caches (rwkv, xlnet, ...)
            return False
        generation = getattr(model, "generation_config", None)
        # A model that asks for its own cache refuses ours; chunked prefill restarts at position 0.
        if getattr(generation, "cache_implementation", None) or getattr(generation, "prefill_chunk_size", None):
            return False
        try:
            layers = DynamicCache(config=model.config).layers
        except Exception:  # a model transformers builds no dynamic cache for
            return False
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    # ------------------------------------------------------------------ a batch
    def plan(self, rows: Sequence[Sequence[int]]) -> PrefixPlan:
        """Each row's longest kept prefix (at least its last token left to compute), and the
        ``past_key_values`` that hold them."""
        hits: list[tuple[_Entry | None, int]] = []
        with self._lock:
            epoch = self._epoch
            self.lookups += len(rows)
            for row in rows:
                head = np.asarray(row[: len(row) - 1], dtype=np.int64)
                best, length = None, 0
                if len(head) >= MIN_TOKENS:
                    for entry in self._entries.values():
                        n = _common(entry.array, head)
                        if n > length:
                            best, length = entry, n
                if best is None or length < MIN_TOKENS:
                    hits.append((None, 0))
                    continue
                self._entries.move_to_end(best.tokens)
                self.hits += 1
                hits.append((best, length))
        cached = tuple(length for _, length in hits)
        return PrefixPlan(cached, self._past(hits), epoch)

    def _past(self, hits: list[tuple[_Entry | None, int]]) -> Any:
        from transformers import DynamicCache

        past = DynamicCache(config=self._config)
        width = max((length for _, length in hits), default=0)
        if not width:
            return past
        first = next(entry for entry, _ in hits if entry is not None)
        for index, (keys, values) in enumerate(first.layers):
            batch_keys = keys.new_zeros((len(hits), keys.shape[1], width, keys.shape[3]))
            batch_values = values.new_zeros((len(hits), values.shape[1], width, values.shape[3]))
            for row, (entry, length) in enumerate(hits):
                if entry is not None:
                    # Zeros under the padding of shorter hits: the attention mask never reads them.
                    batch_keys[row, :, :length] = entry.layers[index][0][0, :, :length]
                    batch_values[row, :, :length] = entry.layers[index][1][0, :, :length]
            past.update(batch_keys, batch_values, index)
        return past

    def store(self, rows: Sequence[Sequence[int]], plan: PrefixPlan, past: Any) -> None:
        """Keep each row's prompt from ``past``, the cache ``generate`` filled for a batch laid out
        as :func:`layout` says for ``plan``. Nothing is kept after a :meth:`reset` since the plan
        (a caller that got its answer and reset the cache must not find its prompt kept)."""
        import torch

        layers = past.layers
        if not layers or layers[0].keys is None:
            return
        per_token = sum(
            layer.keys.shape[1] * layer.keys.shape[3] * layer.keys.element_size()
            + layer.values.shape[1] * layer.values.shape[3] * layer.values.element_size()
            for layer in layers
        )
        _, positions = layout(rows, plan.cached)
        done: set[tuple[int, ...]] = set()
        for row_index, row in enumerate(rows):
            key = tuple(row)
            if len(key) < MIN_TOKENS or key in done or len(key) * per_token > self.max_bytes:
                continue
            done.add(key)
            with self._lock:
                if plan.epoch != self._epoch or self._kept_within(key):
                    continue
            index = torch.tensor(positions[row_index], dtype=torch.long, device=layers[0].keys.device)
            kept = [
                (layer.keys[row_index : row_index + 1].index_select(2, index),
                 layer.values[row_index : row_index + 1].index_select(2, index))
                for layer in layers
            ]
            self._keep(key, kept, len(key) * per_token, plan.epoch)

    def _kept_within(self, key: tuple[int, ...]) -> bool:
        """Whether ``key`` is kept already, alone or as the start of a longer prompt (lock held)."""
        for kept in self._entries:
            if len(kept) >= len(key) and kept[: len(key)] == key:
                self._entries.move_to_end(kept)
                return True
        return False

    def _keep(self, key: tuple[int, ...], layers: list[tuple[Any, Any]], nbytes: int, epoch: int) -> None:
        with self._lock:
            if epoch != self._epoch:
                return
            for kept in [kept for kept in self._entries if len(kept) < len(key) and key[: len(kept)] == kept]:
                self._bytes -= self._entries.pop(kept).nbytes  # the new prompt extends it
            self._entries[key] = _Entry(key, np.asarray(key, dtype=np.int64), layers, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes

    # ------------------------------------------------------------------ management
    def reset(self) -> None:
        """Forget every kept prompt."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._epoch += 1

    def stats(self) -> dict[str, int]:
        """Entries, tokens and bytes kept; rows looked up and rows served so far."""
        with self._lock:
            return {
                "entries": len(self._entries),
                "tokens": sum(len(key) for key in self._entries),
                "bytes": self._bytes,
                "lookups": self.lookups,
                "hits": self.hits,
            }
