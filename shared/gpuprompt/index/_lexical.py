"""The lexical leg of a VectorIndex: BM25 over its stored documents, kept in step with its rows.

Why not bm25s: its index is static (built once over a corpus), and a VectorIndex takes upserts and
deletes at any time. This is the same sparse-matrix idea, made incremental: documents are keyed by
the store's *labels* (fresh for every write, never reused), so a write never rewrites postings:

* a new or replaced document goes to a small in-memory table, frozen into an immutable segment (a
  CSC matrix in numpy arrays, term -> documents; scipy is not needed) at the next search; a
  replaced or deleted document's label is marked dead;
* segments are merged (dead documents dropped) when there are more than 8 or a third of their
  documents are dead, so a search reads a few contiguous columns per query term;
* a search scores exactly with MaxScore pruning (see :meth:`LexicalIndex.search`): the rare query
  terms' postings name the candidate rows, and each candidate's other terms are looked up by binary
  search in their columns, so a term every document holds costs a few lookups, not a pass over its
  postings; a query of common terms only gathers all its postings with numpy slicing and adds up
  the weights per row with one ``bincount``. Either way dead labels and the rows a filter excludes
  (the same ``Allowed`` rows as the dense leg: a pre-filter) are dropped, no Python loop runs over
  documents, and ties rank by row. A term's live document frequency is counted once per segment
  and kept until a document dies.

BM25 as Lucene scores it: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
``tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl))`` with k1 = 1.2 and b = 0.75, where N, df and
avgdl count the live documents at the time of the search (exact, never stale). Records stored without
a document are not in this leg (they can never match a text). The leg is built from the stored
documents at its first search and kept in step by every write after that; a snapshot holds the
documents, so a loaded index rebuilds it from the very records it loaded (the two legs can never
disagree after a crash).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpuprompt.index._lexical_text import tokenize

if TYPE_CHECKING:
    from gpuprompt.index._store import Allowed, Change, Store

__all__ = ["K1", "B", "LexicalIndex", "LexicalStats"]

K1 = 1.2
B = 0.75
_MAX_SEGMENTS = 8
_DEAD_FRACTION = 1 / 3
_FREEZE_AT = 4096  # pending documents frozen into a segment even before a search asks
_BOUND_SLACK = 1.0 + 1e-5  # a term's bound, idf * (k1 + 1), raised past float32 rounding of its weights
_PRUNE_MIN_POSTINGS = 1024  # MaxScore gathers up to this many postings, or a 1/_PRUNE_FRACTION of the documents
_PRUNE_FRACTION = 4


@dataclass(frozen=True)
class LexicalStats:
    """The lexical leg's size.

    Attributes:
        documents: live documents indexed.
        terms: distinct terms seen.
        postings: (term, document) pairs held, dead ones until the next merge included.
        segments: frozen segments.
        bytes: memory held by the postings, the vocabulary excluded.
    """

    documents: int
    terms: int
    postings: int
    segments: int
    bytes: int


class _Live:
    """A segment's live postings per term (a cache, valid while the index's kill count is ``kills``)."""

    __slots__ = ("counts", "kills", "whole")

    def __init__(self) -> None:
        self.kills = -1
        self.whole = False  # no dead document in the segment: a column's length is its live count
        self.counts: dict[int, int] = {}


@dataclass(frozen=True)
class _Segment:
    labels: np.ndarray  # (n,) int64: the label of each document of the segment
    indptr: np.ndarray  # (terms + 1,) int64: CSC column pointers, one column per term id
    docs: np.ndarray  # (postings,) int32: a posting's document, an index into labels (ascending per column)
    tfs: np.ndarray  # (postings,) float32: its term frequency
    live: _Live = field(default_factory=_Live, compare=False, repr=False)

    @property
    def terms(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def nbytes(self) -> int:
        return int(self.labels.nbytes + self.indptr.nbytes + self.docs.nbytes + self.tfs.nbytes)


class LexicalIndex:
    """BM25 postings over a store's documents, keyed by label (see the module docstring).

    Not thread-safe by itself: the VectorIndex applies writes under its write lock and searches under
    its read lock; the search side only freezes pending documents, under a lock of its own.
    """

    def __init__(self) -> None:
        self._vocab: dict[str, int] = {}
        self._segments: list[_Segment] = []
        self._pending: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._alive = np.zeros(0, dtype=bool)
        self._length = np.zeros(0, dtype=np.float32)
        self._row = np.zeros(0, dtype=np.int64)
        self._live = 0
        self._total_length = 0.0
        self._kills = 0  # documents that died: the segments' cached live counts are valid for one value
        self._freeze_lock = threading.Lock()

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, store: Store) -> LexicalIndex:
        """The leg over every document of ``store`` (the caller holds the index's write lock)."""
        index = cls()
        labels = store.labels
        index._grow(int(labels.max()) + 1 if labels.size else 0)
        for row, (label, document) in enumerate(zip(labels.tolist(), store.documents)):
            index._add(label, row, document)
        index._freeze()
        return index

    def _grow(self, labels: int) -> None:
        capacity = self._alive.shape[0]
        if labels <= capacity:
            return
        grown = max(labels, capacity * 2, 1024)
        for name, fill in (("_alive", False), ("_length", 0.0), ("_row", -1)):
            old = getattr(self, name)
            new = np.full(grown, fill, dtype=old.dtype)
            new[:capacity] = old
            setattr(self, name, new)

    def _term_id(self, term: str) -> int:
        found = self._vocab.get(term)
        if found is None:
            found = self._vocab[term] = len(self._vocab)
        return found

    def _add(self, label: int, row: int, document: str | None) -> None:
        self._row[label] = row
        if document is None:
            return
        counts: dict[int, int] = {}
        for token in tokenize(document):
            term = self._term_id(token)
            counts[term] = counts.get(term, 0) + 1
        length = float(sum(counts.values()))
        if not counts:
            return
        self._pending.append((label, np.fromiter(counts.keys(), dtype=np.int64, count=len(counts)),
                              np.fromiter(counts.values(), dtype=np.float32, count=len(counts))))
        self._alive[label] = True
        self._length[label] = length
        self._live += 1
        self._total_length += length

    def _kill(self, label: int) -> None:
        if label < self._alive.shape[0] and self._alive[label]:
            self._alive[label] = False
            self._kills += 1
            self._live -= 1
            self._total_length -= float(self._length[label])
        if label < self._row.shape[0]:
            self._row[label] = -1

    # ------------------------------------------------------------------ writes (write lock held)
    def apply_upsert(self, change: Change, documents: list[str | None]) -> None:
        """Follow a planned upsert (called before the store applies it)."""
        self._grow(int(change.labels.max()) + 1 if change.labels.size else 0)
        for label in change.removed_labels.tolist():
            self._kill(label)
        for label, row, document in zip(change.labels.tolist(), change.rows.tolist(), documents):
            self._add(label, row, document)
        if len(self._pending) >= _FREEZE_AT:
            self._freeze()

    def apply_delete(self, change: Change, store: Store) -> None:
        """Follow a planned delete (called before the store applies it: it still holds the moved labels)."""
        for label in change.removed_labels.tolist():
            self._kill(label)
        if change.move_src.size:
            moved = store.labels[change.move_src]
            self._row[moved] = change.move_dst
        self._maybe_merge()

    # ------------------------------------------------------------------ segments
    def _freeze(self) -> None:
        with self._freeze_lock:
            self._freeze_locked()

    def _freeze_locked(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        terms = len(self._vocab)
        labels = np.fromiter((label for label, _, _ in pending), dtype=np.int64, count=len(pending))
        sizes = np.fromiter((ids.shape[0] for _, ids, _ in pending), dtype=np.int64, count=len(pending))
        term_ids = np.concatenate([ids for _, ids, _ in pending])
        tfs = np.concatenate([counts for _, _, counts in pending])
        docs = np.repeat(np.arange(len(pending), dtype=np.int32), sizes)
        self._segments = [*self._segments, _csc(labels, docs, term_ids, tfs, terms)]  # a new list: readers keep theirs
        self._maybe_merge()

    def _maybe_merge(self) -> None:
        segments = self._segments
        if not segments:
            return
        documents = sum(s.labels.shape[0] for s in segments)
        dead = documents - int(sum(int(self._alive[s.labels].sum()) for s in segments))
        if len(segments) <= _MAX_SEGMENTS and dead <= documents * _DEAD_FRACTION:
            return
        terms = len(self._vocab)
        labels, docs, term_ids, tfs, offset = [], [], [], [], 0
        for segment in segments:
            keep = self._alive[segment.labels]
            new_index = np.cumsum(keep) - 1 + offset
            counts = np.diff(segment.indptr)
            columns = np.repeat(np.arange(segment.terms, dtype=np.int64), counts)
            live = keep[segment.docs]
            labels.append(segment.labels[keep])
            docs.append(new_index[segment.docs[live]].astype(np.int32))
            term_ids.append(columns[live])
            tfs.append(segment.tfs[live])
            offset += int(keep.sum())
        self._segments = [_csc(np.concatenate(labels), np.concatenate(docs), np.concatenate(term_ids),
                               np.concatenate(tfs), terms)] if offset else []

    def clear(self) -> None:
        """Forget every document."""
        self.__init__()  # type: ignore[misc]

    # ------------------------------------------------------------------ search (read lock held)
    def search(self, text: str, k: int, allowed: Allowed | None, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The best ``k`` rows for ``text`` by BM25, as ``(scores, rows)`` best first (fewer when
        fewer rows contain a query term; ties by row).

        Exact top-k with MaxScore pruning: the query's terms are taken rarest first (highest bound
        on what one term can add, ``idf * (k1 + 1)``) until the ``k``-th best full score among the
        rows holding one of them beats what the remaining terms could add together; then only
        those rows are scored (each by all its terms, looked up in the columns). A term held by
        every document (``sku``, ``price``) thus costs a few binary searches, not a pass over its
        postings. A query whose rare terms hold too many postings is scored in one pass over all
        its postings. Both give the same scores, summed in the same order.

        Args:
            text: the query text.
            k: most rows returned.
            allowed: the rows a filter selects (a pre-filter), or None for every row.
            size: the store's row count.
        """
        segments = self._frozen()
        terms = sorted({self._vocab[t] for t in tokenize(text) if t in self._vocab})
        if not terms or self._live == 0 or size == 0:
            return _empty()
        idfs: dict[int, float] = {}
        for term in terms:  # term-id order: the order every row's score is summed in
            df = self._df(segments, term)
            if df:
                idfs[term] = math.log(1.0 + (self._live - df + 0.5) / (df + 0.5))
        if not idfs:
            return _empty()
        average = self._total_length / self._live
        found = self._pruned(segments, idfs, k, allowed, average)
        if found is None:
            found = self._scan(segments, idfs, allowed, average, size)
        return _top(*found, k)

    def _pruned(self, segments: list[_Segment], idfs: dict[int, float], k: int, allowed: Allowed | None,
                average: float) -> tuple[np.ndarray, np.ndarray] | None:
        """``(scores, rows)`` of the rows that can reach the top ``k`` (MaxScore), or None when the
        rare terms hold more postings than pays (the caller then scans every posting)."""
        bound = {term: idf * (K1 + 1) * _BOUND_SLACK for term, idf in idfs.items()}
        order = sorted(idfs, key=lambda term: (-bound[term], term))
        budget = max(_PRUNE_MIN_POSTINGS, self._live // _PRUNE_FRACTION)
        picked: list[list[np.ndarray]] = [[] for _ in segments]
        gathered = 0
        for p, term in enumerate(order):
            for s, segment in enumerate(segments):
                start, stop = _column(segment, term)
                if start < stop:
                    picked[s].append(segment.docs[start:stop])
                    gathered += stop - start
            if gathered > budget:
                return None
            last = p + 1 == len(order)
            candidates = self._candidates(segments, picked, allowed)
            count = sum(docs.shape[0] for docs in candidates)
            if count < k and not last:
                continue
            scores, rows = self._score(segments, candidates, idfs, average)
            if last:
                return scores, rows  # every row holding a query term is a candidate
            # A row holding none of the terms taken so far scores at most what the rest can add.
            rest = math.fsum(bound[t] for t in order[p + 1:])
            if rest < np.partition(scores, count - k)[count - k]:
                return scores, rows
        return None  # pragma: no cover - the last term always returns

    def _candidates(self, segments: list[_Segment], picked: list[list[np.ndarray]],
                    allowed: Allowed | None) -> list[np.ndarray]:
        """Per segment, the live (and allowed) documents among the picked postings, sorted."""
        out = []
        for segment, parts in zip(segments, picked):
            if not parts:
                out.append(np.empty(0, dtype=np.int32))
                continue
            docs = np.unique(np.concatenate(parts)) if len(parts) > 1 else parts[0]
            labels = segment.labels[docs]
            keep = self._alive[labels]
            if allowed is not None:
                keep &= allowed.mask[np.maximum(self._row[labels], 0)]
            out.append(docs[keep])
        return out

    def _score(self, segments: list[_Segment], candidates: list[np.ndarray], idfs: dict[int, float],
               average: float) -> tuple[np.ndarray, np.ndarray]:
        """The full BM25 scores of ``candidates`` (every query term looked up in its column),
        summed term by term in id order in float64: the same sums as :meth:`_scan`."""
        labels = np.concatenate([segment.labels[docs] for segment, docs in zip(segments, candidates)])
        scores = np.zeros(labels.shape[0], dtype=np.float64)
        for term, idf in idfs.items():
            offset = 0
            for segment, docs in zip(segments, candidates):
                start, stop = _column(segment, term)
                if start < stop and docs.shape[0]:
                    column = segment.docs[start:stop]
                    at = np.minimum(np.searchsorted(column, docs), stop - start - 1)
                    held = np.flatnonzero(column[at] == docs)
                    if held.shape[0]:
                        tfs = segment.tfs[start + at[held]]
                        lengths = self._length[labels[offset + held]]
                        weights = idf * tfs * (K1 + 1) / (tfs + K1 * (1 - B + B * lengths / average))
                        scores[offset + held] += weights.astype(np.float64)
                offset += docs.shape[0]
        return scores, self._row[labels]

    def _scan(self, segments: list[_Segment], idfs: dict[int, float], allowed: Allowed | None, average: float,
              size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, rows)`` of every row holding a query term: one pass over all their postings."""
        rows_parts, weight_parts = [], []
        for term, idf in idfs.items():
            labels, tfs = self._postings(segments, term)
            lengths = self._length[labels]
            weights = idf * tfs * (K1 + 1) / (tfs + K1 * (1 - B + B * lengths / average))
            rows = self._row[labels]
            if allowed is not None:
                keep = allowed.mask[rows]
                rows, weights = rows[keep], weights[keep]
            rows_parts.append(rows)
            weight_parts.append(weights)
        rows = np.concatenate(rows_parts)
        if rows.size == 0:
            return _empty()
        scores = np.bincount(rows, weights=np.concatenate(weight_parts).astype(np.float64), minlength=size)
        found = np.flatnonzero(scores > 0)
        return scores[found], found

    def _df(self, segments: list[_Segment], term: int) -> int:
        """A term's live document frequency: its postings in segments without dead documents, else
        its live postings counted once per segment and kept until the next document dies."""
        total = 0
        for segment in segments:
            start, stop = _column(segment, term)
            if start == stop:
                continue
            live = segment.live
            if live.kills != self._kills:
                live.counts = {}
                live.whole = bool(self._alive[segment.labels].all())
                live.kills = self._kills
            if live.whole:
                total += stop - start
                continue
            count = live.counts.get(term)
            if count is None:
                count = live.counts[term] = int(self._alive[segment.labels[segment.docs[start:stop]]].sum())
            total += count
        return total

    def _frozen(self) -> list[_Segment]:
        """The segments with every pending document in them (frozen now if needed)."""
        with self._freeze_lock:
            if self._pending:
                self._freeze_locked()
            return self._segments

    def _postings(self, segments: list[_Segment], term: int) -> tuple[np.ndarray, np.ndarray]:
        """A term's live postings over ``segments``: ``(labels, term frequencies)``."""
        labels, tfs = [], []
        for segment in segments:
            start, stop = _column(segment, term)
            if start == stop:
                continue
            labels.append(segment.labels[segment.docs[start:stop]])
            tfs.append(segment.tfs[start:stop])
        if not labels:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        all_labels, all_tfs = np.concatenate(labels), np.concatenate(tfs)
        live = self._alive[all_labels]
        return all_labels[live], all_tfs[live]

    def stats(self) -> LexicalStats:
        """The leg's size (pending documents frozen first)."""
        segments = self._frozen()
        postings = sum(int(s.docs.shape[0]) for s in segments)
        held = sum(s.nbytes for s in segments) + self._alive.nbytes + self._length.nbytes + self._row.nbytes
        return LexicalStats(documents=self._live, terms=len(self._vocab), postings=postings,
                            segments=len(self._segments), bytes=held)


def _empty() -> tuple[np.ndarray, np.ndarray]:
    return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.int64)


def _column(segment: _Segment, term: int) -> tuple[int, int]:
    """The posting range of ``term`` in ``segment`` (empty when the term is newer than the segment)."""
    if term >= segment.terms:
        return 0, 0
    return int(segment.indptr[term]), int(segment.indptr[term + 1])


def _top(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of ``(scores, rows)``, score descending then row ascending (ties at the cut
    kept by row too), as ``(float32 scores, int64 rows)``."""
    if scores.shape[0] > k:
        cut = np.partition(scores, scores.shape[0] - k)[scores.shape[0] - k]
        above = np.flatnonzero(scores > cut)
        tied = np.flatnonzero(scores == cut)
        tied = tied[np.argsort(rows[tied], kind="stable")[: k - above.shape[0]]]
        keep = np.concatenate([above, tied])
        scores, rows = scores[keep], rows[keep]
    order = np.lexsort((rows, -scores))
    return scores[order].astype(np.float32), rows[order].astype(np.int64)


def _csc(labels: np.ndarray, docs: np.ndarray, term_ids: np.ndarray, tfs: np.ndarray, terms: int) -> _Segment:
    """A segment in CSC layout: postings sorted by term, column pointers per term id."""
    order = np.argsort(term_ids, kind="stable")
    counts = np.bincount(term_ids, minlength=terms)
    indptr = np.zeros(terms + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return _Segment(labels=labels, indptr=indptr, docs=docs[order].astype(np.int32), tfs=tfs[order].astype(np.float32))

