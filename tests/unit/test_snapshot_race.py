"""save() racing switch_backend(), add() and delete(): every snapshot written must load, whole.

save() used to read the backend before taking the index's locks, so a switch between the read and
the lock wrote one backend's faiss file beside another state's records (13 of 59 snapshots did
not load). Now the backend and the records are read under the lock writers take.
"""

from __future__ import annotations

import threading
import time
import zlib
from pathlib import Path

import numpy as np

from gpuprompt import VectorIndex

DIM = 8
BATCH = 5
SECONDS = 4.0  # how long the writers race; the test then loads every snapshot (bounded well under 20 s)
MAX_SAVES = 40
BACKENDS = [("faiss", "HNSW16"), ("faiss", "Flat"), ("torch", None), ("auto", None)]


def _vector(key: str, version: int) -> np.ndarray:
    seed = zlib.crc32(f"{key}:{version}".encode())
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def _add(index: VectorIndex, keys: list[str], version: int) -> None:
    index.add(
        keys,
        np.stack([_vector(key, version) for key in keys]),
        [f"{key}:{version}" for key in keys],
        [{"version": version, "batch": key.split("-")[0]} for key in keys],
    )


def test_snapshots_written_during_switches_and_writes_all_load(tmp_path: Path) -> None:
    index = VectorIndex(DIM, backend="faiss", index_factory="HNSW16", ef_search=256, compact_fraction=5.0)
    _add(index, [f"base{i // BATCH}-{i}" for i in range(100)], 0)
    deadline = time.monotonic() + SECONDS
    saved: list[Path] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def run(body) -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
            done.set()

    def saver() -> None:
        while time.monotonic() < deadline and len(saved) < MAX_SAVES and not done.is_set():
            path = tmp_path / f"snap-{len(saved)}"
            index.save(path)
            saved.append(path)
        done.set()

    def switcher() -> None:
        turn = 0
        while not done.is_set():
            backend, factory = BACKENDS[turn % len(BACKENDS)]
            index.switch_backend(backend, index_factory=factory)
            turn += 1

    def adder() -> None:
        batch = 0
        rng = np.random.default_rng(1)
        while not done.is_set():
            keys = [f"b{batch}-{j}" for j in range(BATCH)]
            _add(index, keys, 1)
            if batch and rng.random() < 0.5:  # upsert a whole earlier batch to a new version
                old = int(rng.integers(0, batch))
                _add(index, [f"b{old}-{j}" for j in range(BATCH)], 2 + batch)
            if batch and rng.random() < 0.3:  # delete a whole earlier batch (tombstones in HNSW)
                gone = int(rng.integers(0, batch))
                index.delete([f"b{gone}-{j}" for j in range(BATCH)])
            batch += 1

    threads = [threading.Thread(target=run, args=(body,)) for body in (saver, switcher, adder)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    if errors:
        raise errors[0]
    assert len(saved) >= 5

    backends: set[str | None] = set()
    for path in saved:
        loaded = VectorIndex.load(path, device="cpu", max_wait_ms=0)  # raised SnapshotError before the fix
        backends.add(loaded.backend_name)
        records = loaded.get(loaded.ids())
        assert len(records) == loaded.count
        batches: dict[str, set[str]] = {}
        for record in records:
            version = record.metadata["version"]
            # a record's vector, document and metadata come from one write
            assert record.document == f"{record.id}:{version}", path
            assert np.array_equal(record.vector, _vector(record.id, version)), path
            batches.setdefault(record.metadata["batch"], set()).add(record.id)
        # writes are atomic: a batch is in a snapshot whole or not at all, all at one version
        for batch, keys in batches.items():
            assert len(keys) == BATCH, (path, batch, sorted(keys))
            assert len({r.metadata["version"] for r in records if r.metadata["batch"] == batch}) == 1
        # the backend holds exactly these records: each vector finds its own record
        sample = records[:: max(1, len(records) // 50)]
        hits = loaded.search(np.stack([r.vector for r in sample]), k=1)
        found = sum(row[0].id == record.id for row, record in zip(hits, sample))
        assert found >= 0.95 * len(sample), (path, loaded.backend_name, found, len(sample))
        loaded.close()
    index.close()
    # the snapshots caught the index on more than one backend (a switch raced each of them)
    assert len(backends) >= 2, backends


class _Interleaved:
    """A lock that, before it is taken, lets ``during`` run to completion on another thread.

    Placed as the index's save lock, it runs a switch and a write exactly in the window where the
    old save() had already read the backend but had not yet locked the index.
    """

    def __init__(self, during) -> None:
        self._lock = threading.Lock()
        self._during = during

    def __enter__(self) -> bool:
        thread = threading.Thread(target=self._during)
        thread.start()
        thread.join()
        return self._lock.__enter__()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.__exit__(*exc_info)


def test_a_switch_and_a_write_just_before_the_save_locks(tmp_path: Path) -> None:
    index = VectorIndex(DIM, backend="faiss", index_factory="HNSW16", ef_search=256)
    _add(index, [f"a{i // BATCH}-{i}" for i in range(50)], 0)

    def switch_and_write() -> None:
        index.switch_backend("faiss", index_factory="Flat")
        _add(index, [f"z{i // BATCH}-{i}" for i in range(10)], 1)

    index._save_lock = _Interleaved(switch_and_write)
    index.save(tmp_path / "snap")
    loaded = VectorIndex.load(tmp_path / "snap", device="cpu", max_wait_ms=0)  # ntotal mismatch before the fix
    assert loaded.count == 60 and loaded.backend_name == "faiss:Flat:cpu"
    assert [row[0].id for row in loaded.search(_vector("z1-7", 1), k=1)] == ["z1-7"]


def test_a_save_is_not_starved_by_writers(tmp_path: Path) -> None:
    """A thread switching backends and one adding, in loops, used to keep save() (a reader) waiting forever."""
    index = VectorIndex(DIM, backend="faiss", index_factory="HNSW16")
    _add(index, [f"s{i // BATCH}-{i}" for i in range(300)], 0)
    stop = threading.Event()

    def switcher() -> None:
        turn = 0
        while not stop.is_set():
            index.switch_backend("faiss", index_factory="HNSW16" if turn % 2 else "Flat")
            turn += 1

    def adder() -> None:
        turn = 0
        while not stop.is_set():
            _add(index, [f"w{turn}-{j}" for j in range(BATCH)], 1)
            turn += 1

    threads = [threading.Thread(target=body) for body in (switcher, adder)]
    for thread in threads:
        thread.start()
    try:
        for attempt in range(3):
            saver = threading.Thread(target=index.save, args=(tmp_path / f"snap-{attempt}",))
            saver.start()
            saver.join(timeout=10)
            assert not saver.is_alive(), "save() is starved by the writers"
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    for attempt in range(3):
        assert VectorIndex.load(tmp_path / f"snap-{attempt}", device="cpu").count >= 300
