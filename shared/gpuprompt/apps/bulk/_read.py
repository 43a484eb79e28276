"""Bulk input: a JSONL file, a Parquet file, or a folder of .txt/.md files, read as a stream of chunks.

The stream is deterministic (files in sorted order, records in file order, the one splitter), so a
chunk's id, ``<source>#<chunk number>``, is the same on every run and a re-run upserts. Bad input
fails with a typed error naming the file and the line (or row).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprompt.apps.bulk._chunk import check_chunking, chunk_text
from gpuprompt.errors import ConfigurationError, GPUPromptError, InputTypeError, InvalidInputError, describe
from gpuprompt.validation import check_json, check_str

__all__ = ["BulkInput", "Chunk", "ReadOptions"]

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
TEXT_SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class Chunk:
    """One piece of text to embed.

    Attributes:
        id: ``<source>#<n>``, stable across runs.
        text: the chunk's text (stored as the record's document).
        metadata: ``source``, ``chunk`` (its number in the source) and the fields asked for.
    """

    id: str
    text: str
    metadata: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How records are read and split.

    Attributes:
        chunk_size: most characters per chunk.
        chunk_overlap: characters shared by consecutive chunks.
        text_field: the record field holding the text (JSONL, Parquet).
        id_field: the record field naming the source (str or int), or None for ``<file>:<line>``.
        metadata_fields: record fields copied into each chunk's metadata (JSON values), or None.
        id_prefix: the name of the input in default sources (``<id_prefix>:<line>``, a folder's
            ``<id_prefix>/<file>``), or None for the input's path: relative to the current folder
            when it is inside it, else absolute, so that two inputs never share chunk ids.
    """

    chunk_size: int
    chunk_overlap: int
    text_field: str = "text"
    id_field: str | None = None
    metadata_fields: tuple[str, ...] = ()
    id_prefix: str | None = None

    def __post_init__(self) -> None:
        check_chunking(self.chunk_size, self.chunk_overlap)
        check_str(self.text_field, "text_field", allow_empty=False, error=ConfigurationError)
        check_str(self.id_field, "id_field", allow_none=True, allow_empty=False, error=ConfigurationError)
        fields = self.metadata_fields
        if isinstance(fields, str) or not isinstance(fields, (list, tuple)):
            raise ConfigurationError(f"'metadata_fields' must be a list of field names or None (got {describe(fields)}).")
        for i, name in enumerate(fields):
            check_str(name, f"metadata_fields[{i}]", allow_empty=False, error=ConfigurationError)
        reserved = sorted({"source", "chunk"} & set(fields))
        if reserved:
            raise ConfigurationError(
                f"'metadata_fields' must not name {reserved}: each chunk's metadata already holds 'source' and "
                "'chunk'; rename the field in your data."
            )
        object.__setattr__(self, "metadata_fields", tuple(fields))


class BulkInput:
    """The files of one bulk input and the chunk stream read from them.

    Args:
        path: a ``.jsonl`` / ``.ndjson`` / ``.json`` (JSON lines) file, a ``.parquet`` file, a
            ``.txt`` / ``.md`` file, or a folder of ``.txt`` / ``.md`` files (searched recursively).
        options: how records are read and split.

    Raises:
        InvalidInputError: the path does not exist, has an unknown suffix, or the folder holds no
            text file.
    """

    def __init__(self, path: str | os.PathLike[str], options: ReadOptions) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise InputTypeError(f"'input' must be a path to a file or folder (got {describe(path)}).")
        root = Path(path)
        self.options = options
        if not root.exists():
            raise InvalidInputError(
                f"input '{root}' does not exist; pass a JSONL or Parquet file, or a folder of .txt/.md files."
            )
        if root.is_dir():
            files = sorted(
                (p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES),
                key=lambda p: p.relative_to(root).as_posix(),
            )
            if not files:
                raise InvalidInputError(
                    f"input folder '{root}' holds no .txt or .md file; pass a folder of text files, or a JSONL or "
                    "Parquet file itself."
                )
            self.kind = "text"
            label = _label(root, options.id_prefix)
            self.files = [(p, _joined(label, p.relative_to(root).as_posix())) for p in files]
            self._folder: str | None = label
        else:
            suffix = root.suffix.lower()
            if suffix in JSONL_SUFFIXES:
                self.kind = "jsonl"
            elif suffix in PARQUET_SUFFIXES:
                self.kind = "parquet"
            elif suffix in TEXT_SUFFIXES:
                self.kind = "text"
            else:
                raise InvalidInputError(
                    f"input '{root}' has an unknown suffix {root.suffix!r}; use JSON lines "
                    f"({', '.join(JSONL_SUFFIXES)}), Parquet ({', '.join(PARQUET_SUFFIXES)}) or text "
                    f"({', '.join(TEXT_SUFFIXES)}), or a folder of text files."
                )
            self.files = [(root, _label(root, options.id_prefix) or root.name)]
            self._folder = None
        self.path = root

    def owns(self, source: str) -> bool:
        """Whether ``source`` is one this input would name by default, though it may hold it no more:
        ``<file>:<line>`` of this JSONL or Parquet file, or ``<folder>/<file>`` of this folder. A
        re-run deletes the chunks of such sources that it no longer reads (a removed line or file).
        A folder owns only text-file sources under it: a JSONL or Parquet file inside it that was
        indexed as an input of its own (``<folder>/data.jsonl:<line>``) is not its. False with
        ``id_field`` (the ids say nothing of their input), for a folder named ``""``, and for one
        text file (its one source is always read)."""
        if self.options.id_field is not None:
            return False
        if self.kind == "text":
            return (bool(self._folder) and source.startswith(f"{self._folder}/")
                    and Path(source).suffix.lower() in TEXT_SUFFIXES)
        name, sep, line = source.rpartition(":")
        return bool(sep) and name == self.files[0][1] and line.isdigit()

    def __repr__(self) -> str:
        return f"<BulkInput {self.kind} {str(self.path)!r} files={len(self.files)}>"

    def records(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """Yield ``(source, text, metadata)`` per record, in a fixed order.

        Raises:
            InvalidInputError / InputTypeError: a bad line or row (the message names file and line).
        """
        seen: dict[str, str] = {}
        for path, name in self.files:
            if self.kind == "text":
                rows: Iterator[tuple[str, str, str, dict[str, Any]]] = self._text_file(path, name)
            elif self.kind == "jsonl":
                rows = self._jsonl(path, name)
            else:
                rows = self._parquet(path, name)
            for where, source, text, metadata in rows:
                if self.options.id_field is not None:
                    first = seen.setdefault(source, where)
                    if first != where:
                        raise InvalidInputError(
                            f"{where}: '{self.options.id_field}' value {source!r} was already used at {first}; ids "
                            "must be unique (chunk ids derive from them), or leave id_field unset."
                        )
                yield source, text, metadata

    def chunks(self) -> Iterator[Chunk]:
        """Yield every chunk of every record, in a fixed order."""
        size, overlap = self.options.chunk_size, self.options.chunk_overlap
        for source, text, metadata in self.records():
            for number, piece in enumerate(chunk_text(text, size, overlap)):
                yield Chunk(f"{source}#{number}", piece, {"source": source, "chunk": number, **metadata})

    # ------------------------------------------------------------------ formats
    def _text_file(self, path: Path, name: str) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(
                f"{name}: is not UTF-8 text (byte {exc.start}); convert it to UTF-8 first."
            ) from None
        check_str(text, name)
        yield name, name, text, {}

    def _jsonl(self, path: Path, name: str) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                where = f"{name} line {number}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InvalidInputError(f"{where}: is not UTF-8 (byte {exc.start}); convert the file to UTF-8.") from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InvalidInputError(
                        f"{where}: is not valid JSON ({exc.msg} at column {exc.colno}); each line must hold one JSON "
                        "object."
                    ) from None
                if not isinstance(record, dict):
                    raise InputTypeError(
                        f"{where}: must be a JSON object such as {{\"{self.options.text_field}\": \"...\"}} (got "
                        f"{describe(record)})."
                    )
                yield self._record(record, where, f"{name}:{number}")

    def _parquet(self, path: Path, name: str) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            from gpuprompt.errors import DependencyError

            raise DependencyError("reading Parquet needs pyarrow: pip install pyarrow") from exc
        try:
            parquet = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a file that is not Parquet
            raise InvalidInputError(f"{name}: is not a readable Parquet file ({exc}).") from exc
        columns = parquet.schema_arrow.names
        wanted = [self.options.text_field]
        if self.options.id_field is not None:
            wanted.append(self.options.id_field)
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise InvalidInputError(
                f"{name}: has no column {missing[0]!r} (columns: {columns}); name the text column with "
                "text_field / --text-field and the id column with id_field / --id-field."
            )
        read = [c for c in dict.fromkeys([*wanted, *self.options.metadata_fields]) if c in columns]
        number = 0
        for batch in parquet.iter_batches(batch_size=1024, columns=read):
            for record in batch.to_pylist():
                number += 1
                yield self._record(record, f"{name} row {number}", f"{name}:{number}")

    def _record(self, record: dict[str, Any], where: str, default_source: str) -> tuple[str, str, str, dict[str, Any]]:
        options = self.options
        if options.text_field not in record:
            raise InvalidInputError(
                f"{where}: has no '{options.text_field}' field (fields: {sorted(record)[:10]}); name the text field "
                "with text_field / --text-field."
            )
        text = record[options.text_field]
        if not isinstance(text, str):
            raise InputTypeError(f"{where}: '{options.text_field}' must be a str (got {describe(text)}).")
        source = default_source
        if options.id_field is not None:
            if options.id_field not in record:
                raise InvalidInputError(
                    f"{where}: has no '{options.id_field}' field (fields: {sorted(record)[:10]}); every record needs "
                    "one when id_field / --id-field is set."
                )
            value = record[options.id_field]
            if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
                raise InputTypeError(
                    f"{where}: '{options.id_field}' must be a non-empty str or an int (got {describe(value)})."
                )
            source = str(value)
        metadata: dict[str, Any] = {}
        try:
            check_str(text, options.text_field, error=InvalidInputError)
            check_str(source, options.id_field or "source", error=InvalidInputError)
            for field in options.metadata_fields:
                if field in record:
                    metadata[field] = check_json(record[field], field)
        except GPUPromptError as exc:
            raise type(exc)(f"{where}: {exc}") from exc
        return where, source, text, metadata


def fields_tuple(fields: Sequence[str] | None) -> tuple[str, ...]:
    """``metadata_fields`` as a tuple (None is no field)."""
    if fields is None:
        return ()
    if isinstance(fields, str):
        raise ConfigurationError(f"'metadata_fields' must be a list of field names (got the bare str {fields!r}); wrap it: [{fields!r}].")
    return tuple(fields)


def _label(root: Path, prefix: str | None) -> str:
    """The input's name in chunk sources: ``prefix``, else its path (relative to the current folder
    when inside it, else absolute; ``""`` for the current folder itself)."""
    if prefix is not None:
        return prefix.strip("/")
    resolved = root.resolve()
    try:
        relative = resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()
    return "" if relative == "." else relative


def _joined(label: str, name: str) -> str:
    return f"{label}/{name}" if label else name
