"""The snapshot protocol of a VectorIndex: checksummed folders, swapped into place by rename, one previous kept.

The files of one generation, and how they are verified, are :mod:`gpuprompt.index._generation`.

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

import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt.errors import GPUPromptError, InputTypeError, InvalidInputError, SnapshotError, StorageError, describe
from gpuprompt.index._generation import (
    FORMAT,
    FORMAT_VERSION,
    Snapshot,
    read_generation,
    read_manifest,
    write_generation,
)

try:  # POSIX: advisory locks serialise saves (and let loads wait for a rename to finish)
    import fcntl
except ImportError:  # pragma: no cover - Windows: saves are not serialised across processes
    fcntl = None  # type: ignore[assignment]

__all__ = ["FORMAT", "FORMAT_VERSION", "STEPS", "Snapshot", "read_snapshot", "snapshot_names", "write_snapshot"]

logger = logging.getLogger(__name__)

_TAG = ".gpuprompt-"

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


def _is_ours(folder: Path) -> bool:
    """Whether ``folder`` is a real folder holding a gpuprompt manifest (so a save may replace it)."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return False
        manifest = read_manifest(folder)
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
    """Refuse to replace anything at ``target`` that gpuprompt cannot prove it wrote, or a path
    below a file."""
    blocker = _file_above(target)
    if blocker is not None:
        raise InvalidInputError(
            f"'path' must be a folder path whose parents are folders (got {str(target)!r}, but "
            f"{str(blocker)!r} is a file); choose another path: nothing was changed."
        )
    if not os.path.lexists(target) or _is_ours(target) or _is_empty_dir(target):
        return
    raise InvalidInputError(
        f"'path' must be a new folder or an existing index snapshot (got {str(target)!r}, which exists and "
        "is not a snapshot); choose another path: nothing there was changed."
    )


def _file_above(target: Path) -> Path | None:
    """The nearest existing parent of ``target`` when it is not a folder (a file in the way), else None."""
    for parent in target.parents:
        try:
            info = os.stat(parent)  # a link to a folder is a folder
        except (FileNotFoundError, NotADirectoryError):
            continue  # missing, or below a file further up: look higher
        except OSError:
            return None  # unreadable: the file system's own refusal names it later
        return None if stat.S_ISDIR(info.st_mode) else parent
    return None


def _refused(exc: OSError, target: Path, action: str) -> StorageError:
    """A file-system refusal while saving or loading ``target``, as a StorageError naming both paths."""
    where = Path(os.fsdecode(exc.filename)) if exc.filename is not None else target
    if where.parent == target.parent and where.name.startswith(f".{target.name}{_TAG}"):
        where = target.parent  # a lock or temporary name of the protocol: the folder is what to fix
    place = f"in {str(where)!r}" if where == target.parent else repr(str(where))
    if isinstance(exc, PermissionError):
        reason = f"this process may not {action} {place} ({exc.strerror})"
        fix = (f"run as a user who may {action} there, change the folder's permissions, or choose a path this "
               "process can use")
    else:
        reason = f"the file system refused to {action} {place} ({exc.strerror or exc})"
        fix = "free space or make the file system writable, or choose another path"
    kept = " (the previous snapshot, if any, is kept)" if action == "write" else ""
    return StorageError(f"could not {action} the index snapshot {str(target)!r}: {reason}; {fix}{kept}.",
                        errno=exc.errno, filename=str(where))


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
            snapshot, or lies below a file (nothing there is changed), or a name gpuprompt reserves.
        StorageError: the file system refused a write, such as a folder this process may not write
            (an ``OSError``; the previous snapshot is kept).
    """
    names = _Names(_target(path))
    target = names.target
    _check_target(target)  # before creating anything beside it
    try:
        return _write(names, header, vectors, labels, records, faiss_index)
    except OSError as exc:
        if isinstance(exc, GPUPromptError):
            raise
        raise _refused(exc, target, "write") from exc


def _write(
    names: _Names,
    header: dict[str, Any],
    vectors: np.ndarray,
    labels: np.ndarray,
    records: Iterable[tuple[str, str | None, dict[str, Any]]],
    faiss_index: np.ndarray | None,
) -> Path:
    target = names.target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(names.lock, exclusive=True):
        _step("locked")
        _check_target(target)  # again: another process may have written there meanwhile
        tmp = names.fresh("tmp")
        tmp.mkdir()
        _step("tmp-created")
        try:
            write_generation(tmp, header, vectors, labels, records, faiss_index, _step)
            _fsync_dir(tmp)
            _step("tmp-synced")
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


# ---------------------------------------------------------------------------------------- load
def read_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read the newest generation at ``path`` that verifies: MAIN, else PREV.

    Verification covers the manifest, file sizes, sha256 checksums, array dtypes and shapes,
    finite vectors, label ranges, and every record (types, well-formed text, metadata nesting and
    int64 range). Only the target and its gpuprompt-named previous generation are considered.

    Raises:
        InputTypeError: ``path`` is not a str or path object.
        InvalidInputError: ``path`` names no folder, or a name gpuprompt reserves.
        SnapshotError: no generation exists (the message says when a parent of ``path`` is a file),
            or none verifies (the message gives MAIN's reason).
        StorageError: the file system refused a read, such as a folder this process may not read
            (an ``OSError``; an older generation is never loaded in its place).
    """
    names = _Names(_target(path))
    target = names.target
    refusals: list[tuple[str, SnapshotError]] = []
    with _locked(names.lock, exclusive=False):
        for folder, generation in ((target, "main"), (names.prev, "previous")):
            try:
                os.lstat(folder)
            except PermissionError as exc:
                raise _refused(exc, target, "read") from exc
            except OSError:
                continue  # missing (or below a file)
            try:
                snapshot = read_generation(folder)
            except SnapshotError as exc:
                refusals.append((generation, exc))
                continue
            except PermissionError as exc:
                raise _refused(exc, target, "read") from exc
            snapshot.generation = generation
            if generation == "previous":
                reason = f": {refusals[0][1]}" if refusals else " (it is missing: a save was interrupted)"
                logger.warning("index snapshot %s was not loaded%s; loaded its previous generation", target, reason)
            return snapshot
    if not refusals:
        blocker = _file_above(target)
        why = f"{str(blocker)!r} is a file, not a folder" if blocker is not None else "the folder does not exist"
        raise SnapshotError(f"no index snapshot at {str(target)!r}: {why}. Pass the path given to save().")
    message = str(refusals[0][1])
    if len(refusals) > 1:
        message += f" Its previous generation was refused too: {refusals[1][1]}"
    raise SnapshotError(message) from refusals[0][1]
