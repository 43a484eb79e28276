"""One generation of a VectorIndex snapshot on disk: its files, written, then read back and verified.

No pickle anywhere: JSON, raw ``.npy`` arrays and faiss's own format; naming and renaming are :mod:`._persist`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt.errors import InvalidInputError, SnapshotError, describe
from gpuprompt.validation import INT64_MAX, check_metadata, check_text

__all__ = ["FORMAT", "FORMAT_VERSION", "Snapshot", "read_generation", "read_manifest", "write_generation"]

FORMAT = "gpuprompt.vector-index"
FORMAT_VERSION = 1
_MANIFEST = "manifest.json"
_MANIFEST_MAX_BYTES = 16 << 20
_KNOWN_FILES = ("vectors.npy", "labels.npy", "records.jsonl", "index.faiss")
_CHUNK = 1 << 22
_METRICS = ("cosine", "ip", "l2")
_BACKENDS = ("torch", "faiss")


@dataclass
class Snapshot:
    """A validated snapshot read from disk.

    Attributes:
        manifest: the parsed manifest.
        vectors: ``(count, dim)`` float32, all finite.
        labels: ``(count,)`` int64, unique, in ``[0, next_label)``.
        ids: one non-empty str per row.
        documents: one str or None per row.
        metadatas: one JSON dict per row (validated like :meth:`VectorIndex.add`'s).
        faiss_index: faiss's serialised index, or None.
        path: the folder the generation was read from (the target, or its previous generation).
        generation: ``"main"`` or ``"previous"``.
    """

    manifest: dict[str, Any]
    vectors: np.ndarray
    labels: np.ndarray
    ids: list[str]
    documents: list[str | None]
    metadatas: list[dict[str, Any]]
    faiss_index: np.ndarray | None
    path: Path
    generation: str = "main"


# ---------------------------------------------------------------------------------------- write
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _write_file(path: Path, write: Any) -> None:
    with open(path, "xb") as handle:
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


def write_generation(
    folder: Path,
    header: dict[str, Any],
    vectors: np.ndarray,
    labels: np.ndarray,
    records: Iterable[tuple[str, str | None, dict[str, Any]]],
    faiss_index: np.ndarray | None,
    step: Callable[[str], None],
) -> None:
    """Write every file of a generation into the empty ``folder``, each fsynced, the manifest last.

    Layout of one generation (format version 1)::

        manifest.json    format, version, dim, metric, count, labels counter, config, sha256 of each file
        vectors.npy      (count, dim) float32 as added   -- np.load(..., allow_pickle=False)
        labels.npy       (count,) int64 record labels     -- the faiss index's ids
        records.jsonl    one {"id", "document", "metadata"} object per row, in row order
        index.faiss      faiss's native index bytes (faiss backend only; GPU indexes copied to CPU)

    Nothing on the load path (:func:`read_generation`) can execute code.

    Args:
        folder: the new generation's (temporary) folder; the caller fsyncs it afterwards.
        header: manifest fields (dim, metric, count, config, ...).
        vectors: ``(count, dim)`` float32.
        labels: ``(count,)`` int64.
        records: ``(id, document, metadata)`` per row, in row order.
        faiss_index: faiss's serialised index bytes, or None.
        step: called with each protocol step name as its file is written (fault injection).
    """
    _write_array(folder / "vectors.npy", vectors.astype(np.float32, copy=False))
    step("vectors-written")
    _write_array(folder / "labels.npy", labels.astype(np.int64, copy=False))
    step("labels-written")
    _write_records(folder / "records.jsonl", records)
    step("records-written")
    if faiss_index is not None:
        _write_file(folder / "index.faiss", lambda handle: handle.write(np.ascontiguousarray(faiss_index).tobytes()))
        step("faiss-written")
    files = {}
    for name in _KNOWN_FILES:
        file = folder / name
        if file.exists():
            files[name] = {"sha256": _sha256(file), "bytes": file.stat().st_size}
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_at": time.time(),
        **header,
        "files": files,
    }
    _write_file(folder / _MANIFEST, lambda handle: handle.write(json.dumps(manifest, indent=2).encode("utf-8")))
    step("manifest-written")


# ---------------------------------------------------------------------------------------- read
def read_manifest(folder: Path) -> Any:
    """The parsed manifest of ``folder`` (raises OSError / ValueError / RecursionError)."""
    file = folder / _MANIFEST
    info = os.lstat(file)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{_MANIFEST} is not a regular file")
    if info.st_size > _MANIFEST_MAX_BYTES:
        raise ValueError(f"{_MANIFEST} has {info.st_size} bytes, more than a manifest ever holds")
    with open(file, "rb") as handle:
        return _loads(handle.read().decode("utf-8"))


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _fail(path: Path, what: str) -> SnapshotError:
    return SnapshotError(f"index snapshot {str(path)!r} is refused: {what}. Save it again from the source index.")


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a permission refusal is raised, not taken for a missing file."""
    try:
        os.lstat(path)
    except PermissionError:
        raise
    except OSError:
        return False
    return True


def read_generation(folder: Path) -> Snapshot:
    """Read and verify one generation folder.

    Raises:
        SnapshotError: the folder is not a whole, well-formed generation.
        PermissionError: this process may not read it (the caller names the snapshot).
    """
    try:
        is_dir = stat.S_ISDIR(os.stat(folder).st_mode)
    except PermissionError:
        raise
    except OSError as exc:
        raise _fail(folder, f"it cannot be read ({exc})") from exc
    if not is_dir or not _exists(folder / _MANIFEST):
        raise SnapshotError(
            f"{str(folder)!r} is not an index snapshot: it has no {_MANIFEST}. Pass a folder written by "
            "VectorIndex.save()."
        )
    try:
        manifest = read_manifest(folder)
    except PermissionError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(folder, f"{_MANIFEST} is not valid JSON ({exc})") from exc
    _check_manifest(folder, manifest)
    files: dict[str, Any] = manifest["files"]
    for name, info in files.items():
        file = folder / name
        try:
            status = os.lstat(file)
        except PermissionError:
            raise
        except OSError:
            raise _fail(folder, f"{name} is missing") from None
        if not stat.S_ISREG(status.st_mode):
            raise _fail(folder, f"{name} is not a regular file")
        if status.st_size != info["bytes"]:
            raise _fail(
                folder, f"{name} has {status.st_size} bytes, the manifest says {info['bytes']} (truncated or replaced)"
            )
        digest = _sha256(file)
        if digest != info["sha256"]:
            raise _fail(
                folder,
                f"{name} has sha256 {digest[:16]}..., the manifest says {str(info['sha256'])[:16]}... "
                "(corrupted or tampered with)",
            )
    dim, count = manifest["dim"], manifest["count"]
    vectors = _load_array(folder, "vectors.npy", np.float32, (count, dim))
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        raise _fail(folder, f"vectors.npy row {int(np.flatnonzero(~finite)[0])} holds NaN or inf values")
    labels = _load_array(folder, "labels.npy", np.int64, (count,))
    if count and (labels.min() < 0 or labels.max() >= manifest["next_label"] or np.unique(labels).size != count):
        raise _fail(folder, "labels.npy holds negative, repeated or out-of-range labels")
    ids, documents, metadatas = _load_records(folder, count)
    faiss_index = None
    if "index.faiss" in files:
        faiss_index = np.fromfile(folder / "index.faiss", dtype=np.uint8)
    return Snapshot(manifest, vectors, labels, ids, documents, metadatas, faiss_index, folder)


def _check_manifest(folder: Path, manifest: Any) -> None:
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
        value = manifest.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _fail(folder, f"manifest field {field!r} must be a {kind.__name__} (got {describe(value)})")
    for field, low in (("dim", 1), ("count", 0), ("next_label", 0), ("tombstones", 0)):
        if not low <= manifest[field] <= INT64_MAX:
            raise _fail(folder, f"manifest field {field!r} must be an int >= {low} (got {describe(manifest[field])})")
    if manifest["next_label"] < manifest["count"]:
        raise _fail(folder, f"manifest field 'next_label' must be >= count (got {manifest['next_label']})")
    if manifest["metric"] not in _METRICS:
        raise _fail(folder, f"manifest field 'metric' must be one of {_METRICS} (got {describe(manifest['metric'])})")
    if manifest["backend"] not in _BACKENDS:
        raise _fail(
            folder, f"manifest field 'backend' must be one of {_BACKENDS} (got {describe(manifest['backend'])})"
        )
    factory = manifest.get("faiss_factory")
    if factory is not None and (not isinstance(factory, str) or not factory.strip()):
        raise _fail(folder, f"manifest field 'faiss_factory' must be None or a str (got {describe(factory)})")
    files: dict[str, Any] = manifest["files"]
    for name, info in files.items():
        if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
            raise _fail(folder, f"the manifest lists a bad file name {name!r}")
        if name not in _KNOWN_FILES:
            raise _fail(folder, f"the manifest lists {name!r}, which is not one of {list(_KNOWN_FILES)}")
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("bytes"), int)
            or isinstance(info.get("bytes"), bool)
            or info["bytes"] < 0
            or not isinstance(info.get("sha256"), str)
        ):
            raise _fail(folder, f"the manifest's entry for {name} must be {{'sha256': str, 'bytes': int}}")
    required = {"vectors.npy", "labels.npy", "records.jsonl"}
    if not required <= set(files):
        raise _fail(folder, f"the manifest lists {sorted(files)}, it needs {sorted(required)}")


def _load_array(folder: Path, name: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    try:
        # read_array reads the .npy format only: no .npz (zip) path, no pickle.
        with open(folder / name, "rb") as handle:
            array = np.lib.format.read_array(handle, allow_pickle=False)
    except PermissionError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed file is a damaged snapshot
        raise _fail(folder, f"{name} is not a plain numeric .npy array ({exc})") from exc
    if not isinstance(array, np.ndarray) or array.dtype != dtype or array.shape != shape:
        raise _fail(
            folder,
            f"{name} holds {getattr(array, 'dtype', '?')} {getattr(array, 'shape', '?')}, expected "
            f"{np.dtype(dtype)} {shape}",
        )
    return array


def _load_records(folder: Path, count: int) -> tuple[list[str], list[str | None], list[dict[str, Any]]]:
    ids: list[str] = []
    documents: list[str | None] = []
    metadatas: list[dict[str, Any]] = []
    number = 0
    try:
        with open(folder / "records.jsonl", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                record = _loads(line)
                if not isinstance(record, dict):
                    raise _fail(folder, f"records.jsonl line {number} is not a JSON object")
                key, document, metadata = record.get("id"), record.get("document"), record.get("metadata")
                if (
                    not isinstance(key, str)
                    or not key
                    or not (document is None or isinstance(document, str))
                    or not isinstance(metadata, dict)
                ):
                    raise _fail(
                        folder,
                        f"records.jsonl line {number} is not an {{id: non-empty str, document: str|null, "
                        "metadata: object}}",
                    )
                check_text(key, f"records.jsonl line {number} id")
                if document is not None:
                    check_text(document, f"records.jsonl line {number} document")
                ids.append(key)
                documents.append(document)
                metadatas.append(check_metadata(metadata, f"records.jsonl line {number} metadata", allow_none=False))
    except InvalidInputError as exc:
        raise _fail(folder, str(exc).rstrip(".")) from exc
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(folder, f"records.jsonl line {number} is not valid JSON ({type(exc).__name__}: {exc})") from exc
    if len(ids) != count:
        raise _fail(folder, f"records.jsonl holds {len(ids)} records, the manifest says {count}")
    if len(set(ids)) != count:
        raise _fail(folder, "records.jsonl repeats an id")
    return ids, documents, metadatas
