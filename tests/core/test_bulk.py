"""Bulk indexing in one process: the splitter, the readers' errors, ids, upserts and crash recovery."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpuprompt import VectorIndex
from gpuprompt.apps.bulk import chunk_text, index_bulk, main
from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError

WORDS = ["dress", "jeans", "cotton", "wash", "shrink", "red", "navy", "size", "return", "order", "delivery", "fabric", "wool", "linen", "zip", "hem"]


def make_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` deterministic texts of 5 to 60 words (some split into several chunks at size 160)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 60)))) for _ in range(n)]


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    records = [{"id": f"doc-{i}", "text": text, "cat": "ab"[i % 2]} for i, text in enumerate(make_texts(40))]
    return write_jsonl(tmp_path / "docs.jsonl", records)


OPTIONS = {"chunk_size": 160, "chunk_overlap": 20, "batch_size": 8, "id_field": "id", "progress": False}


def records(path: Path) -> dict[str, object]:
    index = VectorIndex.load(path)
    return {r.id: r for r in index.get(index.ids())}


def test_importing_bulk_and_ray_modules_loads_neither_torch_nor_ray() -> None:
    code = (
        "import sys, gpuprompt, gpuprompt.apps.bulk, gpuprompt.apps.ray, gpuprompt.apps.bench.index_bulk\n"
        "gpuprompt.apps.bulk.RayOptions(num_cpus=2)\n"
        "print(','.join(m for m in ('torch', 'ray', 'pyarrow', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


# ---------------------------------------------------------------------------------------- splitter
def test_chunk_text_windows_end_at_words_and_cover_the_text() -> None:
    text = " ".join(make_texts(5, seed=3))
    chunks = chunk_text(text, chunk_size=50, chunk_overlap=10)
    assert all(0 < len(c) <= 50 for c in chunks)
    assert all(not c.startswith(" ") and not c.endswith(" ") for c in chunks)
    # Every word of the text is in some chunk, in order, and whole.
    words = text.split()
    seen = [w for c in chunks for w in c.split()]
    assert set(words) <= set(seen)
    assert chunk_text(text, chunk_size=50, chunk_overlap=10) == chunks  # deterministic
    assert chunk_text("short text", 50, 10) == ["short text"]
    assert chunk_text("   \n ", 50, 10) == []
    assert chunk_text("x" * 25, 10, 0) == ["x" * 10, "x" * 10, "x" * 5]  # a long word is cut


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (10, 10), (10, -1), (True, 0)])
def test_chunk_text_refuses_bad_settings(size: object, overlap: object) -> None:
    with pytest.raises(ConfigurationError):
        chunk_text("some text", size, overlap)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- errors
def test_missing_input_is_a_typed_error(tmp_path: Path, embedder) -> None:
    with pytest.raises(InvalidInputError, match="does not exist"):
        index_bulk(tmp_path / "nope.jsonl", tmp_path / "idx", embedder=embedder, progress=False)
    assert not (tmp_path / "idx").exists()


def test_a_line_that_is_not_an_object_names_file_and_line(tmp_path: Path, embedder) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine"}, ["not", "an", "object"]])
    with pytest.raises(InputTypeError, match=r"bad\.jsonl line 2: must be a JSON object"):
        index_bulk(path, tmp_path / "idx", embedder=embedder, progress=False)


def test_invalid_json_names_file_and_line(tmp_path: Path, embedder) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b"\n', encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"broken\.jsonl line 3: is not valid JSON"):
        index_bulk(path, tmp_path / "idx", embedder=embedder, progress=False)


def test_a_missing_text_field_names_file_line_and_field(tmp_path: Path, embedder) -> None:
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": "a"}, {"body": "b"}])
    with pytest.raises(InvalidInputError, match=r"docs\.jsonl line 2: has no 'text' field .*--text-field"):
        index_bulk(path, tmp_path / "idx", embedder=embedder, progress=False)
    # Naming the field fixes it for records that have it.
    path = write_jsonl(tmp_path / "body.jsonl", [{"body": "a"}, {"body": 3}])
    with pytest.raises(InputTypeError, match=r"body\.jsonl line 2: 'body' must be a str"):
        index_bulk(path, tmp_path / "idx", text_field="body", embedder=embedder, progress=False)


def test_duplicate_ids_and_bad_metadata_are_refused(tmp_path: Path, embedder) -> None:
    path = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    with pytest.raises(InvalidInputError, match=r"dup\.jsonl line 2: 'id' value 'a' was already used at \S*dup\.jsonl line 1"):
        index_bulk(path, tmp_path / "idx", id_field="id", embedder=embedder, progress=False)
    path = write_jsonl(tmp_path / "meta.jsonl", [{"text": "x", "n": 2**70}])
    with pytest.raises(InvalidInputError, match=r"meta\.jsonl line 1: .*64 bits"):
        index_bulk(path, tmp_path / "idx", metadata_fields=["n"], embedder=embedder, progress=False)


def test_an_unknown_suffix_and_an_empty_folder_are_refused(tmp_path: Path, embedder) -> None:
    (tmp_path / "data.csv").write_text("text\nhello\n")
    with pytest.raises(InvalidInputError, match="unknown suffix '.csv'"):
        index_bulk(tmp_path / "data.csv", tmp_path / "idx", embedder=embedder, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInputError, match="holds no .txt or .md file"):
        index_bulk(tmp_path / "empty", tmp_path / "idx", embedder=embedder, progress=False)


def test_the_cli_prints_the_error_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [7])
    assert main([str(path), "--into", str(tmp_path / "idx"), "--no-progress", "--device", "cpu"]) == 2
    assert "bad.jsonl line 1: must be a JSON object" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- formats
def test_jsonl_ids_metadata_and_vectors(corpus: Path, tmp_path: Path, embedder) -> None:
    result = index_bulk(corpus, tmp_path / "idx", metadata_fields=["cat"], embedder=embedder, **OPTIONS)
    got = records(tmp_path / "idx")
    assert result.embedded == result.chunks == len(got) and result.skipped == 0
    texts = make_texts(40)
    expected_ids = [f"doc-{i}#{n}" for i, t in enumerate(texts) for n in range(len(chunk_text(t, 160, 20)))]
    assert sorted(got) == sorted(expected_ids)
    record = got["doc-3#0"]
    assert record.document == chunk_text(texts[3], 160, 20)[0]
    assert record.metadata == {"source": "doc-3", "chunk": 0, "cat": "b"}
    np.testing.assert_allclose(record.vector, embedder.embed([record.document])[0], atol=1e-5)
    assert VectorIndex.load(tmp_path / "idx").config.embedder == embedder.identity


def test_parquet_and_a_folder_of_text_files(tmp_path: Path, embedder) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = make_texts(6, seed=5)
    pq.write_table(pa.table({"body": texts, "n": list(range(6))}), tmp_path / "docs.parquet")
    index_bulk(tmp_path / "docs.parquet", tmp_path / "pq", text_field="body", metadata_fields=["n"],
               embedder=embedder, progress=False, chunk_size=160, chunk_overlap=20, id_prefix="docs.parquet")
    got = records(tmp_path / "pq")
    assert got["docs.parquet:2#0"].metadata == {"source": "docs.parquet:2", "chunk": 0, "n": 1}
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(texts[0])
    (folder / "sub" / "b.md").write_text(texts[1])
    (folder / "skip.bin").write_bytes(b"\x00")
    index_bulk(folder, tmp_path / "txt", embedder=embedder, progress=False, chunk_size=160, chunk_overlap=20,
               id_prefix="")
    sources = {r.metadata["source"] for r in records(tmp_path / "txt").values()}
    assert sources == {"a.txt", "sub/b.md"}


def test_two_inputs_of_the_same_name_never_share_ids(tmp_path: Path, embedder, monkeypatch) -> None:
    # y2023/data.jsonl and y2024/data.jsonl into one target: both stay (the default ids name the
    # input's path, relative to the current folder), and a folder's files are prefixed by it.
    texts = make_texts(4, seed=9)
    options = {**OPTIONS, "id_field": None}
    for year, part in (("y2023", texts[:2]), ("y2024", texts[2:])):
        (tmp_path / year).mkdir()
        write_jsonl(tmp_path / year / "data.jsonl", [{"text": t} for t in part])
        (tmp_path / year / "notes").mkdir()
        (tmp_path / year / "notes" / "readme.txt").write_text(part[0])
    monkeypatch.chdir(tmp_path)
    for year in ("y2023", "y2024"):
        index_bulk(f"{year}/data.jsonl", tmp_path / "kb", embedder=embedder, **options)
        index_bulk(tmp_path / year / "notes", tmp_path / "kb", embedder=embedder, **options)
    sources = {r.metadata["source"] for r in records(tmp_path / "kb").values()}
    assert sources == {"y2023/data.jsonl:1", "y2023/data.jsonl:2", "y2024/data.jsonl:1", "y2024/data.jsonl:2",
                       "y2023/notes/readme.txt", "y2024/notes/readme.txt"}
    # Run from elsewhere, an input is named by its absolute path, or by id_prefix to keep the ids.
    monkeypatch.chdir(tmp_path / "y2023")
    index_bulk("data.jsonl", tmp_path / "kb", embedder=embedder, id_prefix="y2023/data.jsonl", **options)
    assert {r.metadata["source"] for r in records(tmp_path / "kb").values()} == sources


def test_a_rerun_skips_everything_and_a_changed_input_upserts(corpus: Path, tmp_path: Path, embedder) -> None:
    assert len(chunk_text(make_texts(40)[0], 160, 20)) > 1  # doc-0 shrinks to one chunk below
    first = index_bulk(corpus, tmp_path / "idx", embedder=embedder, **OPTIONS)
    before = embedder.stats().texts
    again = index_bulk(corpus, tmp_path / "idx", embedder=embedder, **OPTIONS)
    assert (again.embedded, again.skipped) == (0, first.chunks)
    assert embedder.stats().texts == before  # nothing was embedded
    lines = corpus.read_text().splitlines()
    lines[0] = json.dumps({"id": "doc-0", "text": "a brand new text"})
    corpus.write_text("\n".join(lines) + "\n")
    changed = index_bulk(corpus, tmp_path / "idx", embedder=embedder, **OPTIONS)
    got = records(tmp_path / "idx")
    assert changed.embedded == changed.chunks  # another input: everything again, as upserts
    assert got["doc-0#0"].document == "a brand new text"
    assert [key for key in got if key.startswith("doc-0#")] == ["doc-0#0"]  # its old extra chunks are gone
    assert len(got) == changed.chunks


def test_a_rerun_deletes_what_was_removed_from_the_input_and_nothing_of_other_inputs(
    tmp_path: Path, embedder, monkeypatch
) -> None:
    # Default ids are positional (<file>:<line>): removing line 2 shifts the later lines, and the old
    # last line's id would stay behind as a second copy of it. A file removed from a folder leaves
    # nothing behind either; another input's records in the same target are never touched.
    texts = make_texts(6, seed=11)
    options = {**OPTIONS, "id_field": None}
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "rows.jsonl", [{"text": t} for t in texts[:4]])
    write_jsonl(tmp_path / "rows.jsonl.bak.jsonl", [{"text": texts[5]}])  # a neighbour whose name extends it
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text(texts[4])
    (tmp_path / "notes" / "b.txt").write_text(texts[5])
    write_jsonl(tmp_path / "notes" / "inner.jsonl", [{"text": texts[1]}])  # its own input, inside the folder
    for source in ("rows.jsonl", "rows.jsonl.bak.jsonl", "notes", "notes/inner.jsonl"):
        index_bulk(source, tmp_path / "kb", embedder=embedder, **options)
    write_jsonl(tmp_path / "rows.jsonl", [{"text": t} for t in (texts[0], texts[2], texts[3])])
    (tmp_path / "notes" / "b.txt").unlink()
    index_bulk("rows.jsonl", tmp_path / "kb", embedder=embedder, **options)
    index_bulk("notes", tmp_path / "kb", embedder=embedder, **options)
    got = records(tmp_path / "kb")
    by_source: dict[str, list[str]] = {}
    for record in got.values():
        by_source.setdefault(record.metadata["source"], []).append(record.document)
    assert sorted(by_source) == ["notes/a.txt", "notes/inner.jsonl:1", "rows.jsonl.bak.jsonl:1", "rows.jsonl:1",
                                 "rows.jsonl:2", "rows.jsonl:3"]
    documents = [r.document for r in got.values() if r.metadata["source"] != "notes/inner.jsonl:1"]
    assert len(documents) == len(set(documents))  # no copy of a shifted line under a dead id
    # With id_field the ids say nothing of their input: a removed record stays (documented).
    write_jsonl(tmp_path / "named.jsonl", [{"id": f"n{i}", "text": t} for i, t in enumerate(texts[:2])])
    index_bulk("named.jsonl", tmp_path / "named", embedder=embedder, **OPTIONS)
    write_jsonl(tmp_path / "named.jsonl", [{"id": "n1", "text": texts[1]}])
    index_bulk("named.jsonl", tmp_path / "named", embedder=embedder, **OPTIONS)
    assert {r.metadata["source"] for r in records(tmp_path / "named").values()} == {"n0", "n1"}


# ---------------------------------------------------------------------------------------- resume
def test_a_bad_line_keeps_the_work_before_it_and_the_fixed_file_goes_on(corpus: Path, tmp_path: Path, embedder) -> None:
    good = corpus.read_text()
    corpus.write_text(good + "[1, 2]\n")
    with pytest.raises(InputTypeError, match="line 41"):
        index_bulk(corpus, tmp_path / "idx", embedder=embedder, **OPTIONS)  # no commit was due yet
    state = json.loads((tmp_path / "idx.progress.json").read_text())
    written = state["chunks_written"]
    assert state["complete"] is False and written > 0 and written % 8 == 0  # whole shards, saved on the way out
    corpus.write_text(good + json.dumps({"id": "doc-40", "text": "a fixed last line"}) + "\n")
    before = embedder.stats().texts
    resumed = index_bulk(corpus, tmp_path / "idx", embedder=embedder, **OPTIONS)
    # Only the shards from the edit on are embedded again (each shard's digest is checked).
    assert resumed.skipped == written and embedder.stats().texts - before == resumed.embedded == resumed.chunks - written
    assert len(records(tmp_path / "idx")) == resumed.chunks


CRASH = textwrap.dedent(
    """
    import os, sys
    from gpuprompt import EmbedderConfig
    from gpuprompt.apps.bulk import index_bulk

    def crash(written):
        if written >= int(sys.argv[3]):
            os._exit(17)  # a hard kill: no cleanup, no final commit

    index_bulk(sys.argv[1], sys.argv[2], chunk_size=160, chunk_overlap=20, batch_size=8, id_field="id",
               progress=False, checkpoint_every=16, on_commit=crash, embedder=EmbedderConfig(device="cpu"))
    """
)


def test_a_killed_run_resumes_and_embeds_only_the_remainder(corpus: Path, tmp_path: Path, embedder) -> None:
    target = tmp_path / "idx"
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(corpus), str(target), "32"], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 17, proc.stderr[-2000:]
    state = json.loads((tmp_path / "idx.progress.json").read_text())
    assert state["complete"] is False and state["chunks_written"] == 32
    assert len(VectorIndex.load(target).ids()) == 32

    before = embedder.stats().texts
    resumed = index_bulk(corpus, target, embedder=embedder, **OPTIONS)
    assert resumed.skipped == 32 and resumed.embedded == resumed.chunks - 32
    assert embedder.stats().texts - before == resumed.embedded  # only the remainder was embedded

    clean = index_bulk(corpus, tmp_path / "clean", embedder=embedder, **OPTIONS)
    assert clean.chunks == resumed.chunks
    got, want = records(target), records(tmp_path / "clean")
    assert sorted(got) == sorted(want)
    for key, record in want.items():
        assert got[key].document == record.document and got[key].metadata == record.metadata
        np.testing.assert_allclose(got[key].vector, record.vector, atol=1e-5)
    assert json.loads((tmp_path / "idx.progress.json").read_text())["complete"] is True


# ---------------------------------------------------------------------------------------- milvus target
def test_a_milvus_lite_target_gets_the_same_records_and_resumes(corpus: Path, tmp_path: Path, embedder) -> None:
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite")
    from gpuprompt.index import MilvusIndex, load_index

    uri = str(tmp_path / "kb.db")
    result = index_bulk(corpus, uri, collection="docs", embedder=embedder, **OPTIONS)
    assert (tmp_path / "kb.db.docs.progress.json").is_file()
    again = index_bulk(corpus, uri, collection="docs", embedder=embedder, **OPTIONS)
    assert (again.embedded, again.skipped) == (0, result.chunks)
    index_bulk(corpus, tmp_path / "snap", embedder=embedder, **OPTIONS)
    want = records(tmp_path / "snap")
    index = load_index(tmp_path / "kb.db.docs.index")
    try:
        assert isinstance(index, MilvusIndex) and index.count == result.chunks
        got = {r.id: r for r in index.get(sorted(want))}
    finally:
        index.close()
    assert sorted(got) == sorted(want)
    for key, record in want.items():
        assert got[key].document == record.document and got[key].metadata == record.metadata
        np.testing.assert_allclose(got[key].vector, record.vector, atol=1e-5)
