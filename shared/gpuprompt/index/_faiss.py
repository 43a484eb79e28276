"""The faiss backend: CPU Flat / HNSW / IVF (any factory string), GPU Flat / IVF when faiss has GPUs.

Records carry int64 labels that never repeat. Indexes that can remove entries do so for real;
the others (HNSW, NSG, GPU indexes) keep tombstones that searches skip, and are rebuilt from the
store's master copy when tombstones pass ``compact_fraction`` of the live records.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from gpuprompt.errors import ConfigurationError, DependencyError, EngineError
from gpuprompt.index._store import Allowed, Change, Store

__all__ = ["FaissBackend", "faiss_gpu_available", "import_faiss"]

logger = logging.getLogger(__name__)

_SELECT_FRACTION = 0.5  # filters selecting at most this share of rows use an IDSelector, broader ones over-fetch
_ADD_CHUNK = 65536


def import_faiss() -> Any:
    """Import faiss or raise a DependencyError with the install command."""
    try:
        import faiss
    except ImportError as exc:
        raise DependencyError(
            "the faiss index backend needs faiss: pip install faiss-cpu (or a faiss GPU build); or use backend='torch'."
        ) from exc
    return faiss


def faiss_gpu_available() -> bool:
    """Whether the installed faiss was built with GPU support and sees a GPU."""
    try:
        import faiss
    except ImportError:
        return False
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _metric_type(faiss: Any, metric: str) -> int:
    return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT


def _normalized(vectors: np.ndarray) -> np.ndarray:
    """Unit-length float32 rows, safe for any finite values (zero rows stay zero).

    Rows are scaled by their largest absolute value first, so the norm cannot overflow float32.
    """
    x = np.asarray(vectors, dtype=np.float32)
    if x.size == 0:
        return np.ascontiguousarray(x)
    scale = np.abs(x).max(axis=1, keepdims=True)
    scale[scale == 0] = 1.0
    x = x / scale
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return np.ascontiguousarray(x / norms, dtype=np.float32)


def _strip_idmap(factory: str) -> str:
    parts = [part.strip() for part in factory.split(",")]
    if parts and parts[0] in ("IDMap", "IDMap2"):
        parts = parts[1:]
    return ",".join(parts)


class FaissBackend:
    """A faiss index over the store's vectors, addressed by labels.

    Args:
        dim: vector dimension.
        metric: ``"cosine"`` (vectors normalised, inner product), ``"ip"`` or ``"l2"``.
        factory: a faiss ``index_factory`` string (``"Flat"``, ``"HNSW32"``, ``"IVF1024,Flat"``, ...).
        device: ``"cpu"`` or a CUDA device (needs a faiss GPU build; Flat and IVF only).
        ef_search: HNSW ``efSearch`` (default 64, raised to k and for selective filters).
        ef_construction: HNSW ``efConstruction`` (default 100; faiss's 40 builds 2x faster but, on
            clustered 384-d data, gave recall@10 0.94 at efSearch 32 where 100 gave 0.99).
        nprobe: IVF lists probed (default ``max(8, nlist // 128)``).
        compact_fraction: rebuild when tombstones exceed this share of live records.
        index: an already built index to adopt (snapshot loading); its labels must match the store.
    """

    name = "faiss"

    def __init__(
        self,
        dim: int,
        metric: str,
        factory: str = "Flat",
        *,
        device: str = "cpu",
        ef_search: int | None = None,
        ef_construction: int | None = None,
        nprobe: int | None = None,
        compact_fraction: float = 0.25,
        index: Any = None,
    ) -> None:
        faiss = import_faiss()
        self._faiss = faiss
        self.dim = dim
        self.metric = metric
        self.factory = _strip_idmap(factory or "Flat")
        self.device = device
        self.ef_search = ef_search
        self.ef_construction = ef_construction or 100
        self.nprobe = nprobe
        self.compact_fraction = compact_fraction
        self._gpu = device.startswith("cuda")
        if self._gpu and not faiss_gpu_available():
            raise ConfigurationError(
                f"device {device!r} with backend='faiss' needs a faiss GPU build; this faiss has no GPU "
                "support. Use backend='torch' (exact search on the GPU) or device='cpu'."
            )
        self._gpu_res: Any = None
        self._tombstones = 0
        self._live_bitmap: tuple[int, np.ndarray] | None = None
        self._configure(self._new_cpu_index() if index is None else index, place=True)

    # ------------------------------------------------------------------ construction
    def _new_cpu_index(self) -> Any:
        faiss = self._faiss
        try:
            return faiss.index_factory(self.dim, self.factory, _metric_type(faiss, self.metric))
        except RuntimeError as exc:
            raise ConfigurationError(
                f"'index_factory' must be a faiss index_factory string such as 'Flat', 'HNSW32' or "
                f"'IVF1024,Flat' (got {self.factory!r}: {str(exc).splitlines()[0][:160]})."
            ) from exc

    def _configure(self, index: Any, *, place: bool) -> None:
        """Adopt ``index`` (CPU, maybe already wrapped) and work out what it can do."""
        faiss = self._faiss
        # downcast_index returns a proxy that does not own the C++ index: keep the owner alive.
        self._owner = index
        index = faiss.downcast_index(index)
        wrapped = isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2))
        core = faiss.downcast_index(index.index) if wrapped else index
        self._ivf = faiss.try_extract_index_ivf(core)
        inner = core
        while isinstance(inner, faiss.IndexPreTransform):
            inner = faiss.downcast_index(inner.index)
        self._hnsw = isinstance(inner, faiss.IndexHNSW)
        if self._hnsw:
            inner.hnsw.efConstruction = self.ef_construction
        self.exact = isinstance(inner, faiss.IndexFlat)
        if self._ivf is not None:
            self._removal = "native"
        elif isinstance(inner, faiss.IndexFlatCodes):
            self._removal = "compacting"  # removal shifts the codes in order: safe under IndexIDMap2
        else:
            self._removal = "tombstone"
        if self._ivf is None and not wrapped:
            index = faiss.IndexIDMap2(index)
            wrapped = True
        self._wrapped = wrapped
        self._cpu_index = index
        self._index = index
        if place and self._gpu and index.is_trained:
            self._index = self._to_gpu(index)

    def _to_gpu(self, index: Any) -> Any:
        faiss = self._faiss
        if self._hnsw or not (self.exact or self._ivf is not None):
            raise ConfigurationError(
                f"faiss GPU indexes cover Flat and IVF; {self.factory!r} cannot go to {self.device}. "
                "Use device='cpu' for it, or backend='torch' for exact search on the GPU."
            )
        if self._gpu_res is None:
            self._gpu_res = faiss.StandardGpuResources()
        device = int(self.device.split(":")[1]) if ":" in self.device else 0
        gpu = faiss.index_cpu_to_gpu(self._gpu_res, device, index)
        # GPU indexes cannot remove entries nor take an IDSelector: tombstones and over-fetching.
        self._removal = "tombstone"
        return gpu

    def describe(self) -> str:
        """A short label for reprs and reports."""
        return f"faiss:{self.factory}:{'gpu' if self._gpu else 'cpu'}"

    def __repr__(self) -> str:
        return f"<FaissBackend {self.describe()} ntotal={self._index.ntotal} tombstones={self._tombstones}>"

    # ------------------------------------------------------------------ state
    @property
    def is_trained(self) -> bool:
        """Whether the index can take vectors (IVF/PQ need training first)."""
        return bool(self._index.is_trained)

    @property
    def train_size(self) -> int:
        """How many records are needed before training (faiss asks 39 points per centroid)."""
        need = 1000
        if self._ivf is not None:
            need = max(need, 39 * int(self._ivf.nlist))
        if "PQ" in self.factory or "RQ" in self.factory or "LSQ" in self.factory:
            need = max(need, 39 * 256)
        return need

    @property
    def tombstones(self) -> int:
        """Stale entries still inside the index."""
        return self._tombstones

    @property
    def needs_compaction(self) -> bool:
        """Whether tombstones exceed ``compact_fraction`` of the live entries."""
        live = self._index.ntotal - self._tombstones
        return self._tombstones > max(16, self.compact_fraction * live)

    def _prepare(self, vectors: np.ndarray) -> np.ndarray:
        if self.metric == "cosine":
            return _normalized(vectors)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    # ------------------------------------------------------------------ writes
    def _add(self, vectors: np.ndarray, labels: np.ndarray) -> None:
        for start in range(0, vectors.shape[0], _ADD_CHUNK):
            chunk = self._prepare(vectors[start : start + _ADD_CHUNK])
            self._index.add_with_ids(chunk, np.ascontiguousarray(labels[start : start + _ADD_CHUNK], dtype=np.int64))

    def _remove(self, labels: np.ndarray) -> None:
        if not labels.size:
            return
        if self._removal == "tombstone":
            self._tombstones += int(labels.size)
            return
        removed = self._index.remove_ids(np.ascontiguousarray(labels, dtype=np.int64))
        if removed != labels.size:
            raise EngineError(f"faiss removed {removed} of {labels.size} entries; the index is out of sync.")

    def apply(self, change: Change) -> None:
        """Mirror one store change. An untrained index ignores writes until :meth:`maybe_train`."""
        if not self.is_trained:
            return
        self._remove(change.removed_labels)
        if change.rows.size:
            self._add(change.vectors, change.labels)

    def maybe_train(self, store: Store) -> bool:
        """Train and fill an untrained index once the store holds enough records.

        Returns:
            Whether the index is trained now.
        """
        if self.is_trained:
            return True
        if store.size < self.train_size:
            return False
        sample = store.vectors
        # 64 points per centroid: k-means quality is flat beyond ~40 (faiss's own minimum is 39),
        # and training time grows linearly with the sample.
        limit = max(self.train_size, 64 * int(self._ivf.nlist) if self._ivf is not None else 0)
        if sample.shape[0] > limit:
            picks = np.sort(np.random.default_rng(0).choice(sample.shape[0], limit, replace=False))
            sample = sample[picks]
        if self._ivf is not None:
            # 10 k-means iterations instead of faiss's 25: the partition's recall barely moves, and
            # training is most of an IVF build (measured: 1M x 384, 2048 lists, ~20 s on 2 cores).
            self._ivf.cp.niter = min(int(self._ivf.cp.niter), 10)
        logger.info("training faiss %s on %d vectors", self.factory, sample.shape[0])
        self._cpu_index.train(self._prepare(sample))
        if self._gpu:
            self._index = self._to_gpu(self._cpu_index)
        self._add(store.vectors, store.labels)
        return True

    def rebuild(self, store: Store) -> None:
        """Empty the index (keeping its training) and add the store's records: drops tombstones."""
        self._index.reset()
        self._tombstones = 0
        self._live_bitmap = None
        if self.is_trained:
            self._add(store.vectors, store.labels)
        else:
            self.maybe_train(store)

    def reset(self) -> None:
        """Drop every entry (training is kept)."""
        self._index.reset()
        self._tombstones = 0
        self._live_bitmap = None

    # ------------------------------------------------------------------ reads
    def _params(self, k: int, selector: Any, fraction: float) -> Any:
        faiss = self._faiss
        if self._ivf is not None:
            nlist = int(self._ivf.nlist)
            nprobe = min(nlist, self.nprobe or max(8, nlist // 128))
            if selector is not None:
                nprobe = min(nlist, math.ceil(nprobe / max(fraction, 1e-9)))
            return (
                faiss.SearchParametersIVF(nprobe=nprobe, sel=selector)
                if selector is not None
                else faiss.SearchParametersIVF(nprobe=nprobe)
            )
        if self._hnsw:
            ef = max(self.ef_search or 64, k)
            if selector is not None:
                ef = min(max(ef, math.ceil(ef / max(fraction, 1e-9))), 4096)
            return (
                faiss.SearchParametersHNSW(efSearch=ef, sel=selector)
                if selector is not None
                else faiss.SearchParametersHNSW(efSearch=ef)
            )
        return faiss.SearchParameters(sel=selector) if selector is not None else None

    def _raw(self, x: np.ndarray, k: int, selector: Any = None, fraction: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        params = self._params(k, selector, fraction)
        if params is None:
            return self._index.search(x, k)
        return self._index.search(x, k, params=params)

    def _bitmap(self, store: Store, allowed: Allowed | None) -> np.ndarray:
        if allowed is None:
            if self._live_bitmap is not None and self._live_bitmap[0] == store.version:
                return self._live_bitmap[1]
            labels = store.labels
        else:
            cached = allowed.derived.get("faiss_bitmap")
            if cached is not None:
                return cached
            labels = store.labels[allowed.rows]
        bits = np.zeros(((store.next_label + 7) // 8) * 8, dtype=bool)
        bits[labels] = True
        bitmap = np.packbits(bits, bitorder="little")
        if allowed is None:
            self._live_bitmap = (store.version, bitmap)
        else:
            allowed.derived["faiss_bitmap"] = bitmap
        return bitmap

    def search(
        self, queries: np.ndarray, k: int, allowed: Allowed | None, store: Store
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by the index; rows are -1 where the index found fewer than asked (the caller tops up).

        Returns:
            ``(scores, rows)`` numpy ``(q, want)``, ``want = min(k, allowed rows)``.
        """
        x = self._prepare(queries)
        q, live = x.shape[0], store.size
        count = live if allowed is None else allowed.count
        want = min(k, count)
        if want == 0 or q == 0:
            return np.empty((q, 0), dtype=np.float32), np.empty((q, 0), dtype=np.int64)
        fraction = count / max(live, 1)
        if allowed is None and self._tombstones == 0:
            distances, labels = self._raw(x, want)
            return self._scores(distances), store.rows_for_labels(labels)
        if not self._gpu and (allowed is None or fraction <= _SELECT_FRACTION):
            faiss = self._faiss
            bitmap = self._bitmap(store, allowed)
            selector = faiss.IDSelectorBitmap(bitmap)
            distances, labels = self._raw(x, want, selector, fraction)
            return self._scores(distances), store.rows_for_labels(labels)
        return self._overfetch(x, want, allowed, store, fraction)

    def _overfetch(
        self, x: np.ndarray, want: int, allowed: Allowed | None, store: Store, fraction: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Search more than asked and keep the allowed hits, growing the fetch until each query has ``want``."""
        q = x.shape[0]
        ntotal = int(self._index.ntotal)
        out_scores = np.full((q, want), -np.inf, dtype=np.float32)
        out_rows = np.full((q, want), -1, dtype=np.int64)
        pending = np.arange(q)
        fetch = min(ntotal, math.ceil(want / max(fraction, 1e-9) * 1.5) + self._tombstones + 8)
        while pending.size:
            distances, labels = self._raw(x[pending], fetch)
            rows = store.rows_for_labels(labels)
            ok = rows >= 0
            if allowed is not None:
                ok &= allowed.mask[np.where(ok, rows, 0)]
            scores = self._scores(distances)
            still: list[int] = []
            for slot, query in enumerate(pending.tolist()):
                keep = np.flatnonzero(ok[slot])[:want]
                out_scores[query, : keep.size] = scores[slot, keep]
                out_rows[query, : keep.size] = rows[slot, keep]
                if keep.size < want:
                    still.append(query)
            pending = np.asarray(still, dtype=np.int64)
            if fetch >= ntotal:
                break  # the index gave all it can; the caller tops up the rest exactly
            fetch = min(ntotal, fetch * 4)
        return out_scores, out_rows

    def _scores(self, distances: np.ndarray) -> np.ndarray:
        if self.metric == "l2":
            return (1.0 / (1.0 + np.maximum(distances, 0.0))).astype(np.float32)
        return distances.astype(np.float32, copy=False)

    # ------------------------------------------------------------------ persistence
    def serialize(self) -> np.ndarray:
        """The index as faiss's native bytes (GPU indexes are copied to the CPU first)."""
        faiss = self._faiss
        index = faiss.index_gpu_to_cpu(self._index) if self._gpu else self._index
        return faiss.serialize_index(index)

    @classmethod
    def deserialize(
        cls,
        data: np.ndarray,
        *,
        dim: int,
        metric: str,
        factory: str,
        device: str,
        ef_search: int | None,
        ef_construction: int | None,
        nprobe: int | None,
        compact_fraction: float,
        tombstones: int,
    ) -> FaissBackend:
        """Rebuild a backend from :meth:`serialize` bytes (faiss's own format: no code runs on load)."""
        faiss = import_faiss()
        index = faiss.deserialize_index(np.ascontiguousarray(data, dtype=np.uint8))
        if index.d != dim:
            raise EngineError(f"the saved faiss index has dimension {index.d}, the manifest says {dim}.")
        backend = cls(
            dim,
            metric,
            factory,
            device=device,
            ef_search=ef_search,
            ef_construction=ef_construction,
            nprobe=nprobe,
            compact_fraction=compact_fraction,
            index=index,
        )
        backend._tombstones = tombstones
        return backend

    @property
    def ntotal(self) -> int:
        """Entries in the index, tombstones included."""
        return int(self._index.ntotal)
