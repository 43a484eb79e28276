"""The snapshot save protocol under kills: at every step, twice in a row, in process and in a subprocess.

After every simulated kill a load must return one whole version (every record, vector and the
faiss index of one save, nothing mixed), no older than the last save that finished and no older
than any earlier load; the user's folders beside the snapshot must be untouched; and the next
save must succeed and tidy up. The in-process kill raises a BaseException subclass from the
protocol's step hook (like a kill, that runs no cleanup); the subprocess kill calls ``os._exit``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from gpuprompt import VectorIndex
from gpuprompt.errors import InputTypeError, InvalidInputError
from gpuprompt.index import _generation, _persist

# Shared by this module and the subprocess: version v of the index, fully determined by v.
_VERSION_SOURCE = textwrap.dedent(
    """
    import numpy as np
    from gpuprompt import VectorIndex

    DIM = 8

    def version_data(v):
        n = 3 + v
        rng = np.random.default_rng(1000 + v)
        ids = [f"v{v}-r{i}" for i in range(n)]
        vectors = rng.standard_normal((n, DIM)).astype(np.float32)
        documents = [f"document {i} of version {v}" for i in range(n)]
        metadatas = [{"v": v, "i": i, "tags": ["x"] * (i % 3)} for i in range(n)]
        return ids, vectors, documents, metadatas

    def make_index(v):
        index = VectorIndex(DIM, backend="faiss", device="cpu")  # a faiss file too: every step happens
        index.add(*version_data(v))
        return index
    """
)
_namespace: dict = {}
exec(_VERSION_SOURCE, _namespace)  # noqa: S102 - our own source, shared with the subprocess
version_data = _namespace["version_data"]
make_index = _namespace["make_index"]

_CHILD = _VERSION_SOURCE + textwrap.dedent(
    """
    import os, sys
    from gpuprompt.index import _persist

    path, version, step = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    index = make_index(version)

    def hook(name):
        if name == step:
            os._exit(77)  # a kill: no cleanup, no flush, no finally

    _persist._STEP_HOOK = hook
    index.save(path)
    """
)

NAME = "kb"
KILLED_RC = 77


class Killed(BaseException):
    """A simulated kill: a BaseException, so the save's ordinary-failure cleanup does not run."""


@contextmanager
def kill_at(step: str | None) -> Iterator[list[str]]:
    """Run the block with the protocol hook raising :class:`Killed` at ``step``; yields the steps seen."""
    seen: list[str] = []

    def hook(name: str) -> None:
        seen.append(name)
        if name == step:
            raise Killed(name)

    _persist._STEP_HOOK = hook
    try:
        yield seen
    finally:
        _persist._STEP_HOOK = None


def save(index: VectorIndex, path: Path, step: str | None) -> bool:
    """Save, killed at ``step``; returns whether the save finished."""
    with kill_at(step):
        try:
            index.save(path)
        except Killed:
            return False
    return True


def identify(path: Path) -> int:
    """Load ``path`` and return its version, asserting that it is one whole version."""
    loaded = VectorIndex.load(path, device="cpu", max_wait_ms=0)
    try:
        records = loaded.get(loaded.ids())
        assert records, "a loaded snapshot is never empty here"
        v = records[0].metadata["v"]
        ids, vectors, documents, metadatas = version_data(v)
        assert loaded.count == len(ids) and sorted(loaded.ids()) == sorted(ids), "records of two versions mixed"
        by_id = {r.id: r for r in records}
        for key, vector, document, metadata in zip(ids, vectors, documents, metadatas):
            record = by_id[key]
            assert np.array_equal(record.vector, vector) and record.document == document
            assert record.metadata == metadata
        # the faiss index belongs to the same version: every vector finds its own record (asked of
        # the backend directly: a search through the batcher would start a thread per load)
        assert loaded.backend_name == "faiss:Flat:cpu"
        _, rows = loaded._backend.search(vectors, 1, None, loaded._store)
        assert [loaded._store.ids[row] for row in rows[:, 0]] == ids
        # the lexical leg is rebuilt from the very records loaded: it can never disagree with them
        loaded._ensure_lexical()
        for i, key in enumerate(ids):
            _, found = loaded._lexical.search(f"document {i}", 1, None, loaded._store.size)
            assert [loaded._store.ids[row] for row in found] == [key], "the lexical leg and the records disagree"
        return v
    finally:
        loaded.close()


def prev_version(folder: Path) -> int | None:
    """The version held by the previous generation, verified whole, or None if there is none."""
    prev = folder / f".{NAME}{_persist._TAG}prev"
    if not prev.exists():
        return None
    snapshot = _generation.read_generation(prev)
    v = snapshot.metadatas[0]["v"]
    assert snapshot.ids == version_data(v)[0]
    return v


def make_siblings(folder: Path) -> dict[str, bytes | None]:
    """The user's own files and folders beside the snapshot, with names close to gpuprompt's."""
    for name in ("kb.bak-2024", "kb.tmp-experiment", "kb.bak-manual", "kbx", "kb.gpuprompt-tmp-mine"):
        (folder / name).mkdir()
        (folder / name / "notes.txt").write_text(f"user data in {name}")
    hidden = folder / f".kb{_persist._TAG}tmp-notmine"  # our prefix, not our exact pattern
    hidden.mkdir()
    (hidden / "keep").write_text("mine")
    (folder / ".kb-notes").write_text("hidden user file")
    (folder / "kb.tmp-1234").write_text("a user file")
    return tree(folder, exclude_ours=True)


def tree(folder: Path, *, exclude_ours: bool = False) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        top = rel.parts[0]
        if exclude_ours and (top == NAME or _is_gpuprompt_name(top)):
            continue
        out[str(rel)] = path.read_bytes() if path.is_file() else None
    return out


def _is_gpuprompt_name(name: str) -> bool:
    names = _persist._Names(Path(NAME))
    return name in (names.prev.name, names.lock.name) or names.is_leftover(name)


def assert_tidy(folder: Path, siblings: dict[str, bytes | None]) -> None:
    """After a finished save: MAIN, PREV, the lock file and the user's entries, nothing else."""
    ours = sorted(p.name for p in folder.iterdir() if p.name == NAME or _is_gpuprompt_name(p.name))
    assert ours == sorted([NAME, f".{NAME}{_persist._TAG}prev", f".{NAME}{_persist._TAG}lock"])
    assert tree(folder, exclude_ours=True) == siblings


@pytest.fixture(scope="module", autouse=True)
def one_faiss_thread() -> Iterator[None]:
    """Hundreds of 8-row searches: OpenMP's thread wake-ups would cost more than the searches."""
    import faiss

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


@pytest.fixture(scope="module")
def versions() -> dict[int, VectorIndex]:
    indexes = {v: make_index(v) for v in range(5)}
    yield indexes
    for index in indexes.values():
        index.close()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, versions) -> tuple[Path, dict[str, bytes | None]]:
    """A folder where versions 0 and 1 were saved (so MAIN and PREV exist), a killed save left a
    half-written temporary folder, and the user keeps folders with similar names."""
    folder = tmp_path_factory.mktemp("template")
    siblings = make_siblings(folder)
    versions[0].save(folder / NAME)
    versions[1].save(folder / NAME)
    leftover = folder / f".{NAME}{_persist._TAG}tmp-{'ab' * 16}"
    leftover.mkdir()
    (leftover / "vectors.npy").write_bytes(b"half a file")
    assert identify(folder / NAME) == 1 and prev_version(folder) == 0
    return folder, siblings


@pytest.fixture()
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync only matters for power loss, which a process kill is not; skipping it keeps 300 runs fast."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


STEP_OR_NONE = [*_persist.STEPS, None]
_seen_steps: set[str] = set()


@pytest.mark.parametrize("first", STEP_OR_NONE)
def test_two_kills_in_a_row_at_every_pair_of_steps(first, template, versions, tmp_path: Path, no_fsync) -> None:
    source, siblings = template
    for second in STEP_OR_NONE:
        folder = tmp_path / f"run-{second}"
        shutil.copytree(source, folder, symlinks=True)
        path = folder / NAME
        finished, newest_loaded = 1, 1
        for version, step in ((2, first), (3, second)):
            with kill_at(step) as seen:
                try:
                    versions[version].save(path)
                    finished = version
                except Killed:
                    pass
            _seen_steps.update(seen)
            loaded = identify(path)
            where = f"kills at {first!r} then {second!r}, after saving v{version}"
            assert finished <= loaded <= version, f"{where}: loaded v{loaded}, last finished v{finished}"
            assert loaded >= newest_loaded, f"{where}: loaded v{loaded} after an earlier load gave v{newest_loaded}"
            newest_loaded = loaded
            prev = prev_version(folder)
            # PREV is older than MAIN; with MAIN missing (killed between the renames) it is what loaded
            assert prev is None or prev < loaded or (prev == loaded and not path.exists()), where
            assert tree(folder, exclude_ours=True) == siblings, f"{where}: the user's files changed"
        # the next save succeeds, whatever state the kills left, and leaves only MAIN and PREV
        versions[4].save(path)
        assert identify(path) == 4 and prev_version(folder) == newest_loaded
        assert_tidy(folder, siblings)
        shutil.rmtree(folder)


def test_every_step_of_the_protocol_is_reached(template, versions, tmp_path: Path, no_fsync) -> None:
    """One full save over MAIN, PREV and a killed save's leftovers passes every step, so the
    matrix above kills the saver at each of them (and, after it, every step it reached is one)."""
    source, _ = template
    folder = tmp_path / "steps"
    shutil.copytree(source, folder, symlinks=True)
    with kill_at(None) as seen:
        versions[2].save(folder / NAME)
    assert set(seen) == set(_persist.STEPS)
    assert _seen_steps <= set(_persist.STEPS)


def test_the_reported_double_crash(template, versions, tmp_path: Path) -> None:
    """Killed while the old backup is deleted, then between the renames of the next save: loads."""
    source, siblings = template
    folder = tmp_path / "run"
    shutil.copytree(source, folder)
    assert not save(versions[2], folder / NAME, "old-deleting")
    assert identify(folder / NAME) == 2  # installed before the deletion began
    assert not save(versions[3], folder / NAME, "main-retired")
    assert not (folder / NAME).exists()
    assert identify(folder / NAME) == 2  # from PREV
    assert not save(versions[4], folder / NAME, "tmp-synced")  # a third kill, with MAIN missing: PREV is kept
    assert identify(folder / NAME) == 2
    versions[3].save(folder / NAME)
    assert identify(folder / NAME) == 3
    assert_tidy(folder, siblings)


def test_a_failed_save_cleans_up_and_keeps_the_old_snapshot(template, versions, tmp_path: Path) -> None:
    source, siblings = template
    folder = tmp_path / "run"
    shutil.copytree(source, folder)

    def disk_full(name: str) -> None:
        if name == "records-written":
            raise OSError(28, "No space left on device")

    _persist._STEP_HOOK = disk_full
    try:
        with pytest.raises(OSError, match="No space"):
            versions[2].save(folder / NAME)
    finally:
        _persist._STEP_HOOK = None
    assert identify(folder / NAME) == 1
    names = _persist._Names(folder / NAME)
    leftovers = [p.name for p in folder.iterdir() if names.is_leftover(p.name)]
    assert leftovers == [f".{NAME}{_persist._TAG}tmp-{'ab' * 16}"]  # its own temporary folder is gone
    assert tree(folder, exclude_ours=True) == siblings


# ---------------------------------------------------------------------------------------- subprocess kills
def _run_child(script: Path, path: Path, version: int, step: str) -> int:
    out = subprocess.run(
        [sys.executable, str(script), str(path), str(version), step],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode in (0, KILLED_RC), out.stderr
    return out.returncode


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("records-written", "none"),
        ("manifest-written", "none"),
        ("main-installed", "none"),
        ("main-retired", "prev-retired"),
        ("old-deleting", "main-retired"),  # the reported double crash, with real process deaths
        ("main-retired", "main-retired"),
        ("prev-retired", "leftover-deleting"),
    ],
)
def test_real_process_kills(first: str, second: str, template, tmp_path: Path) -> None:
    source, siblings = template
    folder = tmp_path / "run"
    shutil.copytree(source, folder)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    finished, newest_loaded = 1, 1
    for version, step in ((2, first), (3, second)):
        if _run_child(script, folder / NAME, version, step) == 0:
            finished = version
        loaded = identify(folder / NAME)
        assert finished <= loaded <= version and loaded >= newest_loaded, (first, second, version, loaded)
        newest_loaded = loaded
        assert tree(folder, exclude_ours=True) == siblings
    assert _run_child(script, folder / NAME, 4, "none") == 0
    assert identify(folder / NAME) == 4 and prev_version(folder) == newest_loaded
    assert_tidy(folder, siblings)


# ---------------------------------------------------------------------------------------- names
def test_save_touches_no_user_name_and_load_never_reads_one(tmp_path: Path, versions) -> None:
    siblings = make_siblings(tmp_path)
    versions[1].save(tmp_path / "kb.bak-manual-copy")  # a valid snapshot under a user's name
    siblings = tree(tmp_path, exclude_ours=True)
    for version in (1, 2, 3):
        versions[version].save(tmp_path / NAME)
        assert tree(tmp_path, exclude_ours=True) == siblings
    assert identify(tmp_path / NAME) == 3
    shutil.rmtree(tmp_path / NAME)
    shutil.rmtree(tmp_path / f".{NAME}{_persist._TAG}prev")
    from gpuprompt.errors import SnapshotError

    with pytest.raises(SnapshotError, match="does not exist"):
        VectorIndex.load(tmp_path / NAME)  # never kb.bak-manual-copy, nor anything else


@pytest.mark.parametrize(
    ("path", "error", "words"),
    [
        (None, InputTypeError, "'path' must be a str or os.PathLike"),
        (3, InputTypeError, "'path' must be a str or os.PathLike"),
        (b"kb", InputTypeError, "'path' must be a str or os.PathLike"),
        (["kb"], InputTypeError, "'path' must be a str or os.PathLike"),
        ("", InvalidInputError, "non-empty"),
        ("kb\x00x", InvalidInputError, "NUL"),
        (".", InvalidInputError, "must name a folder"),
        ("a/..", InvalidInputError, "must name a folder"),
        (".kb.gpuprompt-prev", InvalidInputError, "reserves"),
        (".kb.gpuprompt-lock", InvalidInputError, "reserves"),
        (f".kb.gpuprompt-tmp-{'0' * 32}", InvalidInputError, "reserves"),
        ("k" * 250, InvalidInputError, "at most"),
    ],
)
def test_bad_paths_are_typed_errors(path, error, words: str, versions, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=words):
        versions[0].save(path)
    with pytest.raises(error, match=words):
        VectorIndex.load(path)
    assert list(tmp_path.iterdir()) == []
