"""AnswerCache: a bounded semantic cache of answers, keyed by prompt meaning, kept on the device.

A lookup first tries the exact prompt (no embedding needed), then the most similar cached prompt
of the same namespace (one matrix-vector product on the device). A prompt longer than the
embedder reads (its ``max_length`` tokens) is matched exactly only: its vector would stand for its
beginning alone, so two RAG prompts that differ only in the question at their end would look the
same. Entries expire (TTL) and the least recently used go first when the cache is full, so memory
stays bounded.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpuprompt.errors import ConfigurationError
from gpuprompt.validation import check_clock, check_int, check_number, check_str, check_ttl, fail

if TYPE_CHECKING:
    import torch

    from gpuprompt.protocols import EmbedderLike

__all__ = ["DEFAULT_MAX_ENTRIES", "DEFAULT_TTL_SECONDS", "AnswerCache", "AnswerCacheStats"]

V = TypeVar("V")

MAX_ENTRIES_LIMIT = 10_000_000
DEFAULT_MAX_ENTRIES = 10_000
"""Most answers an :class:`AnswerCache` keeps unless told otherwise (the adapters' default too)."""
DEFAULT_TTL_SECONDS = 3600.0
"""An answer's default lifetime, in seconds."""


@dataclass(frozen=True)
class AnswerCacheStats:
    """Counters of an :class:`AnswerCache`.

    Attributes:
        entries: answers held now.
        exact_hits: lookups answered by the exact prompt.
        similar_hits: lookups answered by a similar prompt.
        misses: lookups that found nothing close enough.
        evicted: entries dropped because the cache was full.
        expired: entries dropped because their TTL passed.
    """

    entries: int
    exact_hits: int
    similar_hits: int
    misses: int
    evicted: int
    expired: int


@dataclass
class _Entry(Generic[V]):
    namespace: str
    value: V
    expires_at: float | None
    row: int | None  # row in the namespace's matrix; None: matched exactly only (a text too long to embed whole)


class _Space:
    """One namespace's embeddings: a device matrix whose rows are reused after eviction."""

    def __init__(self) -> None:
        self.matrix: torch.Tensor | None = None
        self.keys: list[str | None] = []
        self.free: list[int] = []

    def put(self, key: str, vector: torch.Tensor) -> int:
        import torch

        if self.free:
            row = self.free.pop()
            self.keys[row] = key
        else:
            row = len(self.keys)
            self.keys.append(key)
            if self.matrix is None or row >= self.matrix.shape[0]:
                capacity = max(16, 2 * row)
                grown = torch.zeros((capacity, vector.shape[-1]), dtype=vector.dtype, device=vector.device)
                if self.matrix is not None:
                    grown[:row] = self.matrix[:row]
                self.matrix = grown
        assert self.matrix is not None
        self.matrix[row] = vector
        return row

    def drop(self, row: int) -> None:
        self.keys[row] = None
        self.free.append(row)

    def best(self, query: torch.Tensor) -> tuple[str | None, float]:
        if self.matrix is None or not self.keys:
            return None, float("-inf")
        scores = self.matrix[: len(self.keys)] @ query
        for row in self.free:
            scores[row] = float("-inf")
        score, row = scores.max(dim=0)
        key = self.keys[int(row)]
        return key, float(score)


class AnswerCache(Generic[V]):
    """A semantic answer cache: a prompt close enough to a cached one gets the cached answer.

    Example:
        >>> from gpuprompt import AnswerCache, get_runtime
        >>> cache = AnswerCache(get_runtime().embedder(), score_threshold=0.9)
        >>> cache.update("What is your return policy?", "smollm2", "30 days, free returns.")
        >>> cache.lookup("What's your return policy?", "smollm2")
        '30 days, free returns.'
        >>> cache.lookup("What's your return policy?", "another-model") is None
        True

    Args:
        embedder: embeds prompts (an :class:`~gpuprompt.protocols.EmbedderLike`; ``connect().answer_cache()``
            builds a cache over the process's shared embedder).
        score_threshold: the least cosine similarity, in [-1, 1], that counts as the same prompt.
        max_entries: most answers kept; the least recently used go first.
        ttl_seconds: an answer's lifetime (None: no expiry).
        clock: the time source (for tests).
    """

    def __init__(
        self,
        embedder: EmbedderLike,
        *,
        score_threshold: float = 0.95,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        ttl_seconds: float | None = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.score_threshold = check_number(score_threshold, "score_threshold", min=-1.0, max=1.0, error=ConfigurationError)
        self.max_entries = check_int(max_entries, "max_entries", min=1, max=MAX_ENTRIES_LIMIT, error=ConfigurationError)
        ttl_seconds = check_ttl(ttl_seconds)
        if embedder is None:
            raise ConfigurationError(
                "AnswerCache needs an embedder: AnswerCache(connect().embedder(), ...), or connect().answer_cache()."
            )
        if not callable(getattr(embedder, "embed_tensor", None)):
            raise fail("embedder", "a gpuprompt.Embedder (an EmbedderLike)", embedder, error=ConfigurationError)
        check_clock(clock)
        self.ttl_seconds = ttl_seconds
        self._embedder = embedder
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry[V]] = OrderedDict()
        self._spaces: dict[str, _Space] = {}
        self._exact_hits = self._similar_hits = self._misses = self._evicted = self._expired = 0

    def __repr__(self) -> str:
        return f"<AnswerCache entries={len(self)} score_threshold={self.score_threshold} max_entries={self.max_entries}>"

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def embedder(self) -> EmbedderLike:
        """The embedder for prompts."""
        return self._embedder

    # ------------------------------------------------------------------ sync
    def lookup(
        self, prompt: str, namespace: str, *, text: str | None = None, score_threshold: float | None = None
    ) -> V | None:
        """The answer cached for ``prompt`` (or a similar enough prompt) in ``namespace``.

        Args:
            prompt: the prompt, matched exactly first.
            namespace: the model or settings the answer belongs to; namespaces never mix.
            text: what the similarity is measured on, when not the prompt itself (an adapter
                passes the messages' text of a serialised chat prompt).
            score_threshold: the least cosine similarity, in [-1, 1], for this lookup only
                (default: the cache's ``score_threshold``); an exact repeat always hits. One cache
                can so serve callers of different thresholds (``gpuprompt serve`` does).

        Raises:
            InputTypeError: ``prompt``, ``namespace`` or ``text`` is not a str.
            InvalidInputError: one holds a lone surrogate, or ``score_threshold`` is not a number
                in [-1, 1].
        """
        key, text = self._check(prompt, namespace, text)
        threshold = self._threshold(score_threshold)
        found = self._exact(key)
        if found is not None:
            return found
        if not self._has_space(namespace) or not self._embeddable(text):
            return self._miss()
        return self._similar(namespace, self._embed(text), threshold)

    def update(self, prompt: str, namespace: str, value: V, *, text: str | None = None) -> None:
        """Cache ``value`` for ``prompt`` in ``namespace`` (replacing an older entry); ``text`` as
        in :meth:`lookup`. A text longer than the embedder reads is kept for exact repeats only."""
        key, text = self._check(prompt, namespace, text)
        self._store(key, namespace, value, self._embed(text) if self._embeddable(text) else None)

    # ------------------------------------------------------------------ async
    async def alookup(
        self, prompt: str, namespace: str, *, text: str | None = None, score_threshold: float | None = None
    ) -> V | None:
        """Async :meth:`lookup`: the prompt is embedded by the batched embedder, off the loop."""
        key, text = self._check(prompt, namespace, text)
        threshold = self._threshold(score_threshold)
        found = self._exact(key)
        if found is not None:
            return found
        if not self._has_space(namespace) or not await self._aembeddable(text):
            return self._miss()
        return self._similar(namespace, await self._aembed(text), threshold)

    async def aupdate(self, prompt: str, namespace: str, value: V, *, text: str | None = None) -> None:
        """Async :meth:`update`."""
        key, text = self._check(prompt, namespace, text)
        self._store(key, namespace, value, await self._aembed(text) if await self._aembeddable(text) else None)

    # ------------------------------------------------------------------ housekeeping
    def clear(self, namespace: str | None = None) -> None:
        """Forget every entry, or only those of ``namespace``."""
        if namespace is not None:
            check_str(namespace, "namespace")
        with self._lock:
            if namespace is None:
                self._entries.clear()
                self._spaces.clear()
                return
            for key in [k for k, e in self._entries.items() if e.namespace == namespace]:
                del self._entries[key]
            self._spaces.pop(namespace, None)

    async def aclear(self, namespace: str | None = None) -> None:
        """Async :meth:`clear` (in memory: it does not wait on anything)."""
        self.clear(namespace)

    def stats(self) -> AnswerCacheStats:
        """A snapshot of the counters."""
        with self._lock:
            return AnswerCacheStats(
                entries=len(self._entries),
                exact_hits=self._exact_hits,
                similar_hits=self._similar_hits,
                misses=self._misses,
                evicted=self._evicted,
                expired=self._expired,
            )

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _check(prompt: Any, namespace: Any, text: Any) -> tuple[str, str]:
        """The entry's key and the text to embed, all three arguments checked."""
        check_str(prompt, "prompt")
        check_str(namespace, "namespace")
        check_str(text, "text", allow_none=True)
        digest = hashlib.sha256()
        digest.update(namespace.encode("utf-8"))
        digest.update(b"\0")
        digest.update(prompt.encode("utf-8"))
        return digest.hexdigest(), prompt if text is None else text

    def _threshold(self, score_threshold: Any) -> float:
        """The threshold of one lookup: its own, checked, or the cache's."""
        if score_threshold is None:
            return self.score_threshold  # type: ignore[return-value]
        return check_number(score_threshold, "score_threshold", min=-1.0, max=1.0)  # type: ignore[return-value]

    def _embeddable(self, text: str) -> bool:
        """Whether the embedder reads ``text`` whole (no more than its ``max_length`` tokens).

        An embedder that cannot count tokens (no ``count_tokens`` and ``max_length``, such as a remote
        one) is trusted to read it whole.
        """
        count = getattr(self.embedder, "count_tokens", None)
        if not callable(count) or not hasattr(type(self.embedder), "max_length"):
            return True
        limit = int(self.embedder.max_length)  # type: ignore[attr-defined]
        probe = _probe(text, limit)
        n = count([probe], truncate=False)[0]
        if n <= limit and len(probe) < len(text):  # a prefix of very long tokens: count it all
            n = count([text], truncate=False)[0]
        return n <= limit

    async def _aembeddable(self, text: str) -> bool:
        """Async :meth:`_embeddable` (the embedder's ``acount_tokens``, off the loop when long)."""
        count = getattr(self.embedder, "acount_tokens", None)
        if not callable(count) or not hasattr(type(self.embedder), "max_length"):
            return True
        await self.embedder.aload()
        limit = int(self.embedder.max_length)  # type: ignore[attr-defined]
        probe = _probe(text, limit)
        n = (await count([probe], truncate=False))[0]
        if n <= limit and len(probe) < len(text):
            n = (await count([text], truncate=False))[0]
        return n <= limit

    def _miss(self) -> None:
        with self._lock:
            self._misses += 1

    def _embed(self, prompt: str) -> torch.Tensor:
        return _unit(self.embedder.embed_tensor([prompt])[0])

    async def _aembed(self, prompt: str) -> torch.Tensor:
        embedder = self.embedder
        await embedder.aload()
        return _unit((await embedder.aembed_tensor([prompt]))[0])

    def _has_space(self, namespace: str) -> bool:
        with self._lock:
            space = self._spaces.get(namespace)
            return space is not None and len(space.keys) > len(space.free)

    def _live(self, key: str, now: float) -> _Entry[V] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at is not None and now >= entry.expires_at:
            self._remove(key, entry)
            self._expired += 1
            return None
        return entry

    def _exact(self, key: str) -> V | None:
        with self._lock:
            entry = self._live(key, self._clock())
            if entry is None:
                return None
            self._entries.move_to_end(key)
            self._exact_hits += 1
            return entry.value

    def _similar(self, namespace: str, query: torch.Tensor, threshold: float) -> V | None:
        with self._lock:
            now = self._clock()
            space = self._spaces.get(namespace)
            while space is not None:
                key, score = space.best(query)
                if key is None or score < threshold:
                    break
                entry = self._live(key, now)
                if entry is None:
                    continue  # it had expired: look again without it
                self._entries.move_to_end(key)
                self._similar_hits += 1
                return entry.value
            self._misses += 1
            return None

    def _store(self, key: str, namespace: str, value: V, vector: torch.Tensor | None) -> None:
        with self._lock:
            old = self._entries.get(key)
            if old is not None:
                self._remove(key, old)
            row = None if vector is None else self._spaces.setdefault(namespace, _Space()).put(key, vector)
            expires = None if self.ttl_seconds is None else self._clock() + self.ttl_seconds
            self._entries[key] = _Entry(namespace, value, expires, row)
            while len(self._entries) > self.max_entries:
                oldest_key, oldest = next(iter(self._entries.items()))
                self._remove(oldest_key, oldest)
                self._evicted += 1

    def _remove(self, key: str, entry: _Entry[V]) -> None:
        del self._entries[key]
        if entry.row is None:
            return
        space = self._spaces.get(entry.namespace)
        if space is not None:
            space.drop(entry.row)
            if len(space.free) == len(space.keys):
                del self._spaces[entry.namespace]


def _probe(text: str, limit: int) -> str:
    """A prefix of ``text`` long enough to hold more than ``limit`` tokens unless its tokens are
    unusually long (more than 16 characters each on average)."""
    return text[: 16 * (limit + 1)]


def _unit(vector: torch.Tensor) -> torch.Tensor:
    import torch

    vector = vector.to(torch.float32)
    norm = torch.linalg.vector_norm(vector)
    return vector / norm if float(norm) > 0 else vector
