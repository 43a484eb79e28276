"""The embedder's tokenisation: count tokens on the caller's thread, and tokenise each text once.

A sentence-transformers model tokenises inside ``preprocess`` on the batch worker. The callers
already tokenise every text to count its cost for the batcher, so the worker would tokenise the
same texts twice; on a CPU the worker's batch tokenisation (about 0.9 ms for 32 short queries) is a
tenth of an int8 forward pass and runs on the one thread every caller waits for. :class:`Tokens`
keeps the caller's encoding and pads it into the model's features on the worker instead.

That shortcut is only taken where it is exact: at load, :meth:`Tokens.verify` compares its features
with the model's own ``preprocess`` on probe texts (empty, padded with spaces, over-long, accented,
mixed case, several lines); any difference, a slow tokenizer or a model that is not a plain
transformer keeps ``preprocess``. Vectors are the same either way.

A fast tokenizer reads a whole text before it truncates it: one 8 MB string took seconds, on
whichever thread counted it. :meth:`Tokens.bounded` reads a long text from a prefix instead, where
that is exact (see there), so a text's cost is bounded by the model's max length, not by its size.
"""

from __future__ import annotations

import copy
import logging
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["LOOP_CHARS", "Encoded", "Tokens", "quick_on_loop"]

logger = logging.getLogger("gpuprompt.embed")

_PROBES = (
    "",
    "  padded with spaces  ",
    "Mixed CASE, punctuation!? and digits 12345",
    "accents: naïve café Ünïcödé — “quotes”",
    "several\nlines\tand\ttabs",
    "emoji 🙂 and CJK 東京",
    "a long text " * 300,  # past any max_seq_length: exercises truncation
    "a much longer text " * 2000,  # read from a prefix (Tokens.bounded)
)
_TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids")
_CHARS_PER_TOKEN = 16
"""A text longer than ``max_length`` times this many characters is read from a prefix (:meth:`Tokens.bounded`)."""
_MARGIN = 8
"""Tokens a prefix must hold past ``max_length`` before it stands for the whole text."""
_SPACES = (" ", "\n", "\t", "\r")
LOOP_CHARS = 65_536
"""Most characters an async call tokenises on the event loop thread; more go to a worker thread."""


def quick_on_loop(items: int, chars: int, max_items: int) -> bool:
    """Whether an async call may tokenise ``items`` texts of ``chars`` characters in all on the loop
    thread (few and short: the thread hop would cost more); otherwise a worker thread does it."""
    return items <= max_items and chars <= LOOP_CHARS


_CUT_PROBES = (
    "a long text " * 2000,
    "Mixed CASE, punctuation!? and digits 12345; accents: naïve café — “quotes” emoji 🙂 and CJK 東京\n" * 400,
    "several\nlines\tand\ttabs " * 3000,
)


@dataclass(frozen=True)
class Encoded:
    """One text as the model reads it.

    Attributes:
        tokens: its token count, special tokens included, capped at the model's max length.
        truncated: whether the text was longer than the max length.
        ids: the token ids (truncated), or None where the worker tokenises itself.
        type_ids: the token type ids, or None.
    """

    tokens: int
    truncated: bool
    ids: np.ndarray | None = None
    type_ids: np.ndarray | None = None


class Tokens:
    """Counts and encodes texts with private copies of a fast tokenizer (not thread-safe: callers
    hold the embedder's lock), and pads encodings into model features on the worker.

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        max_length: the model's max sequence length.
    """

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.max_length = max_length
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._tokenizer = tokenizer if backend is None else None
        self._counter = self._truncating = None
        if backend is not None:
            self._counter = copy.deepcopy(backend)
            self._counter.no_truncation()
            self._counter.no_padding()
            self._truncating = copy.deepcopy(backend)
            self._truncating.no_padding()
            self._truncating.enable_truncation(max_length, strategy="longest_first")
        self._cut_at = max(4096, max_length * _CHARS_PER_TOKEN)
        self._cuts = self._truncating is not None and self._prefix_is_exact()
        self._pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)
        self._right = getattr(tokenizer, "padding_side", "right") == "right"
        self._extras: dict[str, Any] | None = None  # set by verify(): the shortcut is on

    @property
    def pretokenizes(self) -> bool:
        """Whether :meth:`encode` keeps ids for :meth:`features` (set by :meth:`verify`)."""
        return self._extras is not None

    def bounded(self, texts: list[str]) -> list[str]:
        """``texts``, each very long one replaced by a prefix that the model reads as the same tokens.

        A prefix that ends just before a whitespace character splits into the same words as the
        whole text up to there (every tokenizer here splits words at whitespace), so its tokens are
        the first tokens of the whole text. When it holds more than ``max_length`` of them, the
        truncated encoding, the count capped at ``max_length`` and the truncation flag are those of
        the whole text. A text with no whitespace near the cut, or whose prefix is too short (long
        runs of spaces), is read whole. Checked at load on long probe texts (:meth:`_prefix_is_exact`);
        off where a probe differs.
        """
        if not self._cuts:
            return texts
        prefixes = {i: self._prefix(text) for i, text in enumerate(texts) if len(text) > self._cut_at}
        prefixes = {i: prefix for i, prefix in prefixes.items() if prefix is not None}
        if not prefixes:
            return texts
        out = list(texts)
        for i, n in zip(prefixes, self.count(list(prefixes.values()))):
            if n > self.max_length + _MARGIN:
                out[i] = prefixes[i]
        return out

    def bounded_pairs(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """``pairs`` (query, document), a very long text of a pair read from a prefix where the pair's
        truncated encoding stays the same (:meth:`bounded`).

        Cutting a pair's texts to ``max_length`` together (``longest_first``) depends on their
        lengths only through the shorter one and which one is longer (the longer keeps the odd token;
        on a tie, the second), so one text is cut when the other is short enough to read whole and its
        prefix stays the longer of the two. When both are very long, both are counted whole (linear
        time) and cut to prefixes that keep which one is longer: read whole, the pair's truncation
        builds every combination of the two texts' overflowing windows (a pair of two 300 kB texts
        took 10 GB and 20 s).
        """
        if not self._cuts or all(len(q) <= self._cut_at and len(d) <= self._cut_at for q, d in pairs):
            return pairs
        out = list(pairs)
        for i, (query, document) in enumerate(pairs):
            long_query, long_document = len(query) > self._cut_at, len(document) > self._cut_at
            if long_query and long_document:
                out[i] = self._both_long(query, document)
                continue
            if not (long_query or long_document):
                continue
            short = document if long_query else query
            [bounded] = self.bounded([query if long_query else document])
            if len(bounded) == len(query if long_query else document):
                continue
            cut, other = self.count([bounded, short])
            if cut > other + _MARGIN:  # the prefix is still the longer text, by a margin
                out[i] = (bounded, document) if long_query else (query, bounded)
        return out

    def _both_long(self, query: str, document: str) -> tuple[str, str]:
        first_longer = operator.gt(*self.count([query, document]))  # the whole texts' order
        q, d = self._longer_than(query, self.max_length + _MARGIN), self._longer_than(document, self.max_length + _MARGIN)
        if q is None or d is None:
            return query, document
        (q, nq), (d, nd) = q, d
        if first_longer and nq <= nd:
            q, nq = self._longer_than(query, nd) or (query, nq)
        elif not first_longer and nq > nd:
            d, nd = self._longer_than(document, nq - 1) or (document, nd)
        return (q, d) if (nq > nd) == first_longer else (query, document)

    def _longer_than(self, text: str, tokens: int) -> tuple[str, int] | None:
        """The shortest of ever longer prefixes of ``text`` (cut as :meth:`_prefix`) holding more
        than ``tokens`` tokens, with its count; None if no prefix does."""
        at = self._cut_at
        while at < len(text):
            prefix = self._prefix(text, at)
            if prefix is not None:
                [n] = self.count([prefix])
                if n > tokens:
                    return prefix, n
            at *= 2
        return None

    def _prefix(self, text: str, at: int | None = None) -> str | None:
        at = at or self._cut_at
        end = max(text.rfind(space, at // 2, at) for space in _SPACES)
        return text[:end] if end > 0 else None

    def _prefix_is_exact(self) -> bool:
        """Whether every long probe's prefix encodes (truncated) exactly as the whole probe."""
        assert self._truncating is not None
        for probe in _CUT_PROBES:
            prefix = self._prefix(probe)
            if prefix is None:
                continue
            whole, cut = self._truncating.encode_batch([probe, prefix], add_special_tokens=True)
            if whole.ids != cut.ids or whole.type_ids != cut.type_ids or bool(whole.overflowing) != bool(cut.overflowing):
                logger.info("embedder: a long text's prefix tokenises differently; long texts are read whole")
                return False
        return True

    def count(self, texts: list[str]) -> list[int]:
        """Each text's token count, special tokens included, not truncated."""
        if self._counter is not None:
            return [len(encoding.ids) for encoding in self._counter.encode_batch(texts, add_special_tokens=True)]
        encoded = self._tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        return [len(ids) for ids in encoded]

    def capped(self, texts: list[str]) -> list[int]:
        """Each text's token count, special tokens included, capped at ``max_length``."""
        return [min(n, self.max_length) for n in self.count(self.bounded(texts))]

    def encode(self, texts: list[str]) -> list[Encoded]:
        """Each text's capped count and truncation flag, plus its ids when the shortcut is on."""
        texts = self.bounded(texts)
        if not self.pretokenizes:
            return [Encoded(min(n, self.max_length), n > self.max_length) for n in self.count(texts)]
        assert self._truncating is not None
        out = []
        for encoding in self._truncating.encode_batch(texts, add_special_tokens=True):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            out.append(Encoded(len(ids), bool(encoding.overflowing), ids, np.asarray(encoding.type_ids, dtype=np.int64)))
        return out

    def features(self, encoded: list[Encoded]) -> dict[str, Any]:
        """The padded features of a batch, as the model's ``preprocess`` would return them."""
        import torch

        width = max(len(item.ids) for item in encoded)  # type: ignore[arg-type]
        ids = np.full((len(encoded), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(encoded), width), dtype=np.int64)
        types = np.zeros((len(encoded), width), dtype=np.int64)
        for row, item in enumerate(encoded):
            n = len(item.ids)  # type: ignore[arg-type]
            where = slice(0, n) if self._right else slice(width - n, width)
            ids[row, where] = item.ids
            mask[row, where] = 1
            types[row, where] = item.type_ids
        assert self._extras is not None
        features = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if "token_type_ids" in self._extras["_keys"]:
            features["token_type_ids"] = torch.from_numpy(types)
        features.update({k: v for k, v in self._extras.items() if k != "_keys"})
        return features

    def verify(self, preprocess: Any) -> bool:
        """Turn the shortcut on if it reproduces ``preprocess`` exactly on the probe texts.

        Args:
            preprocess: the model's ``preprocess(texts) -> features``.

        Returns:
            Whether the shortcut is on.
        """
        if self._truncating is None:
            return False
        try:
            expected = [preprocess(list(_PROBES)), preprocess([_PROBES[2]])]
            tensors = [k for k, v in expected[0].items() if hasattr(v, "shape")]
            extras = {k: v for k, v in expected[0].items() if k not in tensors}
            if not set(tensors) <= set(_TOKEN_KEYS) or "input_ids" not in tensors:
                return False
            if extras != {k: v for k, v in expected[1].items() if not hasattr(v, "shape")}:
                return False
            if not all(isinstance(v, (str, int, float, bool, type(None))) for v in extras.values()):
                return False
            self._extras = {**extras, "_keys": tuple(tensors)}
            for texts, want in zip((list(_PROBES), [_PROBES[2]]), expected):
                if not _same(self.features(self.encode(texts)), want, tensors):
                    self._extras = None
                    logger.info("embedder: the model's own preprocess differs from its tokenizer; keeping it")
                    return False
        except Exception as exc:  # noqa: BLE001 - any surprise keeps the model's own path
            self._extras = None
            logger.info("embedder: pre-tokenisation is off (%s)", exc)
            return False
        return True


def _same(got: dict[str, Any], want: dict[str, Any], tensors: list[str]) -> bool:
    import torch

    if set(got) != set(want):
        return False
    for key, value in want.items():
        if key not in tensors:
            if got[key] != value:
                return False
        elif got[key].shape != value.shape or not torch.equal(got[key], value.cpu().to(got[key].dtype)):
            return False
    return True
