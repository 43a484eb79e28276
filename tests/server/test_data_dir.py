"""``gpuprompt serve --data-dir``: collections survive a restart and kill -9; the log drops a torn last
record and refuses a corrupt one; the data dir is exclusive and not combined with --vector-uri."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import wait_until

from gpuprompt.errors import ConfigurationError, SnapshotError
from gpuprompt.index.durable import (
    LOCK_NAME,
    MAGIC,
    CollectionLog,
    encode_delete,
    encode_upsert,
    read_segment,
)

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"


# ---------------------------------------------------------------------------------------- helpers
def _app(tmp: Path, embedder, server_llm, **options):
    from gpuprompt.server import create_app

    return create_app(embedder=embedder, llm=server_llm, data_dir=str(tmp), **options)


def _client(app):
    from fastapi.testclient import TestClient

    return TestClient(app)


def _records(app) -> dict[str, dict[str, tuple]]:
    """``{collection: {id: (document, metadata, vector bytes)}}`` of a running app."""
    out = {}
    for name, index in app.state.gpuprompt.collections.indexes().items():
        records = index.get(index.ids())
        out[name] = {r.id: (r.document, r.metadata, np.asarray(r.vector, dtype=np.float32).tobytes()) for r in records}
    return out


def _segment(folder: Path, records: list[bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "wal-00000001.log"
    path.write_bytes(MAGIC + b"".join(records))
    return path


def _upsert(i: int) -> bytes:
    return encode_upsert([f"id{i}"], np.full((1, 3), i, dtype=np.float32), [f"doc {i}"], [{"n": i}], "emb")


# ---------------------------------------------------------------------------------------- the log
def test_log_round_trips_records_and_drops_a_torn_last_one(tmp_path) -> None:
    records = [_upsert(1), encode_delete(["id1", "x"]), _upsert(2)]
    path = _segment(tmp_path, records)
    full = path.stat().st_size
    read, valid = read_segment(path)
    assert valid == full
    assert [r.kind for r in read] == ["upsert", "delete", "upsert"]
    first = read[0]
    assert (first.ids, first.documents, first.metadatas, first.embedder) == (["id1"], ["doc 1"], [{"n": 1}], "emb")
    np.testing.assert_array_equal(first.vectors, np.full((1, 3), 1, dtype=np.float32))
    assert read[1].ids == ["id1", "x"]
    # A kill -9 in the middle of the last write leaves a prefix of it: header only, half a payload...
    last_start = full - len(records[-1])
    for cut in (1, 5, 12, len(records[-1]) - 1):
        path.write_bytes(MAGIC + b"".join(records[:-1]) + records[-1][:cut])
        read, valid = read_segment(path)
        assert [r.kind for r in read] == ["upsert", "delete"] and valid == last_start, cut
    # ... or a zero-filled tail where the file grew but the data never landed.
    path.write_bytes(MAGIC + b"".join(records[:-1]) + b"\0" * 40)
    assert read_segment(path)[1] == last_start
    # A whole last record whose bytes are damaged was never acknowledged either (no fsync returned).
    damaged = bytearray(records[-1])
    damaged[-1] ^= 0xFF
    path.write_bytes(MAGIC + b"".join(records[:-1]) + bytes(damaged))
    assert read_segment(path)[1] == last_start


def test_a_corrupt_record_in_the_middle_is_a_typed_error_naming_file_and_offset(tmp_path) -> None:
    records = [_upsert(1), _upsert(2), _upsert(3)]
    path = _segment(tmp_path, records)
    data = bytearray(path.read_bytes())
    offset = len(MAGIC) + len(records[0])
    data[offset + 20] ^= 0x01  # a bit flipped in the second record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError) as info:
        read_segment(path)
    message = str(info.value)
    assert str(path) in message and f"byte offset {offset}" in message
    data[offset + 20] ^= 0x01
    data[offset + 2] ^= 0x40  # now its length field: the header checksum catches it
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=f"byte offset {offset}: its header checksum"):
        read_segment(path)
    path.write_bytes(b"NOTALOG!" + b"".join(records))
    with pytest.raises(SnapshotError, match="byte offset 0"):
        read_segment(path)


def test_a_write_the_index_refuses_is_taken_back_out_of_the_log(tmp_path) -> None:
    from gpuprompt.index import VectorIndex

    index = VectorIndex(3)
    log = CollectionLog(tmp_path / "c", index, checkpoint_every=100)
    log.write(_upsert(1), lambda: index.add(["id1"], np.ones((1, 3)), ["doc 1"]))
    before = (tmp_path / "c" / "wal-00000001.log").stat().st_size

    def refuse() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        log.write(_upsert(2), refuse)
    assert (tmp_path / "c" / "wal-00000001.log").stat().st_size == before
    assert [r.ids for r in read_segment(tmp_path / "c" / "wal-00000001.log")[0]] == [["id1"]]
    log.close()


# ---------------------------------------------------------------------------------------- in process
def test_collections_survive_a_restart_and_a_copy_of_a_live_dir_replays(tmp_path, embedder, server_llm) -> None:
    data = tmp_path / "data"
    (tmp_path / "data").mkdir()
    (data / "notes.txt").write_text("not ours")  # never touched
    app = _app(data, embedder, server_llm, checkpoint_every=3)
    with _client(app) as client:
        for i in range(7):  # 7 writes: two background checkpoints, one write left in the log only
            body = {"ids": [f"a{i}", f"b{i}"], "documents": [f"red dress {i}", f"blue jeans {i}"],
                    "metadatas": [{"i": i, "tags": ["x", {"deep": i / 3}]}, None]}
            assert client.post("/v1/collections/shop/documents", json=body).status_code == 200
        generated = client.post("/v1/collections/shop/documents", json={"documents": ["a plain hat"]}).json()["ids"]
        client.post("/v1/collections/shop/documents", json={"ids": ["a1"], "documents": ["a1 replaced"],
                                                           "metadatas": [{"v": 2}]})
        deleted = client.post("/v1/collections/shop/documents/delete", json={"ids": ["b2", "b3", "nope"]}).json()
        assert deleted["deleted"] == 2
        client.post("/v1/collections/gone/documents", json={"documents": ["soon dropped"]})
        assert client.delete("/v1/collections/gone").status_code == 200
        client.post("/v1/collections/other/documents", json={"ids": ["o"], "documents": ["wool sweater"]})
        client.post("/v1/collections/emptied/documents", json={"ids": ["e"], "documents": ["x"]})
        client.post("/v1/collections/emptied/documents/delete", json={"ids": ["e"]})
        collections = app.state.gpuprompt.collections
        assert collections.data_dir.wait_for_checkpoints(60)
        expected = _records(app)
        # A copy of the live folder is what a crash leaves: snapshots plus the log since them ...
        crashed = tmp_path / "crashed"
        shutil.copytree(data, crashed)
    # ... and a kill in the middle of a write leaves a torn last record, which is dropped.
    last = max((crashed / "collections" / "shop").glob("wal-*.log"))
    with open(last, "ab") as file:
        file.write(_upsert(99)[:30])
    # A damaged record with acknowledged writes after it fails the start, naming the file and offset.
    damaged = tmp_path / "damaged"
    shutil.copytree(crashed, damaged)
    segment = max((damaged / "collections" / "other").glob("wal-*.log"), key=lambda p: p.stat().st_size)
    raw = bytearray(segment.read_bytes())
    raw[len(MAGIC) + 20] ^= 0x01
    segment.write_bytes(bytes(raw) + _upsert(5))
    with pytest.raises(SnapshotError, match=f"{segment}.*byte offset {len(MAGIC)}"), \
            _client(_app(damaged, embedder, server_llm)):
        pass
    assert set(expected) == {"shop", "other", "emptied"}
    assert expected["shop"]["a1"][:2] == ("a1 replaced", {"v": 2})
    assert generated[0] in expected["shop"] and "b2" not in expected["shop"]
    assert expected["emptied"] == {}
    assert (data / "notes.txt").read_text() == "not ours"
    for folder in (data, crashed):
        restarted = _app(folder, embedder, server_llm)
        with _client(restarted) as client:
            assert _records(restarted) == expected, folder
            assert "id99" not in _records(restarted)["shop"]
            hits = client.post("/v1/collections/shop/query", json={"query": "a wool sweater or a hat", "k": 3})
            assert hits.status_code == 200 and len(hits.json()["hits"]) == 3
            assert client.post("/v1/collections/gone/query", json={"query": "x"}).status_code == 404
            # Writes go on after the restart: a dropped name can be created again.
            assert client.post("/v1/collections/gone/documents", json={"documents": ["back"]}).status_code == 200
    assert sorted(p.name for p in (data / "collections").iterdir()) == ["emptied", "gone", "other", "shop"]


def test_a_failed_log_write_fails_the_request_and_changes_nothing(tmp_path, embedder, server_llm, monkeypatch) -> None:
    from gpuprompt.index.durable import _log as _durable

    app = _app(tmp_path, embedder, server_llm)
    with _client(app) as client:
        assert client.post("/v1/collections/c/documents", json={"ids": ["k"], "documents": ["kept"]}).status_code == 200

        def full_disk(fd: int, data: bytes) -> None:
            os.write(fd, bytes(data)[:7])  # part of the record reaches the file, then the disk is full
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(_durable, "_write_all", full_disk)
        response = client.post("/v1/collections/c/documents", json={"ids": ["k", "n"], "documents": ["new", "new"]})
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "storage_error"
        assert "No space left" in response.json()["error"]["message"]
        assert client.post("/v1/collections/c/documents/delete", json={"ids": ["k"]}).status_code == 503
        fresh = client.post("/v1/collections/new/documents", json={"documents": ["x"]})
        assert fresh.status_code == 503
        assert {c["name"]: c["count"] for c in client.get("/v1/collections").json()["data"]} == {"c": 1}
        assert _records(app)["c"]["k"][0] == "kept"
        monkeypatch.undo()
    restarted = _app(tmp_path, embedder, server_llm)
    with _client(restarted):
        assert {k: v[0] for k, v in _records(restarted)["c"].items()} == {"k": "kept"}


# ---------------------------------------------------------------------------------------- configuration
def test_data_dir_and_vector_uri_are_refused_together(tmp_path, embedder, server_llm) -> None:
    from gpuprompt.server import ServerConfig, create_app

    with pytest.raises(ConfigurationError) as info:
        ServerConfig(data_dir=str(tmp_path), vector_uri=str(tmp_path / "m.db"))
    assert "'data_dir'" in str(info.value) and "'vector_uri'" in str(info.value)
    with pytest.raises(ConfigurationError, match="'vector_uri'"):
        create_app(embedder=embedder, llm=server_llm, data_dir=str(tmp_path), vector_uri="m.db")
    with pytest.raises(ConfigurationError, match="'data_dir'"):
        ServerConfig(data_dir="")
    with pytest.raises(ConfigurationError, match="'checkpoint_every'"):
        ServerConfig(data_dir="d", checkpoint_every=0)


def test_data_dir_is_a_flag_and_a_variable(monkeypatch) -> None:
    from gpuprompt.server._settings import load_settings

    monkeypatch.setenv("GPUPROMPT_DATA_DIR", "/srv/gp")
    assert load_settings().serve_options()["data_dir"] == "/srv/gp"
    assert load_settings(data_dir="/other").serve_options()["data_dir"] == "/other"


def test_a_second_server_on_a_held_data_dir_is_refused(tmp_path, embedder, server_llm) -> None:
    first = _app(tmp_path, embedder, server_llm)
    with _client(first) as client:
        assert client.post("/v1/collections/c/documents", json={"documents": ["x"]}).status_code == 200
        second = _app(tmp_path, embedder, server_llm)
        with pytest.raises(ConfigurationError) as info, _client(second):
            pass
        assert "in use by another gpuprompt server" in str(info.value) and LOCK_NAME in str(info.value)
    third = _app(tmp_path, embedder, server_llm)  # released at shutdown
    with _client(third):
        assert [v[0] for v in _records(third)["c"].values()] == ["x"]


def test_a_restart_that_embeds_otherwise_is_refused_naming_the_settings(tmp_path, embedder, server_llm,
                                                                        monkeypatch) -> None:
    from gpuprompt import Embedder

    with _client(_app(tmp_path, embedder, server_llm)) as client:  # fp32 vectors
        assert client.post("/v1/collections/c/documents", json={"documents": ["x"]}).status_code == 200
    fp32 = embedder.identity
    monkeypatch.setattr(Embedder, "identity", property(lambda self: f"{fp32};int8"))  # as --embed-quantize int8
    with pytest.raises(ConfigurationError) as info, _client(_app(tmp_path, embedder, server_llm)):
        pass
    assert f"--embedding-model {fp32}, without --embed-quantize" in str(info.value)
    monkeypatch.undo()
    with _client(_app(tmp_path, embedder, server_llm)) as client:  # the right settings: served, nothing lost
        assert "c" in [c["name"] for c in client.get("/v1/collections").json()["data"]]


# ---------------------------------------------------------------------------------------- kill -9
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


class _Serve:
    """``gpuprompt serve --data-dir`` in its own process group, its output in a file."""

    def __init__(self, data: Path, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("GPUPROMPT_VECTOR_URI", None)
        python = str(PYTHON) if PYTHON.exists() else sys.executable
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [python, "-m", "gpuprompt.apps.cli", "serve", "--data-dir", str(data), "--port", str(self.port),
                 "--llm-backend", "transformers", "--device", "cpu", "--log-level", "warning"],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_healthy(self) -> None:
        assert wait_until(lambda: _healthy(self.url) or self.proc.poll() is not None, timeout=120, interval=0.25)
        assert self.proc.poll() is None, self.output()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)


@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_every_acknowledged_write_survives_kill_9(tmp_path) -> None:
    data = tmp_path / "data"
    servers: list[_Serve] = []
    try:
        server = _Serve(data, tmp_path / "first.log")
        servers.append(server)
        server.wait_healthy()

        # A second server on the same folder fails its start (before loading any model) and exits.
        rival = _Serve(data, tmp_path / "rival.log")
        servers.append(rival)
        assert rival.proc.wait(120) != 0
        assert "in use by another gpuprompt server" in rival.output()

        acked: dict[str, tuple[str, int, int] | None] = {}  # "collection/id" -> (document, t, i), None: deleted
        in_flight: dict[int, dict[str, tuple[str, int, int] | None]] = {}  # per thread: its unanswered write
        count = [0]
        errors: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()
        enough = threading.Event()

        def writer(t: int) -> None:
            collection = f"kill-{t % 2}"
            with httpx.Client(base_url=server.url, timeout=30.0) as client:
                i = 0
                while not stop.is_set():
                    i += 1
                    if i % 4 == 0:  # delete one of this thread's acknowledged records
                        victim = f"t{t}-{i - 2}"
                        path, body = "documents/delete", {"ids": [victim]}
                        outcome: dict[str, tuple[str, int, int] | None] = {f"{collection}/{victim}": None}
                    else:
                        doc = f"thread {t} record {i}: a {['red', 'blue', 'green'][i % 3]} item"
                        path, body = "documents", {"ids": [f"t{t}-{i}"], "documents": [doc],
                                                   "metadatas": [{"t": t, "i": i}]}
                        outcome = {f"{collection}/t{t}-{i}": (doc, t, i)}
                    with lock:
                        in_flight[t] = outcome
                    try:
                        response = client.post(f"/v1/collections/{collection}/{path}", json=body)
                    except httpx.HTTPError:
                        return  # killed: this write was never acknowledged
                    if response.status_code != 200:
                        errors.append(response.text)
                        return
                    with lock:
                        del in_flight[t]
                        acked.update(outcome)
                        count[0] += 1
                        if count[0] >= 40:
                            enough.set()

        threads = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(4)]
        for thread in threads:
            thread.start()
        assert enough.wait(120), (errors, server.output())
        server.kill()  # SIGKILL to the whole process group, while writes are still in flight
        stop.set()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert count[0] >= 40 and None in acked.values()
        unsure = {key: value for outcome in in_flight.values() for key, value in outcome.items()}

        restarted = _Serve(data, tmp_path / "second.log")
        servers.append(restarted)
        restarted.wait_healthy()
        with httpx.Client(base_url=restarted.url, timeout=60.0) as client:
            found = {}
            for collection in ("kill-0", "kill-1"):
                hits = client.post(f"/v1/collections/{collection}/query", json={"query": "an item", "k": 1000})
                assert hits.status_code == 200, hits.text
                for hit in hits.json()["hits"]:
                    found[f"{collection}/{hit['id']}"] = (hit["document"], hit["metadata"]["t"], hit["metadata"]["i"])
        for key, value in acked.items():
            allowed = [value] + ([unsure[key]] if key in unsure else [])  # a write in flight may have landed
            assert (found.get(key) if key in found else None) in allowed, f"acknowledged write to {key} lost"
        for key in set(found) - set(acked):
            assert unsure.get(key) == found[key], f"{key} was never written"
        restarted.proc.send_signal(signal.SIGTERM)
        assert restarted.proc.wait(120) == 0, restarted.output()
    finally:
        for server in servers:
            server.kill()
