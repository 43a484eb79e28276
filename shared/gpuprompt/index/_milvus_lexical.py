"""MilvusIndex's lexical leg: BM25 as client-side sparse vectors in a ``SPARSE_FLOAT_VECTOR`` field.

Each record's document is written with a sparse vector of its terms (the tokenizer of
:mod:`gpuprompt.index._lexical_text`: codes such as ``SKU-48213-QX`` whole and in parts), keyed by a
stable 32-bit hash of the term, weighted by BM25's term-frequency saturation
``tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl))``. A query is a sparse vector of its distinct
terms weighted by ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``: Milvus's inner product of the two is
the BM25 score, ranked by Milvus (a sparse inverted index) under the same filter expression as the
dense leg.

The approximations, stated: ``avgdl`` is the average document length of the collection's first write
with documents (kept in the collection's properties, so every writer weighs alike); ``N`` and ``df``
are counted by this handle, from the stored documents at its first lexical search and kept in step by
its own writes (writes by other processes are found by the sparse search at once but weigh in the idf
only after :meth:`MilvusIndex.refresh_lexical` or a reopen). With one writing handle and one write of
the corpus, the scores equal :class:`~gpuprompt.VectorIndex`'s (up to float32 rounding and hash
collisions of distinct terms, about one pair in a million at 100k terms).

Why not Milvus's own BM25 function (Milvus 2.5+ servers): Milvus Lite has none, and its analyzers
split ``SKU-48213-QX`` into parts, losing the whole code that these questions name; client-side
vectors give the same leg on Lite, a server and a cluster.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import Counter
from collections.abc import Iterable

from gpuprompt.index._lexical import B, K1
from gpuprompt.index._lexical_text import term_counts
from gpuprompt.index._milvus_schema import LEXICAL_FIELD

__all__ = ["AVGDL_PROPERTY", "FIELD", "NO_TERMS", "LexicalCounts", "document_vector", "first_avgdl", "term_key"]

FIELD = LEXICAL_FIELD
"""The sparse vector field of a MilvusIndex collection made with a lexical leg."""
AVGDL_PROPERTY = "gpuprompt.bm25.avgdl"
NO_TERMS = {0: 1e-30}
"""The vector of a record without words (Milvus refuses an empty sparse vector; no query has key 0)."""
_KEYS = 2**32 - 2  # Milvus's sparse indices are uint32 below 2**32 - 1; 0 is reserved


def term_key(term: str) -> int:
    """The stable sparse index of a term: 1 .. 2**32 - 2 (blake2b, the same in every process)."""
    digest = hashlib.blake2b(term.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "little") % _KEYS + 1


def _keyed(text: str) -> Counter[int]:
    counts: Counter[int] = Counter()
    for term, tf in term_counts(text).items():
        counts[term_key(term)] += tf
    return counts


def document_vector(document: str | None, avgdl: float) -> dict[int, float]:
    """The sparse vector written with a document (``NO_TERMS`` for none, or one without words)."""
    if not document:
        return dict(NO_TERMS)
    counts = _keyed(document)
    length = sum(counts.values())
    if not length:
        return dict(NO_TERMS)
    norm = K1 * (1 - B + B * length / avgdl)
    return {key: tf * (K1 + 1) / (tf + norm) for key, tf in counts.items()}


def first_avgdl(documents: Iterable[str | None]) -> float | None:
    """The average length (in tokens) of the documents with words, or None if none has any."""
    lengths = [n for n in (sum(term_counts(d).values()) for d in documents if d) if n]
    return sum(lengths) / len(lengths) if lengths else None


class LexicalCounts:
    """``N`` and per-term ``df`` of a collection's documents, as this handle knows them (thread-safe)."""

    def __init__(self) -> None:
        self._df: Counter[int] = Counter()
        self._documents = 0
        self._lock = threading.Lock()

    @property
    def documents(self) -> int:
        """Documents with words counted."""
        return self._documents

    def add(self, documents: Iterable[str | None]) -> None:
        """Count documents written (records without words are not counted)."""
        self._change(documents, 1)

    def remove(self, documents: Iterable[str | None]) -> None:
        """Uncount documents replaced or deleted."""
        self._change(documents, -1)

    def _change(self, documents: Iterable[str | None], sign: int) -> None:
        keyed = [set(_keyed(d)) for d in documents if d]
        with self._lock:
            for keys in keyed:
                if not keys:
                    continue
                self._documents += sign
                for key in keys:
                    self._df[key] += sign
                    if self._df[key] <= 0:
                        del self._df[key]

    def clear(self) -> None:
        """Forget every count (the collection was emptied)."""
        with self._lock:
            self._df.clear()
            self._documents = 0

    def query_vector(self, text: str) -> dict[int, float]:
        """The sparse query of ``text``: its distinct known terms weighted by idf (empty if none is known)."""
        with self._lock:
            n = self._documents
            out = {}
            for key in _keyed(text):
                df = self._df.get(key, 0)
                if df:
                    out[key] = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            return out
