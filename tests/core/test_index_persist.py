"""VectorIndex snapshots: round trips per backend, refusal of damaged ones, no pickle, kill mid-save.

The save protocol's every step, killed twice in a row, is in test_snapshot_protocol.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpuprompt import VectorIndex
from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, SnapshotError

PREV = ".snap.gpuprompt-prev"
LOCK = ".snap.gpuprompt-lock"

DIM = 16

BACKENDS = {
    "torch": {"backend": "torch", "device": "cpu"},
    "auto": {},
    "faiss-flat": {"backend": "faiss", "device": "cpu"},
    "faiss-hnsw": {
        "backend": "faiss",
        "device": "cpu",
        "index_factory": "HNSW16",
        "ef_search": 256,
        "compact_fraction": 5.0,
    },
    "faiss-ivf": {"backend": "faiss", "device": "cpu", "index_factory": "IVF8,Flat", "nprobe": 8},
    "faiss-ivf-untrained": {"backend": "faiss", "device": "cpu", "index_factory": "IVF64,Flat", "nprobe": 64},
}


def _data(n: int = 1500, seed: int = 0) -> tuple[list[str], np.ndarray, list[str], list[dict]]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    ids = [f"id-{seed}-{i}" for i in range(n)]
    docs = [f"document {i} ünïcode ✓" if i % 3 else None for i in range(n)]
    metas = [{"i": i, "tags": ["a", "b"][: i % 3], "nested": {"x": i / 7}} for i in range(n)]
    return ids, vectors, docs, metas


def _build(kind: str, n: int = 1500) -> VectorIndex:
    index = VectorIndex(DIM, **BACKENDS[kind])
    ids, vectors, docs, metas = _data(n)
    index.add(ids, vectors, docs, metas)
    index.delete(ids[:100])  # tombstones in HNSW (kept: compact_fraction=5), real removals elsewhere
    index.add(ids[100:150], vectors[100:150] * 2, docs[100:150], metas[100:150])  # upserts
    return index


def _snapshot_of(index: VectorIndex) -> tuple:
    ids = sorted(index.ids())
    records = index.get(ids)
    queries = np.random.default_rng(7).standard_normal((5, DIM)).astype(np.float32)
    hits = [
        [(h.id, round(h.score, 5), h.document, h.metadata) for h in row]
        for row in index.search(queries, k=7, filter={"i": {"$gte": 200}})
    ]
    return ids, [(r.id, r.vector.tobytes(), r.document, r.metadata) for r in records], hits


@pytest.mark.parametrize("kind", list(BACKENDS))
def test_round_trip_per_backend(tmp_path: Path, kind: str) -> None:
    index = _build(kind)
    before = _snapshot_of(index)
    index.save(tmp_path / "snap")
    manifest = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["dim"] == DIM and manifest["metric"] == "cosine"
    assert manifest["count"] == index.count == 1400
    expected_files = {"vectors.npy", "labels.npy", "records.jsonl"}
    if index.backend_name.startswith("faiss") and index._backend.is_trained:
        expected_files.add("index.faiss")
    assert set(manifest["files"]) == expected_files
    for name, info in manifest["files"].items():
        assert hashlib.sha256((tmp_path / "snap" / name).read_bytes()).hexdigest() == info["sha256"]
    loaded = VectorIndex.load(tmp_path / "snap", device="cpu")
    assert loaded.backend_name == index.backend_name
    assert _snapshot_of(loaded) == before
    if kind == "faiss-hnsw":
        assert loaded.stats().tombstones == index.stats().tombstones > 0
    # the loaded index keeps working: new records never alias old labels or tombstones
    ids, vectors, docs, metas = _data(60, seed=1)
    loaded.add(ids, vectors, docs, metas)
    loaded.delete(["id-0-500"])
    hits = loaded.search(vectors[:10], k=1)
    assert [row[0].id for row in hits] == ids[:10]
    assert loaded.count == 1400 + 60 - 1


def test_load_on_another_backend(tmp_path: Path) -> None:
    index = _build("faiss-hnsw")
    index.save(tmp_path / "snap")
    moved = VectorIndex.load(tmp_path / "snap", device="cpu", backend="torch")
    assert moved.backend_name == "torch:cpu:float32"
    assert sorted(moved.ids()) == sorted(index.ids())
    query = index.get(["id-0-700"])[0].vector
    assert moved.search(query, k=1)[0][0].id == "id-0-700"


def test_save_replaces_and_empty_index(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    empty = VectorIndex(DIM)
    empty.save(path)
    assert VectorIndex.load(path).count == 0
    index = _build("torch", 300)
    index.save(path)  # replaces the snapshot; the replaced one is kept as the previous generation
    assert VectorIndex.load(path).count == 200
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK, PREV, "snap"]  # no temporary folders left
    index.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK, PREV, "snap"]  # exactly one previous
    (tmp_path / "empty-dir").mkdir()
    index.save(tmp_path / "empty-dir")  # an empty folder is taken
    assert VectorIndex.load(tmp_path / "empty-dir").count == 200


def test_refuses_to_overwrite_something_else(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("keep me")
    (tmp_path / "file").write_text("x")
    index = _build("torch", 300)
    for target in (tmp_path / "mine", tmp_path / "file"):
        with pytest.raises(InvalidInputError, match="not a snapshot"):
            index.save(target)
    assert (tmp_path / "mine" / "precious.txt").read_text() == "keep me"
    assert (tmp_path / "file").read_text() == "x"
    with pytest.raises(SnapshotError, match="no manifest.json"):
        VectorIndex.load(tmp_path / "mine")
    with pytest.raises(SnapshotError, match="does not exist"):
        VectorIndex.load(tmp_path / "nothing-here")


def test_refuses_folders_it_cannot_prove_it_wrote(tmp_path: Path) -> None:
    index = _build("torch", 300)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "manifest.json").write_text('{"format": "someone-else", "files": {}}')
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    for target in (theirs, tmp_path / "link"):
        with pytest.raises(InvalidInputError, match="not a snapshot"):
            index.save(target)
    assert (theirs / "manifest.json").read_text().startswith('{"format": "someone-else"')
    assert (tmp_path / "link").is_symlink() and list((tmp_path / "real").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "theirs"]  # nothing created beside


def test_save_leaves_the_users_sibling_folders_alone(tmp_path: Path) -> None:
    """save("kb") used to delete kb.bak-2024 and kb.tmp-experiment (its cleanup globbed on the name)."""
    for name in ("kb.bak-2024", "kb.tmp-experiment", "kb.bak-", "kb.tmp-"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text(name)
    index = _build("torch", 300)
    for _ in range(3):
        index.save(tmp_path / "kb")
    for name in ("kb.bak-2024", "kb.tmp-experiment", "kb.bak-", "kb.tmp-"):
        assert (tmp_path / name / "keep.txt").read_text() == name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["kb", ".kb.gpuprompt-prev", ".kb.gpuprompt-lock", "kb.bak-2024", "kb.tmp-experiment", "kb.bak-", "kb.tmp-"]
    )


def test_load_never_reads_a_users_folder(tmp_path: Path) -> None:
    """load("kb") with no kb used to load kb.bak-manual, a user's folder, silently."""
    _build("torch", 300).save(tmp_path / "kb.bak-manual")
    with pytest.raises(SnapshotError, match="does not exist"):
        VectorIndex.load(tmp_path / "kb")


def test_save_and_load_refuse_non_paths(tmp_path: Path) -> None:
    index = _build("torch", 300)
    for bad in (None, 3, b"kb", ["kb"]):
        with pytest.raises(InputTypeError, match="'path' must be a str or os.PathLike"):
            index.save(bad)
        with pytest.raises(InputTypeError, match="'path' must be a str or os.PathLike"):
            VectorIndex.load(bad)
    with pytest.raises(InvalidInputError, match="non-empty"):
        index.save("")


def test_load_options_are_checked(tmp_path: Path) -> None:
    _build("torch", 300).save(tmp_path / "snap")
    with pytest.raises(ConfigurationError, match="'efsearch' must be a VectorIndex option.*Did you mean 'ef_search'"):
        VectorIndex.load(tmp_path / "snap", efsearch=5)
    with pytest.raises(ConfigurationError, match="'metric' must be a VectorIndex option"):
        VectorIndex.load(tmp_path / "snap", metric="l2")  # fixed by the snapshot
    with pytest.raises(ConfigurationError, match="'backend' must be one of"):
        VectorIndex.load(tmp_path / "snap", backend="annoy")
    with pytest.raises(ConfigurationError, match="'device' must be"):
        VectorIndex.load(tmp_path / "snap", device="gpu")
    with pytest.raises(ConfigurationError, match="'ef_search' must be an int >= 1"):
        VectorIndex.load(tmp_path / "snap", ef_search=0)
    assert VectorIndex.load(tmp_path / "snap", ef_search=5, max_batch_size=8).count == 200


# ---------------------------------------------------------------------------------------- damage
@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    _build("faiss-hnsw", 400).save(tmp_path / "snap")
    return tmp_path / "snap"


def _rewrite_manifest(path: Path, change) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _symlinked_vectors(path: Path) -> None:
    real = path.parent / "elsewhere.npy"
    (path / "vectors.npy").rename(real)
    (path / "vectors.npy").symlink_to(real)


def _flip_byte(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (
            lambda p: (p / "vectors.npy").write_bytes((p / "vectors.npy").read_bytes()[:-100]),
            "vectors.npy has .* bytes",
        ),
        (lambda p: (p / "index.faiss").write_bytes((p / "index.faiss").read_bytes()[:50]), "index.faiss has .* bytes"),
        (lambda p: _flip_byte(p / "records.jsonl", 40), "records.jsonl has sha256"),
        (lambda p: _flip_byte(p / "vectors.npy", 500), "vectors.npy has sha256"),
        (lambda p: _flip_byte(p / "index.faiss", 300), "index.faiss has sha256"),
        (lambda p: (p / "labels.npy").unlink(), "labels.npy is missing"),
        (lambda p: (p / "manifest.json").write_text("{not json"), "not valid JSON"),
        (lambda p: (p / "manifest.json").write_text((p / "manifest.json").read_text()[:30]), "not valid JSON"),
        (lambda p: _rewrite_manifest(p, lambda m: m.update(format_version=99)), "format version 99"),
        (lambda p: _rewrite_manifest(p, lambda m: m.update(format="other")), "not a gpuprompt.vector-index"),
        (lambda p: _rewrite_manifest(p, lambda m: m.update(dim="16")), "'dim' must be a int"),
        (
            lambda p: _rewrite_manifest(p, lambda m: m.update(count=999, next_label=5000)),
            "expected float32 \\(999, 16\\)",
        ),
        (lambda p: _rewrite_manifest(p, lambda m: m.update(count=999)), "'next_label' must be >= count"),
        (lambda p: _rewrite_manifest(p, lambda m: m["files"].pop("records.jsonl")), "it needs"),
        (lambda p: _rewrite_manifest(p, lambda m: m["files"].update({"../x": {}})), "bad file name"),
        (lambda p: _rewrite_manifest(p, lambda m: m["files"].update({"extra.bin": {}})), "not one of"),
        (lambda p: _rewrite_manifest(p, lambda m: m.update(count=-1)), "'count' must be an int >= 0"),
        (lambda p: _rewrite_manifest(p, lambda m: m.update(metric="dot")), "'metric' must be one of"),
        (lambda p: _rewrite_manifest(p, lambda m: m["config"].update(efsearch=3)), "config is invalid.*efsearch"),
        (lambda p: _rewrite_manifest(p, lambda m: m["config"].update(ef_search=-1)), "config is invalid.*ef_search"),
        (lambda p: _rewrite_manifest(p, lambda m: m["config"].update(metric="l2")), "config is invalid"),
        (lambda p: (p / "manifest.json").write_text("[" * 100_000), "not valid JSON"),
        (lambda p: (p / "manifest.json").write_text('{"format": NaN}'), "not valid JSON"),
        (_symlinked_vectors, "vectors.npy is not a regular file"),
    ],
)
def test_damaged_snapshot_is_refused(saved: Path, damage, words: str) -> None:
    damage(saved)
    with pytest.raises(SnapshotError, match=words):
        VectorIndex.load(saved)


def _rechecksum(path: Path, name: str) -> None:
    data = (path / name).read_bytes()
    _rewrite_manifest(
        path, lambda m: m["files"].update({name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}})
    )


def test_pickle_payload_never_executes(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    # An object array is stored with pickle by numpy; the checksum is made to match, as an attacker would.
    with open(saved / "vectors.npy", "wb") as handle:
        np.save(handle, np.array([Evil()], dtype=object), allow_pickle=True)
    _rechecksum(saved, "vectors.npy")
    with pytest.raises(SnapshotError, match="not a plain numeric .npy"):
        VectorIndex.load(saved)
    assert not marker.exists()


def test_inconsistent_but_checksummed_content_is_refused(saved: Path) -> None:
    lines = (saved / "records.jsonl").read_text(encoding="utf-8").splitlines()
    (saved / "records.jsonl").write_text("\n".join(lines[:-1] + [lines[0]]) + "\n", encoding="utf-8")
    _rechecksum(saved, "records.jsonl")
    with pytest.raises(SnapshotError, match="repeats an id"):
        VectorIndex.load(saved)
    (saved / "records.jsonl").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    _rechecksum(saved, "records.jsonl")
    with pytest.raises(SnapshotError, match="holds 299 records"):
        VectorIndex.load(saved)
    (saved / "records.jsonl").write_text("\n".join(['{"id": 3, "document": null, "metadata": {}}'] + lines[1:]) + "\n")
    _rechecksum(saved, "records.jsonl")
    with pytest.raises(SnapshotError, match="line 1"):
        VectorIndex.load(saved)


def _tamper_records(path: Path, line: str) -> None:
    lines = (path / "records.jsonl").read_text(encoding="utf-8").splitlines()
    (path / "records.jsonl").write_text("\n".join([line] + lines[1:]) + "\n", encoding="utf-8")
    _rechecksum(path, "records.jsonl")


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"id": "\\ud800", "document": null, "metadata": {}}', "lone surrogate"),
        ('{"id": "a", "document": "x\\udfff", "metadata": {}}', "lone surrogate"),
        ('{"id": "a", "document": null, "metadata": {"k\\ud800": 1}}', "lone surrogate"),
        ('{"id": "a", "document": null, "metadata": {"n": ' + "9" * 400 + "}}", "not valid JSON|64 bits"),
        ('{"id": "a", "document": null, "metadata": {"n": 9223372036854775808}}', "within 64 bits"),
        ('{"id": "a", "document": null, "metadata": {"x": NaN}}', "not valid JSON"),
        ('{"id": "a", "document": null, "metadata": {"x": Infinity}}', "not valid JSON"),
        ('{"id": "a", "document": null, "metadata": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}", "nested at most"),
        ('{"id": "a", "document": null, "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}", "not valid JSON"),
        ('{"id": "", "document": null, "metadata": {}}', "line 1 is not"),
        ("[1, 2]", "line 1 is not a JSON object"),
    ],
)
def test_hostile_records_are_refused(saved: Path, line: str, words: str) -> None:
    _tamper_records(saved, line)
    with pytest.raises(SnapshotError, match=words):
        VectorIndex.load(saved)


@pytest.mark.parametrize(
    ("values", "metric", "words"),
    [
        (np.nan, "cosine", "row 3 holds NaN or inf"),
        (np.inf, "cosine", "row 3 holds NaN or inf"),
        (3e19, "l2", "row 3 has a squared norm above"),
    ],
)
def test_tampered_vectors_are_refused(tmp_path: Path, values: float, metric: str, words: str) -> None:
    """A NaN written into vectors.npy (checksum redone) used to load, and rank first in every search."""
    path = tmp_path / "snap"
    index = VectorIndex(DIM, metric=metric, backend="torch", device="cpu")
    index.add([str(i) for i in range(10)], np.random.default_rng(0).standard_normal((10, DIM)))
    index.save(path)
    vectors = np.load(path / "vectors.npy")
    vectors[3, 5] = values
    (path / "vectors.npy").unlink()
    np.save(path / "vectors.npy", vectors)
    _rechecksum(path, "vectors.npy")
    with pytest.raises(SnapshotError, match=words):
        VectorIndex.load(path)


def test_a_damaged_snapshot_falls_back_to_the_previous_generation(tmp_path: Path, caplog) -> None:
    path = tmp_path / "snap"
    old = _build("torch", 300)
    old.save(path)
    new = _build("torch", 400)
    new.save(path)
    assert VectorIndex.load(path).count == 300
    _flip_byte(path / "vectors.npy", 500)
    with caplog.at_level("WARNING", logger="gpuprompt.index._persist"):
        restored = VectorIndex.load(path)
    assert _snapshot_of(restored) == _snapshot_of(old)
    assert "loaded its previous generation" in caplog.text and "sha256" in caplog.text
    _flip_byte(tmp_path / PREV / "records.jsonl", 10)
    with pytest.raises(SnapshotError, match="vectors.npy has sha256.*previous generation was refused too.*records"):
        VectorIndex.load(path)


# ---------------------------------------------------------------------------------------- crashes
_CHILD = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from gpuprompt import VectorIndex
    from gpuprompt.index import _persist

    path, mode = sys.argv[1], sys.argv[2]
    index = VectorIndex(16, backend="faiss", index_factory="HNSW16")
    rng = np.random.default_rng(5)
    index.add([f"new-{i}" for i in range(500)], rng.standard_normal((500, 16)).astype(np.float32))

    def pause():
        print("PAUSED", flush=True)
        time.sleep(600)

    # "writing": vectors and records are in the temp folder, the manifest not yet;
    # "swapping": the old snapshot is renamed to the previous generation, the new one not yet in place
    pause_at = "records-written" if mode == "writing" else "main-retired"
    _persist._STEP_HOOK = lambda step: pause() if step == pause_at else None
    index.save(path)
    print("SAVED", flush=True)
    """
)


@pytest.mark.parametrize("mode", ["writing", "swapping"])
def test_save_killed_midway_leaves_previous_snapshot_loadable(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "snap"
    previous = _build("torch", 300)
    previous.save(path)
    expected = _snapshot_of(previous)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(path), mode], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "PAUSED", line
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=60)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    names = sorted(re.sub("-[0-9a-f]{32}$", "", p.name) for p in tmp_path.iterdir() if "snap" in p.name)
    tmp = ".snap.gpuprompt-tmp"
    assert names == ([LOCK, tmp, "snap"] if mode == "writing" else [LOCK, PREV, tmp])
    restored = VectorIndex.load(path)
    assert _snapshot_of(restored) == expected
    # the next save succeeds and clears the leftovers
    restored.save(path)
    assert sorted(p.name for p in tmp_path.iterdir() if "snap" in p.name) == [LOCK, PREV, "snap"]
    assert _snapshot_of(VectorIndex.load(path)) == expected


# ---------------------------------------------------------------------------------------- refused paths
def test_save_and_load_below_a_file_name_the_file(tmp_path: Path) -> None:
    """save("afile/sub") with afile a regular file raised a builtin FileExistsError."""
    (tmp_path / "afile").write_text("x")
    index = _build("torch", 300)
    for target in (tmp_path / "afile" / "sub", tmp_path / "afile" / "deeper" / "sub"):
        with pytest.raises(InvalidInputError, match="parents are folders") as caught:
            index.save(target)
        assert f"{str(tmp_path / 'afile')!r} is a file" in str(caught.value) and str(target) in str(caught.value)
        with pytest.raises(SnapshotError, match=re.escape(f"{str(tmp_path / 'afile')!r} is a file, not a folder")):
            VectorIndex.load(target)
    assert (tmp_path / "afile").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing created beside it


# Runs where permissions bind (a non-root user, or root without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH):
# each case prints its outcome as one JSON line.
_NO_PERMISSION = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from gpuprompt import VectorIndex
    from gpuprompt.errors import StorageError

    root = Path(sys.argv[1])
    index = VectorIndex(4, backend="torch", device="cpu")
    index.add(["a", "b"], np.eye(2, 4, dtype=np.float32))

    def outcome(case, call):
        try:
            call()
        except Exception as exc:
            out = {"type": type(exc).__name__, "message": str(exc), "oserror": isinstance(exc, OSError),
                   "errno": getattr(exc, "errno", None), "storage": isinstance(exc, StorageError)}
        else:
            out = {"type": None}
        print(json.dumps({"case": case, **out}), flush=True)

    outcome("save-into-read-only", lambda: index.save(root / "ro" / "snap"))
    outcome("save-below-read-only", lambda: index.save(root / "ro" / "new" / "snap"))
    outcome("resave-read-only", lambda: index.save(root / "frozen" / "snap"))
    outcome("load-unreadable-main", lambda: VectorIndex.load(root / "hidden" / "snap"))
    outcome("load-unsearchable-parent", lambda: VectorIndex.load(root / "closed" / "snap"))
    outcome("load-unreadable-files", lambda: VectorIndex.load(root / "files" / "snap"))
    """
)


def _drop_dac_capabilities() -> None:  # runs in the child between fork and exec
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: what lets root ignore modes
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone from the exec'd program
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_save_and_load_without_permission_raise_storage_errors(tmp_path: Path) -> None:
    """A folder this process may not write or read: a typed StorageError naming the path, the
    previous snapshot kept, and never an older generation loaded in place of an unreadable one."""
    import errno
    import stat

    index = _build("torch", 300)
    for name in ("frozen", "hidden", "closed", "files"):
        index.save(tmp_path / name / "snap")
        index.save(tmp_path / name / "snap")  # a previous generation beside it, too
    (tmp_path / "ro").mkdir()
    modes = {"ro": 0o555, "frozen": 0o555, "hidden/snap": 0o000, "closed": 0o000}
    for name, mode in modes.items():
        (tmp_path / name).chmod(mode)
    for file in (tmp_path / "files" / "snap").iterdir():
        file.chmod(0o000)
    script = tmp_path / "child.py"
    script.write_text(_NO_PERMISSION)
    as_root = os.geteuid() == 0
    try:
        child = subprocess.run(
            [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300,
            preexec_fn=_drop_dac_capabilities if as_root else None,
        )
    except subprocess.SubprocessError as exc:
        if as_root:
            pytest.skip(f"running as root and could not drop CAP_DAC_OVERRIDE to make permissions bind: {exc}")
        raise
    finally:
        for name in modes:
            (tmp_path / name).chmod(0o755)
        for file in (tmp_path / "files" / "snap").iterdir():
            file.chmod(0o644)
    assert child.returncode == 0, child.stderr[-3000:]
    results = {row["case"]: row for row in map(json.loads, child.stdout.splitlines())}
    where = {"save-into-read-only": "ro/snap", "save-below-read-only": "ro/new/snap", "resave-read-only": "frozen/snap",
             "load-unreadable-main": "hidden/snap", "load-unsearchable-parent": "closed/snap",
             "load-unreadable-files": "files/snap"}
    assert set(results) == set(where)
    for case, target in where.items():
        row = results[case]
        assert row["type"] == "StorageError" and row["storage"] and row["oserror"], row
        assert row["errno"] == errno.EACCES, row
        assert repr(str(tmp_path / target)) in row["message"], row
        assert "may not" in row["message"] and ("write" if "save" in case else "read") in row["message"]
    # Nothing was left behind, and the snapshots that could not be rewritten or read still load whole.
    assert sorted(p.name for p in (tmp_path / "ro").iterdir()) == []
    for name in ("frozen", "hidden", "closed", "files"):
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == [LOCK, PREV, "snap"]
        assert _snapshot_of(VectorIndex.load(tmp_path / name / "snap")) == _snapshot_of(index)
    assert stat.S_IMODE((tmp_path / "ro").stat().st_mode) == 0o755
