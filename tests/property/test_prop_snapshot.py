"""Tampered snapshots: flipped bytes, truncation, replaced arrays (with the manifest checksum kept
or recomputed), edited manifest fields, bad records.jsonl. Loading gives a typed error (a
SnapshotError, or another GPUPromptError) or a consistent index -- never a crash or a builtin error.
The loaders of both adapters are driven with the same snapshots.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import prop_helpers as H
from gpuprompt import VectorIndex
from gpuprompt.errors import GPUPromptError

DIM = 6
FILES = ["vectors.npy", "labels.npy", "records.jsonl", "manifest.json", "index.faiss"]


def _build(backend: str, factory: str | None, root: Path) -> Path:
    rng = np.random.default_rng(3)
    options = {"index_factory": factory} if factory else {}
    index = VectorIndex(DIM, backend=backend, device="cpu", **options)
    n = 40 if factory and factory.startswith("IVF") else 5
    index.add(
        [f"id{i}" for i in range(n)],
        rng.standard_normal((n, DIM)).astype(np.float32),
        documents=[f"doc {i} \u00e9\U0001f600" for i in range(n)],
        metadatas=[{"i": i, "tags": ["a", i], "n": {"x": i % 2}} for i in range(n)],
    )
    index.delete(["id1"])
    index.search(np.ones(DIM, dtype=np.float32), k=2)
    path = root / "snap"
    index.save(path)
    index.close()
    return path


SOURCES = [("torch", None), ("faiss", None), ("faiss", "HNSW8")]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str | None], Path]:
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for i, (backend, factory) in enumerate(SOURCES):
        (root / str(i)).mkdir()
        out[(backend, factory)] = _build(backend, factory, root / str(i))
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _reseal(snapshot: Path, name: str) -> None:
    """Recompute the manifest's checksum and size of ``name`` (a tamper that knows the format)."""
    manifest_path = snapshot / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError, RecursionError):
        return  # already broken by an earlier tamper
    file = snapshot / name
    if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) and file.is_file():
        manifest["files"][name] = {"sha256": _sha(file), "bytes": file.stat().st_size}
    manifest_path.write_text(json.dumps(manifest, indent=2))


def _npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def _vector_replacements(count: int) -> list[tuple[str, bytes]]:
    base = np.random.default_rng(0).standard_normal((count, DIM)).astype(np.float32)
    nan = base.copy()
    nan[-1, 0] = np.nan
    inf = base.copy()
    inf[0, -1] = np.inf
    return [
        ("nan", _npy(nan)),
        ("inf", _npy(inf)),
        ("float64", _npy(base.astype(np.float64))),
        ("float16", _npy(base.astype(np.float16))),
        ("int32", _npy(base.astype(np.int32))),
        ("rows+1", _npy(np.vstack([base, base[:1]]))),
        ("rows-1", _npy(base[:-1])),
        ("dim+1", _npy(np.hstack([base, base[:, :1]]))),
        ("flat", _npy(base.reshape(-1))),
        ("3d", _npy(base.reshape(count, DIM, 1))),
        ("scalar", _npy(np.float32(1.0).reshape(()))),
        ("fortran", _npy(np.asfortranarray(base))),
        ("bigendian", _npy(base.astype(">f4"))),
        ("object-pickle", _npy(np.array([{"x": 1}] * count, dtype=object), allow_pickle=True)),
        ("structured", _npy(np.zeros(count, dtype=[("a", "f4"), ("b", "f4")]))),
        ("huge-finite", _npy(np.full((count, DIM), 3.0e38, dtype=np.float32))),
        ("empty-file", b""),
        ("not-npy", b"PK\x03\x04 this is a zip"),
    ]


def _label_replacements(count: int) -> list[tuple[str, bytes]]:
    labels = np.arange(count, dtype=np.int64)
    return [
        ("dup", _npy(np.zeros(count, dtype=np.int64))),
        ("negative", _npy(labels - 5)),
        ("huge", _npy(labels + 2**62)),
        ("int32", _npy(labels.astype(np.int32))),
        ("uint64", _npy(labels.astype(np.uint64) + np.uint64(2**63))),
        ("float", _npy(labels.astype(np.float64))),
        ("short", _npy(labels[:-1])),
    ]


def _record_lines(count: int) -> list[tuple[str, str]]:
    deep = "[" * 5000 + "]" * 5000
    deep_meta = json.dumps({"id": "x", "document": None, "metadata": H.deep_dict(40)})
    return [
        ("bad-json", "{not json"),
        ("deep-json", deep),
        ("deep-object", '{"id": "x", "document": null, "metadata": ' + "{\"a\": " * 3000 + "1" + "}" * 3000 + "}"),
        ("deep-metadata-40", deep_meta),
        ("lone-surrogate-id", '{"id": "\\ud800", "document": null, "metadata": {}}'),
        ("lone-surrogate-doc", '{"id": "q", "document": "\\udfff", "metadata": {}}'),
        ("lone-surrogate-key", '{"id": "q", "document": null, "metadata": {"\\ud800": 1}}'),
        ("nan-constant", '{"id": "q", "document": null, "metadata": {"a": NaN}}'),
        ("huge-int", '{"id": "q", "document": null, "metadata": {"a": ' + "9" * 400 + "}}"),
        ("huge-float", '{"id": "q", "document": null, "metadata": {"a": 1e999}}'),
        ("int-id", '{"id": 5, "document": null, "metadata": {}}'),
        ("empty-id", '{"id": "", "document": null, "metadata": {}}'),
        ("list-metadata", '{"id": "q", "document": null, "metadata": []}'),
        ("array", "[1, 2, 3]"),
        ("null", "null"),
        ("dup-id", '{"id": "id0", "document": null, "metadata": {}}'),
        ("nul", '{"id": "q\\u0000", "document": "\\u0000", "metadata": {"\\u0000": "\\u0000"}}'),
        ("invalid-utf8", "\udcff"),  # written with surrogateescape: a raw 0xff byte
        ("bom", '\ufeff{"id": "q", "document": null, "metadata": {}}'),
        ("many-digits", '{"id": "q", "document": null, "metadata": {"a": ' + "1" * 5000 + "}}"),
    ]


MANIFEST_FIELDS = [
    "format",
    "format_version",
    "dim",
    "metric",
    "count",
    "next_label",
    "backend",
    "faiss_factory",
    "tombstones",
    "config",
    "files",
    "created_at",
    "gpuprompt_version",
]
CONFIG_FIELDS = ["backend", "index_factory", "ef_search", "ef_construction", "nprobe", "dtype", "ann_threshold", "compact_fraction", "bogus_option", "max_queue"]

json_junk = st.one_of(
    H.json_values,
    st.sampled_from([None, True, False, 0, -1, 1, 2**63, 10**400, -(10**400), 1e308, -0.0, "", "cosine", "faiss", "torch", "l2", "HNSW8", "IVF4,Flat", "bogus", [], {}, {"sha256": "0", "bytes": -1}]),
    st.integers(-3, 2 * DIM),
)

tamper = st.one_of(
    st.tuples(st.just("flip"), st.sampled_from(FILES), st.integers(0, 10**6), st.integers(1, 255), st.booleans()),
    st.tuples(st.just("truncate"), st.sampled_from(FILES), st.integers(0, 10**6), st.booleans()),
    st.tuples(st.just("vectors"), st.integers(0, 17), st.booleans()),
    st.tuples(st.just("labels"), st.integers(0, 6), st.booleans()),
    st.tuples(st.just("records"), st.integers(0, 19), st.sampled_from(["replace", "append", "only"]), st.booleans()),
    st.tuples(st.just("manifest"), st.sampled_from(MANIFEST_FIELDS), json_junk),
    st.tuples(st.just("config"), st.sampled_from(CONFIG_FIELDS), json_junk),
    st.tuples(st.just("manifest-raw"), st.sampled_from(["", "[]", "null", "{", '{"format": NaN}', "[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000])),
    st.tuples(st.just("remove"), st.sampled_from(FILES)),
    st.tuples(st.just("dir"), st.sampled_from(FILES)),
)


def _manifest(snapshot: Path) -> dict | None:
    try:
        manifest = json.loads((snapshot / "manifest.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _writable(path: Path) -> Path:
    """``path``, with a folder an earlier tamper put there removed, so a file can be written."""
    if path.is_dir():
        shutil.rmtree(path)
    return path


def _apply(snapshot: Path, how: tuple, count: int) -> None:
    """Apply one tamper (``count``: the pristine record count)."""
    kind = how[0]
    if kind == "flip":
        _, name, pos, xor, reseal = how
        file = snapshot / name
        if not file.is_file():
            return
        data = bytearray(file.read_bytes())
        if data:
            data[pos % len(data)] ^= xor
            file.write_bytes(bytes(data))
        if reseal and name != "manifest.json":
            _reseal(snapshot, name)
    elif kind == "truncate":
        _, name, size, reseal = how
        file = snapshot / name
        if not file.is_file():
            return
        data = file.read_bytes()
        file.write_bytes(data[: size % max(1, len(data))])
        if reseal and name != "manifest.json":
            _reseal(snapshot, name)
    elif kind == "vectors":
        _, which, reseal = how
        _writable(snapshot / "vectors.npy").write_bytes(_vector_replacements(count)[which][1])
        if reseal:
            _reseal(snapshot, "vectors.npy")
    elif kind == "labels":
        _, which, reseal = how
        _writable(snapshot / "labels.npy").write_bytes(_label_replacements(count)[which][1])
        if reseal:
            _reseal(snapshot, "labels.npy")
    elif kind == "records":
        _, which, mode, reseal = how
        line = _record_lines(count)[which][1]
        file = snapshot / "records.jsonl"
        if not file.is_file():
            return
        lines = file.read_text(encoding="utf-8", errors="surrogateescape").splitlines() or [""]
        if mode == "replace":
            lines[-1] = line
        elif mode == "append":
            lines.append(line)
        else:
            lines = [line]
        file.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
        if reseal:
            _reseal(snapshot, "records.jsonl")
    elif kind == "manifest":
        _, field, value = how
        manifest = _manifest(snapshot)
        if manifest is not None:
            manifest[field] = value
            (snapshot / "manifest.json").write_text(json.dumps(manifest))
    elif kind == "config":
        _, field, value = how
        manifest = _manifest(snapshot)
        if manifest is not None and isinstance(manifest.get("config"), dict):
            manifest["config"][field] = value
            (snapshot / "manifest.json").write_text(json.dumps(manifest))
    elif kind == "manifest-raw":
        _writable(snapshot / "manifest.json").write_text(how[1])
    elif kind == "remove":
        file = snapshot / how[1]
        if file.is_dir():
            shutil.rmtree(file)
        elif file.exists():
            file.unlink()
    elif kind == "dir":
        file = snapshot / how[1]
        if file.is_file():
            file.unlink()
        file.mkdir(exist_ok=True)


def _load_with(loader: str, path: Path):
    if loader == "core":
        return VectorIndex.load(path, device="cpu")
    if loader == "langchain":
        from langchain_gpuprompt import GPUPromptEmbeddings, GPUPromptVectorStore

        store = GPUPromptVectorStore.load_local(str(path.parent), GPUPromptEmbeddings(device="cpu"), index_name=path.name, device="cpu")
        return store.index
    from llamaindex_gpuprompt import GPUPromptVectorStore

    return GPUPromptVectorStore.from_persist_path(str(path), device="cpu").client


CLASS_OF_LOADER = {"core": "VectorIndex", "langchain": "GPUPromptVectorStore(langchain)", "llamaindex": "GPUPromptVectorStore(llamaindex)"}


def _consistent(index: VectorIndex) -> None:
    state = H.index_state(index)
    n = index.count
    hits = index.search(np.ones(DIM, dtype=np.float32), k=max(1, n))[0]
    assert len(hits) == n
    assert all(math.isfinite(h.score) for h in hits), [h.score for h in hits]
    assert index.ids(filter={"i": {"$gte": 0}}) is not None
    with tempfile.TemporaryDirectory() as tmp:
        index.save(Path(tmp) / "again")
        again = VectorIndex.load(Path(tmp) / "again", device="cpu")
        try:
            assert H.index_state(again) == state
        finally:
            again.close()


@pytest.mark.timeout(240)
@H.fast(80)
@given(
    source=st.sampled_from(SOURCES),
    tampers=st.lists(tamper, min_size=1, max_size=2),
    loader=st.sampled_from(["core", "core", "langchain", "llamaindex"]),
)
def test_tampered_snapshot_loads_typed_or_consistent(pristine, source, tampers, loader) -> None:
    H.count(CLASS_OF_LOADER[loader])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snap"
        shutil.copytree(pristine[source], path)
        count = json.loads((path / "manifest.json").read_text())["count"]
        for how in tampers:
            _apply(path, how, count)
        ok, index = H.typed_or_ok(lambda: _load_with(loader, path))
        if not ok:
            assert isinstance(index, GPUPromptError)
            return
        try:
            _consistent(index)
        finally:
            index.close()


# ---------------------------------------------------------------------------------------- index.faiss
_FAISS_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, random, shutil, sys, tempfile
    from pathlib import Path
    import numpy as np
    from gpuprompt import VectorIndex
    from gpuprompt.errors import GPUPromptError

    src, cases = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(7)
    for case in range(cases):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "snap"
            shutil.copytree(src, path)
            file = path / "index.faiss"
            data = bytearray(file.read_bytes())
            kind = ("flip", "truncate", "garbage", "extend")[case % 4]
            if kind == "flip":
                for _ in range(rng.randint(1, 4)):
                    data[rng.randrange(len(data))] ^= rng.randint(1, 255)
            elif kind == "truncate":
                data = data[: rng.randrange(len(data))]
            elif kind == "garbage":
                data = bytearray(rng.randbytes(rng.randint(0, 400)))
            else:
                data += rng.randbytes(rng.randint(1, 64))
            file.write_bytes(bytes(data))
            manifest = json.loads((path / "manifest.json").read_text())
            manifest["files"]["index.faiss"] = {"sha256": hashlib.sha256(bytes(data)).hexdigest(), "bytes": len(data)}
            (path / "manifest.json").write_text(json.dumps(manifest))
            print(f"CASE {case} {kind} {bytes(data[:64]).hex()} len={len(data)}", flush=True)
            try:
                index = VectorIndex.load(path, device="cpu")
            except GPUPromptError as exc:
                print(f"TYPED {type(exc).__name__}", flush=True)
                continue
            except BaseException as exc:
                print(f"UNTYPED {type(exc).__name__}: {exc}", flush=True)
                continue
            try:
                hits = index.search(np.ones(index.dim, dtype=np.float32), k=max(1, index.count))[0]
                ok = len(hits) == index.count and all(np.isfinite(h.score) for h in hits)
                print("LOADED " + ("consistent" if ok else f"INCONSISTENT {len(hits)} hits for {index.count}"), flush=True)
            except GPUPromptError as exc:
                print(f"LOADED then TYPED {type(exc).__name__}", flush=True)
            except BaseException as exc:
                print(f"LOADED then UNTYPED {type(exc).__name__}: {exc}", flush=True)
            index.close()
    print("DONE", flush=True)
    """
)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("source", [("faiss", None), ("faiss", "HNSW8")], ids=["Flat", "HNSW8"])
def test_tampered_faiss_file_never_crashes(pristine, source) -> None:
    """index.faiss tampered with and re-checksummed: faiss parses it, so run it in a child process
    (a segfault there must not take the test session down) and require a typed error or a
    consistent index for each case."""
    cases = 24
    proc = subprocess.run(
        [sys.executable, "-c", _FAISS_SCRIPT, str(pristine[source]), str(cases)],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    H.count("VectorIndex", cases)
    lines = proc.stdout.splitlines()
    bad = [(lines[i - 1] if i else "", line) for i, line in enumerate(lines) if "UNTYPED" in line or "INCONSISTENT" in line]
    last_case = next((line for line in reversed(lines) if line.startswith("CASE")), "")
    assert proc.returncode == 0 and "DONE" in lines, (
        f"the loader crashed (exit {proc.returncode}) on {last_case!r}; stderr tail: {proc.stderr[-800:]}"
    )
    assert not bad, f"untyped errors or inconsistent loads: {bad[:5]}"
