"""Snapshots of a VectorIndex: checksummed folders, swapped into place by rename, one previous kept.

Layout of one generation (format version 1)::

    manifest.json    format, version, dim, metric, count, labels counter, config, sha256 of each file
    vectors.npy      (count, dim) float32 as added   -- np.load(..., allow_pickle=False)
    labels.npy       (count,) int64 record labels     -- the faiss index's ids
    records.jsonl    one {"id", "document", "metadata"} object per row, in row order
    index.faiss      faiss's native index bytes (faiss backend only; GPU indexes copied to CPU)

Nothing on the load path can execute code: no pickle, JSON and raw arrays only, faiss's own format.

The save protocol. For a target ``<dir>/<name>`` gpuprompt uses only these names beside it, all
hidden and none of them a name a user would pick::

    <dir>/<name>                              MAIN: the newest finished generation
    <dir>/.<name>.gpuprompt-prev              PREV: the generation MAIN replaced (exactly one kept)
    <dir>/.<name>.gpuprompt-tmp-<32 hex>      a generation being written (never loaded)
    <dir>/.<name>.gpuprompt-old-<32 hex>      a retired PREV being deleted (never loaded)
    <dir>/.<name>.gpuprompt-lock              an empty file saves lock (flock): one save at a time

A save, holding the lock, runs these steps (each named for the fault-injection hook, see
:data:`STEPS`)::

    1. write TMP: every file written and fsynced, manifest last, then TMP itself fsynced
    2. if MAIN is a gpuprompt snapshot:
         a. if PREV exists: rename PREV -> OLD               (fsync dir)
         b. rename MAIN -> PREV                              (fsync dir)
       else if MAIN is an empty folder: remove it; a missing MAIN keeps PREV as it is
    3. rename TMP -> MAIN                                    (fsync dir)
    4. delete OLD, then leftovers of killed saves (TMP / OLD names of this target only)

Invariant: MAIN and PREV, whenever they exist, are complete fsynced generations (they only ever
appear by renaming one), and PREV is older than MAIN. Whatever step a kill interrupts, MAIN or
else PREV is the last finished save or the one that was being written. In step 2 PREV is retired
only while MAIN exists; when a killed save left MAIN missing, the next save keeps PREV, so a
second kill cannot lose the last complete generation either.

A load reads MAIN, or PREV when MAIN is missing or fails verification (manifest, sizes, sha256,
dtypes, shapes, finite values, well-formed records); no other name is ever considered. Loads take
the lock shared when it exists, so they never read a generation while a save renames it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt._validate import INT64_MAX, check_metadata, check_text
from gpuprompt.errors import InputTypeError, InvalidInputError, SnapshotError, describe

try:  # POSIX: advisory locks serialise saves (and let loads wait for a rename to finish)
    import fcntl
except ImportError:  # pragma: no cover - Windows: saves are not serialised across processes
    fcntl = None  # type: ignore[assignment]

__all__ = ["FORMAT", "FORMAT_VERSION", "STEPS", "Snapshot", "read_snapshot", "snapshot_names", "write_snapshot"]

logger = logging.getLogger(__name__)

FORMAT = "gpuprompt.vector-index"
FORMAT_VERSION = 1
_MANIFEST = "manifest.json"
_MANIFEST_MAX_BYTES = 16 << 20
_KNOWN_FILES = ("vectors.npy", "labels.npy", "records.jsonl", "index.faiss")
_CHUNK = 1 << 22
_TAG = ".gpuprompt-"
_METRICS = ("cosine", "ip", "l2")
_BACKENDS = ("torch", "faiss")

STEPS: tuple[str, ...] = (
    "locked",
    "tmp-created",
    "vectors-written",
    "labels-written",
    "records-written",
    "faiss-written",
    "manifest-written",
    "tmp-synced",
    "prev-retired",
    "main-retired",
    "main-installed",
    "dir-synced",
    "old-deleting",
    "old-deleted",
    "leftover-deleting",
    "done",
)
"""The points of the save protocol, in order, where the fault-injection hook is called.

``old-deleting`` and ``leftover-deleting`` fire after the first file of a folder being deleted
is gone (a kill there leaves a half-deleted folder). Steps that do not apply to a save (no PREV
to retire, no faiss file, no leftovers) are skipped.
"""

_STEP_HOOK: Callable[[str], None] | None = None
"""Internal fault injection for tests: called with each step name of :data:`STEPS` as it passes.

A test sets it to a function that raises a ``BaseException`` subclass (which, like a kill, runs
no cleanup: only ``Exception`` triggers the cleanup of a failed save) or calls ``os._exit``.
"""


def _step(name: str) -> None:
    hook = _STEP_HOOK
    if hook is not None:
        hook(name)


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


# ---------------------------------------------------------------------------------------- names
@dataclass(frozen=True)
class _Names:
    """The names the protocol uses for one target (see the module docstring)."""

    target: Path

    @property
    def parent(self) -> Path:
        return self.target.parent

    @property
    def prev(self) -> Path:
        return self.parent / f".{self.target.name}{_TAG}prev"

    @property
    def lock(self) -> Path:
        return self.parent / f".{self.target.name}{_TAG}lock"

    def fresh(self, kind: str) -> Path:
        return self.parent / f".{self.target.name}{_TAG}{kind}-{uuid.uuid4().hex}"

    def is_leftover(self, name: str) -> bool:
        """Whether ``name`` is a TMP or OLD folder of this target (an exact match, never a prefix)."""
        return (
            re.fullmatch(rf"\.{re.escape(self.target.name)}{re.escape(_TAG)}(tmp|old)-[0-9a-f]{{32}}", name) is not None
        )


_RESERVED = re.compile(rf"\..+{re.escape(_TAG)}(prev|lock|(tmp|old)-[0-9a-f]{{32}})")


def snapshot_names(path: str | os.PathLike[str]) -> dict[str, Path]:
    """The paths the protocol uses for ``path``: ``main``, ``prev`` and ``lock``.

    Raises:
        InvalidInputError: ``path`` is not a usable folder path (see :func:`write_snapshot`).
    """
    names = _Names(_target(path))
    return {"main": names.target, "prev": names.prev, "lock": names.lock}


def _target(path: Any) -> Path:
    """``path`` as a Path naming a folder, or a typed refusal."""
    if isinstance(path, os.PathLike):
        raw: Any = os.fspath(path)
    else:
        raw = path
    if not isinstance(raw, str):
        raise InputTypeError(f"'path' must be a str or os.PathLike folder path (got {describe(path)}).")
    if not raw or "\x00" in raw:
        raise InvalidInputError(
            f"'path' must be a non-empty folder path without NUL characters (got {describe(path)})."
        )
    target = Path(raw)
    name = target.name
    if name in ("", ".", ".."):
        raise InvalidInputError(
            f"'path' must name a folder, such as 'indexes/kb' (got {describe(path)}, whose last part is {name!r})."
        )
    if _RESERVED.fullmatch(name):
        raise InvalidInputError(
            f"'path' must not be a name gpuprompt reserves for its own temporary and previous snapshots "
            f"(got {describe(path)}); pass the snapshot's own path."
        )
    longest = f".{name}{_TAG}tmp-{'0' * 32}"
    if len(os.fsencode(longest)) > 255:
        raise InvalidInputError(
            f"'path' must end in a name of at most {255 - len(os.fsencode(longest)) + len(os.fsencode(name))} bytes, "
            f"so that the temporary folder beside it fits the file system's limit (got {describe(name)}); "
            "choose a shorter name."
        )
    return target


# ---------------------------------------------------------------------------------------- file system
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


def _read_manifest(folder: Path) -> Any:
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


def _is_ours(folder: Path) -> bool:
    """Whether ``folder`` is a real folder holding a gpuprompt manifest (so a save may replace it)."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return False
        manifest = _read_manifest(folder)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def _is_empty_dir(folder: Path) -> bool:
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return False
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _check_target(target: Path) -> None:
    """Refuse to replace anything at ``target`` that gpuprompt cannot prove it wrote."""
    if not os.path.lexists(target) or _is_ours(target) or _is_empty_dir(target):
        return
    raise InvalidInputError(
        f"'path' must be a new folder or an existing index snapshot (got {str(target)!r}, which exists and "
        "is not a snapshot); choose another path: nothing there was changed."
    )


@contextmanager
def _locked(lock: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold ``lock`` (exclusive for a save, shared for a load); no-op where flock is missing.

    A load never creates the lock file (a snapshot may sit on read-only storage).
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644) if exclusive else os.open(lock, os.O_RDONLY)
    except OSError:
        if exclusive:
            raise
        fd = -1  # no lock file (never saved here) or not readable: load without it
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            except OSError as exc:  # pragma: no cover - file systems without flock
                logger.debug("could not lock %s (%s); going on without the lock", lock, exc)
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def _remove_tree(folder: Path, step: str) -> None:
    """Delete ``folder`` (a TMP or OLD generation), calling ``step`` once part of it is gone."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for position, entry in enumerate(entries):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
        if position == 0:
            _step(step)
    os.rmdir(folder)


def _tidy(names: _Names, old: Path | None) -> None:
    """Step 4: delete the retired PREV, then the leftovers of earlier killed saves of this target."""
    try:
        if old is not None:
            _remove_tree(old, "old-deleting")
            _step("old-deleted")
        with os.scandir(names.parent) as entries:
            leftovers = [Path(entry.path) for entry in entries if names.is_leftover(entry.name)]
        for leftover in leftovers:
            _remove_tree(leftover, "leftover-deleting")
    except Exception as exc:  # noqa: BLE001 - the new snapshot is in place: a failed cleanup only wastes space
        logger.warning("index snapshot %s saved, but cleaning up beside it failed: %s", names.target, exc)


# ---------------------------------------------------------------------------------------- save
def write_snapshot(
    path: str | os.PathLike[str],
    *,
    header: dict[str, Any],
    vectors: np.ndarray,
    labels: np.ndarray,
    records: Iterable[tuple[str, str | None, dict[str, Any]]],
    faiss_index: np.ndarray | None,
) -> Path:
    """Write a snapshot folder at ``path`` by the protocol of the module docstring.

    Args:
        path: the snapshot folder; an existing snapshot there becomes the previous generation.
        header: manifest fields (dim, metric, count, config, ...).
        vectors: ``(count, dim)`` float32.
        labels: ``(count,)`` int64.
        records: ``(id, document, metadata)`` per row, in row order.
        faiss_index: faiss's serialised index bytes, or None.

    Returns:
        The snapshot folder.

    Raises:
        InputTypeError: ``path`` is not a str or path object.
        InvalidInputError: ``path`` is a file, a symbolic link or a non-empty folder that is not a
            snapshot (nothing there is changed), or a name gpuprompt reserves.
        OSError: the file system refused a write (the previous snapshot is kept).
    """
    names = _Names(_target(path))
    target = names.target
    _check_target(target)  # before creating anything beside it
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(names.lock, exclusive=True):
        _step("locked")
        _check_target(target)  # again: another process may have written there meanwhile
        tmp = names.fresh("tmp")
        tmp.mkdir()
        _step("tmp-created")
        try:
            _write_generation(tmp, header, vectors, labels, records, faiss_index)
            old: Path | None = None
            if _is_ours(target):
                if os.path.lexists(names.prev):
                    old = names.fresh("old")
                    os.rename(names.prev, old)
                    _fsync_dir(target.parent)
                    _step("prev-retired")
                os.rename(target, names.prev)
                _fsync_dir(target.parent)
                _step("main-retired")
            elif os.path.lexists(target):
                os.rmdir(target)  # an empty folder made for us (checked above)
            os.rename(tmp, target)
            _step("main-installed")
            _fsync_dir(target.parent)
            _step("dir-synced")
        except Exception:
            # An ordinary failure (disk full, permissions): drop the half-written generation. A kill
            # (or a BaseException) skips this; the next save deletes the leftover.
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _tidy(names, old)
        _step("done")
    return target


def _write_generation(
    folder: Path,
    header: dict[str, Any],
    vectors: np.ndarray,
    labels: np.ndarray,
    records: Iterable[tuple[str, str | None, dict[str, Any]]],
    faiss_index: np.ndarray | None,
) -> None:
    """Step 1: every file written and fsynced, the manifest last, the folder fsynced."""
    _write_array(folder / "vectors.npy", vectors.astype(np.float32, copy=False))
    _step("vectors-written")
    _write_array(folder / "labels.npy", labels.astype(np.int64, copy=False))
    _step("labels-written")
    _write_records(folder / "records.jsonl", records)
    _step("records-written")
    if faiss_index is not None:
        _write_file(folder / "index.faiss", lambda handle: handle.write(np.ascontiguousarray(faiss_index).tobytes()))
        _step("faiss-written")
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
    _step("manifest-written")
    _fsync_dir(folder)
    _step("tmp-synced")


# ---------------------------------------------------------------------------------------- load
def _fail(path: Path, what: str) -> SnapshotError:
    return SnapshotError(f"index snapshot {str(path)!r} is refused: {what}. Save it again from the source index.")


def read_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read the newest generation at ``path`` that verifies: MAIN, else PREV.

    Verification covers the manifest, file sizes, sha256 checksums, array dtypes and shapes,
    finite vectors, label ranges, and every record (types, well-formed text, metadata nesting and
    int64 range). Only the target and its gpuprompt-named previous generation are considered.

    Raises:
        InputTypeError: ``path`` is not a str or path object.
        InvalidInputError: ``path`` names no folder, or a name gpuprompt reserves.
        SnapshotError: no generation exists, or none verifies (the message gives MAIN's reason).
    """
    names = _Names(_target(path))
    target = names.target
    refusals: list[tuple[str, SnapshotError]] = []
    with _locked(names.lock, exclusive=False):
        for folder, generation in ((target, "main"), (names.prev, "previous")):
            if not os.path.lexists(folder):
                continue
            try:
                snapshot = _read_generation(folder)
            except SnapshotError as exc:
                refusals.append((generation, exc))
                continue
            snapshot.generation = generation
            if generation == "previous":
                reason = f": {refusals[0][1]}" if refusals else " (it is missing: a save was interrupted)"
                logger.warning("index snapshot %s was not loaded%s; loaded its previous generation", target, reason)
            return snapshot
    if not refusals:
        raise SnapshotError(
            f"no index snapshot at {str(target)!r}: the folder does not exist. Pass the path given to save()."
        )
    message = str(refusals[0][1])
    if len(refusals) > 1:
        message += f" Its previous generation was refused too: {refusals[1][1]}"
    raise SnapshotError(message) from refusals[0][1]


def _read_generation(folder: Path) -> Snapshot:
    """Read and verify one generation folder."""
    try:
        is_dir = stat.S_ISDIR(os.stat(folder).st_mode)
    except OSError as exc:
        raise _fail(folder, f"it cannot be read ({exc})") from exc
    if not is_dir or not os.path.lexists(folder / _MANIFEST):
        raise SnapshotError(
            f"{str(folder)!r} is not an index snapshot: it has no {_MANIFEST}. Pass a folder written by "
            "VectorIndex.save()."
        )
    try:
        manifest = _read_manifest(folder)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(folder, f"{_MANIFEST} is not valid JSON ({exc})") from exc
    _check_manifest(folder, manifest)
    files: dict[str, Any] = manifest["files"]
    for name, info in files.items():
        file = folder / name
        try:
            status = os.lstat(file)
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
        array = np.load(folder / name, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
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
