"""A VectorIndex's state in a snapshot: what save writes (header, config, records, faiss bytes), how load rebuilds it.

The caller holds the index's locks; the files are :mod:`._generation`, the save protocol :mod:`._persist`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt.device import check_device
from gpuprompt.errors import ConfigurationError, DependencyError, DeviceOutOfMemoryError, SnapshotError, describe
from gpuprompt.index._checks import SQUARED_NORM_LIMIT, squared_norms
from gpuprompt.index._config import BACKENDS, OPTIONS, IndexConfig, check_option_names
from gpuprompt.index._plan import Backend, faiss_device, faiss_installed, fill, new_backend, new_faiss
from gpuprompt.validation import check_choice

if TYPE_CHECKING:
    from gpuprompt.index._generation import Snapshot
    from gpuprompt.index._store import Store

__all__ = ["load_records", "open_snapshot", "restore_backend", "saved_config", "write_state"]

_LOAD_OPTIONS = tuple(name for name in OPTIONS if name not in ("metric", "backend", "device"))


def write_state(path: str | Path, config: IndexConfig, store: Store, backend: Backend | None) -> None:
    """Save the index's state at ``path`` (the caller holds the save lock and the read lock)."""
    from gpuprompt._version import __version__
    from gpuprompt.index._faiss import FaissBackend
    from gpuprompt.index._persist import write_snapshot

    faiss_index, factory, tombstones = None, None, 0
    if isinstance(backend, FaissBackend) and backend.is_trained:
        faiss_index, factory, tombstones = backend.serialize(), backend.factory, backend.tombstones
    header = {
        "dim": config.dim,
        "metric": config.metric,
        "count": store.size,
        "next_label": store.next_label,
        "backend": "faiss" if isinstance(backend, FaissBackend) else "torch",
        "faiss_factory": factory,
        "tombstones": tombstones,
        "config": dataclasses.asdict(config),
        "gpuprompt_version": __version__,
    }
    write_snapshot(
        path,
        header=header,
        vectors=store.vectors,
        labels=store.labels,
        records=zip(store.ids, store.documents, store.metadatas),
        faiss_index=faiss_index,
    )


def open_snapshot(
    path: str | Path, device: Any, backend: Any, options: Mapping[str, Any]
) -> tuple[IndexConfig, Snapshot]:
    """Read and verify the snapshot at ``path``; its config with the load's arguments applied.

    The arguments are checked before anything is read; the saved config, then the vectors
    against the metric, after.

    Raises:
        ConfigurationError: an unknown or invalid ``device``, ``backend`` or option.
        SnapshotError: see :func:`gpuprompt.index._persist.read_snapshot` and :func:`saved_config`.
    """
    from gpuprompt.index._persist import read_snapshot

    check_option_names(options, _LOAD_OPTIONS)
    overrides: dict[str, Any] = {"device": check_device(device), **options}
    if backend is not None:
        overrides["backend"] = check_choice(backend, "backend", BACKENDS, error=ConfigurationError)
        if backend == "torch":
            overrides["index_factory"] = None
    snapshot = read_snapshot(path)
    config = dataclasses.replace(saved_config(snapshot.manifest, snapshot.path), **overrides)
    if config.metric != "cosine" and snapshot.vectors.shape[0]:
        too_long = squared_norms(snapshot.vectors) > SQUARED_NORM_LIMIT
        if too_long.any():
            raise SnapshotError(
                f"index snapshot {str(snapshot.path)!r} is refused: vectors.npy row "
                f"{int(np.flatnonzero(too_long)[0])} has a squared norm above {SQUARED_NORM_LIMIT:.3g}, "
                f"which metric {config.metric!r} cannot score."
            )
    return config, snapshot


def load_records(store: Store, snapshot: Snapshot) -> None:
    """Put a verified snapshot's records into a new index's (empty, unshared) store."""
    vectors, labels, next_label = snapshot.vectors, snapshot.labels, snapshot.manifest["next_label"]
    store.load(vectors, labels, snapshot.ids, snapshot.documents, snapshot.metadatas, next_label)


def saved_config(manifest: Mapping[str, Any], path: Path) -> IndexConfig:
    """The config a snapshot's manifest stores, checked against the manifest's own dim and metric.

    Reads both forms: ``asdict(IndexConfig)`` and the older partial dict (no dim, metric, device
    or queue options: those come from the manifest and the defaults).

    Raises:
        SnapshotError: an unknown field, a bad value, or a dim / metric that contradicts the manifest.
    """
    stored = dict(manifest["config"])
    try:
        check_option_names(stored, [field.name for field in dataclasses.fields(IndexConfig)])
        for name in ("dim", "metric"):
            if stored.setdefault(name, manifest[name]) != manifest[name]:
                raise ConfigurationError(
                    f"'config.{name}' must equal the manifest's {name} {manifest[name]!r} "
                    f"(got {describe(stored[name])})."
                )
        return IndexConfig(**stored)
    except ConfigurationError as error:
        raise SnapshotError(
            f"index snapshot {str(path)!r} is refused: its manifest's config is invalid ({error})."
        ) from error


def restore_backend(config: IndexConfig, device: str, store: Store, snapshot: Snapshot) -> Backend:
    """The backend of a loaded snapshot: its faiss file when this machine runs faiss for the config, else rebuilt.

    Raises:
        SnapshotError: faiss cannot read the file, or it holds another number of entries than the manifest says.
    """
    manifest, path = snapshot.manifest, snapshot.path
    wants_faiss = config.backend == "faiss" or (config.backend == "auto" and not device.startswith("cuda"))
    if snapshot.faiss_index is None or not manifest.get("faiss_factory") or not wants_faiss or not faiss_installed():
        backend = new_backend(config, device, store.size)
        fill(backend, store)
        return backend
    tombstones = manifest["tombstones"]
    try:
        restored = new_faiss(
            config, manifest["faiss_factory"], faiss_device(config, device), snapshot.faiss_index, tombstones
        )
    except (ConfigurationError, DependencyError, DeviceOutOfMemoryError):
        raise
    except Exception as exc:  # faiss raises RuntimeError on a malformed index file
        raise SnapshotError(f"index snapshot {str(path)!r}: faiss could not read index.faiss ({exc}).") from exc
    if restored.ntotal != store.size + tombstones:
        raise SnapshotError(
            f"index snapshot {str(path)!r}: index.faiss holds {restored.ntotal} entries, the "
            f"manifest says {store.size} records + {tombstones} tombstones."
        )
    if restored.needs_compaction:
        restored.rebuild(store)
    return restored
