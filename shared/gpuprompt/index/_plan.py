"""Backend planning for VectorIndex: which backend to build, when to switch, train or compact, how to fill one.

Functions of an IndexConfig, a resolved device and the Store; the caller holds the index's write lock.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Union

from gpuprompt.index._config import AUTO_ANN_FACTORY, IndexConfig

if TYPE_CHECKING:
    import numpy as np

    from gpuprompt.index._faiss import FaissBackend
    from gpuprompt.index._store import Change, Store
    from gpuprompt.index._torch import TorchBackend

__all__ = [
    "Backend",
    "apply_change",
    "faiss_device",
    "faiss_installed",
    "fill",
    "new_backend",
    "new_faiss",
    "settle",
    "tune",
]

logger = logging.getLogger(__name__)

Backend = Union["TorchBackend", "FaissBackend"]


def faiss_installed() -> bool:
    """Whether faiss can be imported (without importing it)."""
    return importlib.util.find_spec("faiss") is not None


def faiss_device(config: IndexConfig, device: str) -> str:
    """Where a faiss index runs: the GPU only when asked for or when a faiss GPU build is present."""
    from gpuprompt.index._faiss import faiss_gpu_available

    if device.startswith("cuda") and (config.device != "auto" or faiss_gpu_available()):
        return device  # an explicit CUDA request without faiss GPU support fails with a clear error
    return "cpu"


def new_faiss(
    config: IndexConfig, factory: str, device: str, index: np.ndarray | None = None, tombstones: int = 0
) -> FaissBackend:
    """A faiss backend with the config's knobs: empty, or read from serialised ``index`` bytes."""
    from gpuprompt.index._faiss import FaissBackend

    knobs = {
        "device": device,
        "ef_search": config.ef_search,
        "ef_construction": config.ef_construction,
        "nprobe": config.nprobe,
        "compact_fraction": config.compact_fraction,
    }
    if index is not None:
        return FaissBackend.deserialize(
            index, dim=config.dim, metric=config.metric, factory=factory, tombstones=tombstones, **knobs
        )
    return FaissBackend(config.dim, config.metric, factory, **knobs)


def new_backend(config: IndexConfig, device: str, size: int) -> Backend:
    """An empty backend for ``size`` records, as the config asks (``"auto"`` decides here).

    ``"auto"``: faiss when ``index_factory`` is given (on the GPU when a faiss GPU build is
    installed); torch on CUDA; on a CPU torch up to ``ann_threshold`` records, faiss HNSW above.
    """
    from gpuprompt.index._torch import TorchBackend

    request = config.backend
    if request == "auto":
        if config.index_factory is not None:
            request = "faiss"
        elif device.startswith("cuda"):
            request = "torch"
        elif size > config.ann_threshold and faiss_installed():
            return new_faiss(config, AUTO_ANN_FACTORY, "cpu")
        else:
            request = "torch"
    if request == "torch":
        return TorchBackend(config.dim, config.metric, device, config.dtype)
    return new_faiss(config, config.index_factory or "Flat", faiss_device(config, device))


def fill(backend: Backend, store: Store) -> None:
    """Load the store's records into a fresh backend (training an untrained faiss index if it can)."""
    from gpuprompt.index._faiss import FaissBackend

    if isinstance(backend, FaissBackend) and not backend.is_trained:
        backend.maybe_train(store)
    else:
        backend.rebuild(store)


def tune(backend: Backend | None, config: IndexConfig) -> None:
    """Give a faiss backend the config's search knobs (``ef_search``, ``nprobe``); other backends have none."""
    from gpuprompt.index._faiss import FaissBackend

    if isinstance(backend, FaissBackend):
        backend.ef_search, backend.nprobe = config.ef_search, config.nprobe


def apply_change(backend: Backend, store: Store, change: Change) -> None:
    """Apply one write to the backend; if that fails, rebuild it from the (unchanged) store and re-raise."""
    try:
        backend.apply(change)
    except BaseException:
        try:
            backend.reset()
            fill(backend, store)
        except Exception:  # pragma: no cover - the original error is the one to report
            logger.exception("VectorIndex: could not rebuild the backend after a failed write")
        raise


def settle(config: IndexConfig, device: str, backend: Backend, store: Store) -> Backend:
    """After a write: train or compact a faiss index that is due, and return the backend to use.

    That is a new faiss ``HNSW32`` backend, filled, when ``"auto"`` on a CPU has just passed
    ``ann_threshold`` records; else ``backend`` itself.
    """
    from gpuprompt.index._faiss import FaissBackend
    from gpuprompt.index._torch import TorchBackend

    if isinstance(backend, FaissBackend):
        if not backend.is_trained:
            backend.maybe_train(store)
        elif backend.needs_compaction:
            logger.info("VectorIndex: compacting %s (%d tombstones)", backend.describe(), backend.tombstones)
            backend.rebuild(store)
    if (
        config.backend == "auto"
        and config.index_factory is None
        and isinstance(backend, TorchBackend)
        and not device.startswith("cuda")
        and store.size > config.ann_threshold
        and faiss_installed()
    ):
        logger.info(
            "VectorIndex: %d records > %d, switching to faiss %s", store.size, config.ann_threshold, AUTO_ANN_FACTORY
        )
        switched = new_faiss(config, AUTO_ANN_FACTORY, "cpu")
        fill(switched, store)
        return switched
    return backend
