"""Snapshots of a VectorIndex: a folder written beside the target, checksummed, swapped in by rename.

Layout (format version 1)::

    manifest.json    format, version, dim, metric, count, labels counter, config, sha256 of each file
    vectors.npy      (count, dim) float32 as added   -- np.load(..., allow_pickle=False)
    labels.npy       (count,) int64 record labels     -- the faiss index's ids
    records.jsonl    one {"id", "document", "metadata"} object per row, in row order
    index.faiss      faiss's native index bytes (faiss backend only; GPU indexes copied to CPU)

Nothing on the load path can execute code: no pickle, JSON and raw arrays only, faiss's own format.
A save writes ``<path>.tmp-<hex>`` completely (fsynced), then renames the old snapshot to
``<path>.bak-<hex>``, renames the new one to ``<path>`` and deletes the backup; a crash at any point
leaves a loadable snapshot (a crash between the two renames is recovered from the backup by load).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt.errors import InvalidInputError, SnapshotError, describe

__all__ = ["FORMAT", "FORMAT_VERSION", "Snapshot", "read_snapshot", "write_snapshot"]

logger = logging.getLogger(__name__)

FORMAT = "gpuprompt.vector-index"
FORMAT_VERSION = 1
_MANIFEST = "manifest.json"
_CHUNK = 1 << 22


@dataclass
class Snapshot:
    """A validated snapshot read from disk."""

    manifest: dict[str, Any]
    vectors: np.ndarray
    labels: np.ndarray
    ids: list[str]
    documents: list[str | None]
    metadatas: list[dict[str, Any]]
    faiss_index: np.ndarray | None
    path: Path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, write: Any) -> None:
    with open(path, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())


def _write_array(path: Path, array: np.ndarray) -> None:
    _write_file(path, lambda handle: np.lib.format.write_array(handle, np.ascontiguousarray(array), allow_pickle=False))


def _write_records(path: Path, records: Iterable[tuple[str, str | None, dict[str, Any]]]) -> None:
    def write(handle: Any) -> None:
        for key, document, metadata in records:
            line = json.dumps(
                {"id": key, "document": document, "metadata": metadata},
                ensure_ascii=False,
                allow_nan=False,
                separators=(",", ":"),
            )
            handle.write(line.encode("utf-8"))
            handle.write(b"\n")

    _write_file(path, write)


def _is_snapshot(path: Path) -> bool:
    return path.is_dir() and (path / _MANIFEST).is_file()


def write_snapshot(
    path: str | os.PathLike[str],
    *,
    header: dict[str, Any],
    vectors: np.ndarray,
    labels: np.ndarray,
    records: Iterable[tuple[str, str | None, dict[str, Any]]],
    faiss_index: np.ndarray | None,
) -> Path:
    """Write a snapshot folder at ``path`` atomically (see the module docstring).

    Args:
        path: the snapshot folder; an existing snapshot there is replaced.
        header: manifest fields (dim, metric, count, config, ...).
        vectors: ``(count, dim)`` float32.
        labels: ``(count,)`` int64.
        records: ``(id, document, metadata)`` per row, in row order.
        faiss_index: faiss's serialised index bytes, or None.

    Raises:
        InvalidInputError: ``path`` is a file or a non-empty folder that is not a snapshot.
    """
    target = Path(path)
    if target.exists() and not _is_snapshot(target) and (not target.is_dir() or any(target.iterdir())):
        raise InvalidInputError(
            f"'path' must be a new folder or an existing index snapshot (got {str(target)!r}, which exists and "
            "is not a snapshot); choose another path: nothing there was changed."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:12]}")
    tmp.mkdir()
    try:
        _write_array(tmp / "vectors.npy", vectors.astype(np.float32, copy=False))
        _write_array(tmp / "labels.npy", labels.astype(np.int64, copy=False))
        _write_records(tmp / "records.jsonl", records)
        if faiss_index is not None:
            _write_file(tmp / "index.faiss", lambda handle: handle.write(np.ascontiguousarray(faiss_index).tobytes()))
        files = {}
        for file in sorted(tmp.iterdir()):
            files[file.name] = {"sha256": _sha256(file), "bytes": file.stat().st_size}
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created_at": time.time(),
            **header,
            "files": files,
        }
        _write_file(tmp / _MANIFEST, lambda handle: handle.write(json.dumps(manifest, indent=2).encode("utf-8")))
        _fsync_dir(tmp)
        backup: Path | None = None
        if target.exists():
            backup = target.with_name(f"{target.name}.bak-{uuid.uuid4().hex[:12]}")
            os.rename(target, backup)
        os.rename(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
    # Leftovers of saves killed midway (never a complete snapshot: those are swapped in).
    for stale in target.parent.glob(f"{target.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in target.parent.glob(f"{target.name}.bak-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return target


def _locate(path: Path) -> Path:
    if _is_snapshot(path):
        return path
    if not path.exists():
        # A save that died between its two renames leaves only the backup of the previous snapshot.
        backups = sorted(path.parent.glob(f"{path.name}.bak-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        for backup in backups:
            if _is_snapshot(backup):
                logger.warning("index snapshot %s is missing; recovering the previous one from %s", path, backup)
                return backup
        raise SnapshotError(
            f"no index snapshot at {str(path)!r}: the folder does not exist. Pass the path given to save()."
        )
    raise SnapshotError(
        f"{str(path)!r} is not an index snapshot: it has no {_MANIFEST}. Pass a folder written by VectorIndex.save()."
    )


def _fail(path: Path, what: str) -> SnapshotError:
    return SnapshotError(f"index snapshot {str(path)!r} is refused: {what}. Save it again from the source index.")


def read_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read and validate a snapshot: manifest, sizes, sha256 checksums, shapes, records.

    Raises:
        SnapshotError: missing, truncated, tampered with, or of another format or version.
    """
    folder = _locate(Path(path))
    try:
        manifest = json.loads((folder / _MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(folder, f"{_MANIFEST} is not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _fail(folder, f"{_MANIFEST} is not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise _fail(
            folder,
            f"format version {manifest.get('format_version')!r} is not supported (this gpuprompt reads "
            f"version {FORMAT_VERSION})",
        )
    for field, kind in (
        ("dim", int),
        ("count", int),
        ("next_label", int),
        ("metric", str),
        ("backend", str),
        ("files", dict),
        ("config", dict),
        ("tombstones", int),
    ):
        if not isinstance(manifest.get(field), kind) or isinstance(manifest.get(field), bool):
            raise _fail(
                folder, f"manifest field {field!r} must be a {kind.__name__} (got {describe(manifest.get(field))})"
            )
    files: dict[str, Any] = manifest["files"]
    required = {"vectors.npy", "labels.npy", "records.jsonl"}
    if not required <= set(files):
        raise _fail(folder, f"the manifest lists {sorted(files)}, it needs {sorted(required)}")
    for name, info in files.items():
        if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
            raise _fail(folder, f"the manifest lists a bad file name {name!r}")
        file = folder / name
        if not file.is_file():
            raise _fail(folder, f"{name} is missing")
        size = file.stat().st_size
        if not isinstance(info, dict) or size != info.get("bytes"):
            raise _fail(
                folder,
                f"{name} has {size} bytes, the manifest says {info.get('bytes') if isinstance(info, dict) else '?'} "
                "(truncated or replaced)",
            )
        digest = _sha256(file)
        if digest != info.get("sha256"):
            raise _fail(
                folder,
                f"{name} has sha256 {digest[:16]}..., the manifest says {str(info.get('sha256'))[:16]}... "
                "(corrupted or tampered with)",
            )
    dim, count = manifest["dim"], manifest["count"]
    vectors = _load_array(folder, "vectors.npy", np.float32, (count, dim))
    labels = _load_array(folder, "labels.npy", np.int64, (count,))
    if count and (labels.min() < 0 or labels.max() >= manifest["next_label"] or np.unique(labels).size != count):
        raise _fail(folder, "labels.npy holds negative, repeated or out-of-range labels")
    ids, documents, metadatas = _load_records(folder, count)
    faiss_index = None
    if "index.faiss" in files:
        faiss_index = np.fromfile(folder / "index.faiss", dtype=np.uint8)
    return Snapshot(manifest, vectors, labels, ids, documents, metadatas, faiss_index, folder)


def _load_array(folder: Path, name: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    try:
        array = np.load(folder / name, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise _fail(folder, f"{name} is not a plain numeric .npy array ({exc})") from exc
    if array.dtype != dtype or array.shape != shape:
        raise _fail(folder, f"{name} holds {array.dtype} {array.shape}, expected {np.dtype(dtype)} {shape}")
    return array


def _load_records(folder: Path, count: int) -> tuple[list[str], list[str | None], list[dict[str, Any]]]:
    ids: list[str] = []
    documents: list[str | None] = []
    metadatas: list[dict[str, Any]] = []
    try:
        with open(folder / "records.jsonl", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                record = json.loads(line)
                key, document, metadata = record.get("id"), record.get("document"), record.get("metadata")
                if (
                    not isinstance(key, str)
                    or not (document is None or isinstance(document, str))
                    or not isinstance(metadata, dict)
                ):
                    raise _fail(
                        folder,
                        f"records.jsonl line {number} is not an {{id: str, document: str|null, metadata: object}}",
                    )
                ids.append(key)
                documents.append(document)
                metadatas.append(metadata)
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise _fail(folder, f"records.jsonl is not valid JSON lines ({exc})") from exc
    if len(ids) != count:
        raise _fail(folder, f"records.jsonl holds {len(ids)} records, the manifest says {count}")
    if len(set(ids)) != count:
        raise _fail(folder, "records.jsonl repeats an id")
    return ids, documents, metadatas
