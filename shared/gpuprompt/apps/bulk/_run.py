"""``index_bulk``: read -> chunk -> embed -> write, in one process or on Ray Data, resumable.

Both paths share the reader, the splitter, the shard numbering, the writer and the progress file;
only the embedding step differs (the process's own :class:`~gpuprompt.Embedder`, or Ray actors each
holding one). A job killed at any point is resumed by running it again: shards recorded as done are
not embedded again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprompt.apps.bulk._chunk import DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_SIZE
from gpuprompt.apps.bulk._progress import Progress, fingerprint
from gpuprompt.apps.bulk._read import BulkInput, Chunk, ReadOptions, fields_tuple
from gpuprompt.apps.bulk._shards import RayOptions, Shard
from gpuprompt.apps.bulk._writers import BulkWriter, SnapshotWriter, is_milvus_target
from gpuprompt.errors import ConfigurationError, InputTypeError, describe
from gpuprompt.validation import check_bool, check_int, check_str, fail

if TYPE_CHECKING:
    from gpuprompt.embed import Embedder, EmbedderConfig

__all__ = ["DEFAULT_BATCH_SIZE", "BulkResult", "RayOptions", "Shard", "index_bulk"]

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 256
"""Chunks per embedding call; also the size of a shard, the unit of resumption."""

DEFAULT_CHECKPOINT_EVERY = 10_000
"""Chunks written between two commits of the target (and of the progress file)."""

_MAX = 2**31 - 1


@dataclass(frozen=True)
class BulkResult:
    """What one :func:`index_bulk` run did.

    Attributes:
        into: the target.
        chunks: chunks in the input (all shards).
        embedded: chunks embedded and written by this run.
        skipped: chunks already written by an earlier run (resumed).
        seconds: wall time of the run (reading, embedding and writing).
        texts_per_s: ``embedded / seconds``.
        ray: whether Ray Data embedded them.
        actors: embedder actors (1 without Ray).
    """

    into: str
    chunks: int
    embedded: int
    skipped: int
    seconds: float
    texts_per_s: float
    ray: bool
    actors: int


def index_bulk(
    input: str | os.PathLike[str],
    into: str | os.PathLike[str],
    *,
    ray: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    chunk_overlap: int = DEFAULT_CHUNK_OVERLAP,
    batch_size: int = DEFAULT_BATCH_SIZE,
    text_field: str = "text",
    id_field: str | None = None,
    metadata_fields: Sequence[str] | None = None,
    progress: bool = True,
    embedder: Embedder | EmbedderConfig | None = None,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    ray_options: RayOptions | None = None,
    collection: str | None = None,
    on_commit: Callable[[int], None] | None = None,
    id_prefix: str | None = None,
) -> BulkResult:
    """Chunk, embed and write a corpus into a snapshot folder (or another :class:`BulkWriter` target).

    Example:
        >>> from gpuprompt.apps.bulk import index_bulk
        >>> result = index_bulk("docs.jsonl", "kb-index", id_field="id", metadata_fields=["title"])
        >>> result.embedded, result.texts_per_s
        (1523, 212.4)
        >>> from gpuprompt import VectorIndex
        >>> VectorIndex.load("kb-index").get(["doc-7#0"])[0].metadata
        {'source': 'doc-7', 'chunk': 0, 'title': 'Returns'}

    Args:
        input: a JSON-lines file (one object per line), a Parquet file, or a folder of .txt/.md files.
        into: a snapshot folder (created, or an existing snapshot upserted into), or a Milvus URI
            (``http://host:19530``, or a Milvus Lite ``*.db`` file) written through
            ``gpuprompt.MilvusIndex`` (``pip install pymilvus milvus-lite``).
        ray: embed on Ray Data (actors each holding one Embedder) instead of in this process. The
            driver still reads, chunks and writes, and holds the pending chunks' texts in memory
            while Ray ships them to the actors: split a corpus larger than that into several inputs.
        chunk_size: most characters per chunk.
        chunk_overlap: characters shared by consecutive chunks of one text.
        batch_size: chunks per embedding call and per shard (the unit a re-run skips).
        text_field: the record field holding the text.
        id_field: a record field naming each record (str or int, unique); chunk ids are
            ``<id>#<n>``. None: ``<file>:<line>#<n>`` (``<folder>/<file>#<n>`` for a folder of text
            files), where ``<file>`` is the input's path relative to the current folder when it is
            inside it, else absolute: two inputs never share ids. A resumed run must name the
            input the same way (same folder, or the same ``id_prefix``). A finished re-run deletes
            the chunks of sources it no longer reads: a shortened text's extra chunks and, with the
            default ids, those of a removed line or file; with ``id_field`` a removed record stays.
        id_prefix: the input's name in those default ids instead of its path (e.g. ``"reports-2024"``;
            ``""`` for a folder: ids are the files' paths inside it). Ignored with ``id_field``.
        metadata_fields: record fields copied into each chunk's metadata (with ``source`` and ``chunk``).
        progress: show a progress bar (tqdm).
        embedder: an :class:`~gpuprompt.Embedder` (one process) or its config; None = the bundled
            model. With ``ray=True`` each actor builds its own from the config.
        checkpoint_every: chunks between commits of the target and the progress file.
        ray_options: cluster address and actor sizing (see :class:`RayOptions`).
        collection: the Milvus collection of a Milvus target (default ``"gpuprompt"``).
        on_commit: called with the number of chunks written so far after each commit.

    Returns:
        A :class:`BulkResult`.

    Raises:
        InvalidInputError / InputTypeError: missing input, a bad line or row (named by file and
            line), a duplicated id.
        ConfigurationError: a bad option.
        SnapshotError: ``into`` exists but is not a snapshot.
        EmbedderMismatchError: ``into`` was built by another embedder.
        DependencyError: ``ray=True`` without ``ray[data]`` installed.
    """
    started = time.perf_counter()
    check_bool(ray, "ray", error=ConfigurationError)
    check_bool(progress, "progress", error=ConfigurationError)
    check_int(batch_size, "batch_size", min=1, max=_MAX, error=ConfigurationError)
    check_int(checkpoint_every, "checkpoint_every", min=1, max=_MAX, error=ConfigurationError)
    if ray_options is None:
        ray_options = RayOptions()
    elif not isinstance(ray_options, RayOptions):
        raise fail("ray_options", "a RayOptions or None", ray_options, error=ConfigurationError)
    if on_commit is not None and not callable(on_commit):
        raise fail("on_commit", "a callable or None", on_commit, error=ConfigurationError)
    options = ReadOptions(
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        text_field=text_field,
        id_field=id_field,
        metadata_fields=fields_tuple(metadata_fields),
        id_prefix=id_prefix,
    )
    check_str(collection, "collection", allow_none=True, allow_empty=False, error=ConfigurationError)
    check_str(id_prefix, "id_prefix", allow_none=True, error=ConfigurationError)
    source = BulkInput(input, options)
    # With a progress bar the stream is read once ahead to count it, which also finds bad records
    # before anything is embedded.
    total = sum(1 for _ in source.chunks()) if progress else None
    emb = _embedder(embedder)
    # The input files themselves are not in the fingerprint: each shard's digest says whether it changed.
    settings = {
        "input": str(source.path),
        "kind": source.kind,
        **dataclasses.asdict(options),
        "batch_size": batch_size,
        "embedder": emb.identity,
    }
    writer = open_writer(into, dim=emb.dim, embedder=emb.identity, collection=collection)
    state = Progress(writer.progress_path, fingerprint(settings))
    job = _Job(writer, state, settings, checkpoint_every, on_commit)
    bar = _bar(total, progress)
    try:
        if ray:
            from gpuprompt.apps.bulk._ray import embed_on_ray

            embedded, skipped, actors = embed_on_ray(
                _shards(source, batch_size, job.seen), job, emb.config, batch_size, ray_options, bar
            )
        else:
            embedded, skipped, actors = _embed_here(_shards(source, batch_size, job.seen), job, emb, bar), job.skipped, 1
        job.finish(source.owns)
    except BaseException:
        job.salvage()  # keep what was written (Ctrl-C, a bad record further on): a re-run goes on from there
        raise
    finally:
        bar.close()
        writer.close()
    seconds = time.perf_counter() - started
    return BulkResult(
        into=os.fspath(into),
        chunks=embedded + skipped,
        embedded=embedded,
        skipped=skipped,
        seconds=seconds,
        texts_per_s=embedded / seconds if seconds > 0 else 0.0,
        ray=ray,
        actors=actors,
    )


class _Job:
    """The shared bookkeeping: which shards are done, when to commit."""

    def __init__(
        self,
        writer: BulkWriter,
        state: Progress,
        settings: dict[str, Any],
        checkpoint_every: int,
        on_commit: Callable[[int], None] | None,
    ) -> None:
        self.writer = writer
        self.state = state
        self.settings = settings
        self.checkpoint_every = checkpoint_every
        self.on_commit = on_commit
        self.pending: list[Shard] = []  # shards written but not yet committed
        self.since_commit = 0
        self.written = 0
        self.skipped = 0
        self.seen: set[str] = set()  # every chunk id of this input

    def is_done(self, shard: Shard) -> bool:
        if self.state.done.get(shard.number) == shard.digest:
            self.skipped += len(shard.chunks)
            return True
        return False

    def write(self, chunks: Sequence[Chunk], vectors: Any) -> None:
        self.writer.write([c.id for c in chunks], vectors, [c.text for c in chunks], [c.metadata for c in chunks])
        self.written += len(chunks)
        self.since_commit += len(chunks)

    def shard_done(self, shard: Shard) -> None:
        self.pending.append(shard)
        if self.since_commit >= self.checkpoint_every:
            self.commit()

    def commit(self, *, notify: bool = True) -> None:
        # The target first, then the progress file: the file never claims more than the target holds.
        self.writer.commit()
        self.state.done.update((shard.number, shard.digest) for shard in self.pending)
        self.pending.clear()
        self.since_commit = 0
        self.state.save(self.settings, chunks_written=self.written)
        if notify and self.on_commit is not None:
            self.on_commit(self.written)

    def salvage(self) -> None:
        """After a failure: commit the shards written so far, if any, without raising."""
        if not self.pending:
            return
        try:
            self.commit(notify=False)
        except Exception:  # the target itself may be what failed; the original error matters more
            logger.warning("could not save the progress of the failed bulk job", exc_info=True)

    def finish(self, owned: Callable[[str], bool]) -> None:
        # A source whose text got shorter leaves chunks with higher numbers from an earlier run, and a
        # line or file removed from the input (``owned``: this input's default sources) leaves all of its.
        stale = self.writer.stale_ids(self.seen, owned)
        if stale:
            logger.info("deleting %d chunks of changed or removed sources left by an earlier run", len(stale))
            self.writer.delete(stale)
        self.state.complete = True
        self.commit()


def _embed_here(shards: Iterator[Shard], job: _Job, emb: Embedder, bar: Any) -> int:
    embedded = 0
    for shard in shards:
        if job.is_done(shard):
            bar.update(len(shard.chunks))
            continue
        vectors = emb.embed([c.text for c in shard.chunks], show_progress=False)
        job.write(shard.chunks, vectors)
        job.shard_done(shard)
        embedded += len(shard.chunks)
        bar.update(len(shard.chunks))
    return embedded


def _shards(source: BulkInput, size: int, seen: set[str]) -> Iterator[Shard]:
    """The chunk stream in shards of ``size``; every chunk id goes into ``seen``."""
    chunks: list[Chunk] = []
    number = 0
    for chunk in source.chunks():
        seen.add(chunk.id)
        chunks.append(chunk)
        if len(chunks) == size:
            yield Shard(number, chunks)
            number += 1
            chunks = []
    if chunks:
        yield Shard(number, chunks)


def _embedder(embedder: Any) -> Embedder:
    from gpuprompt.embed import Embedder, EmbedderConfig

    if embedder is None:
        from gpuprompt.runtime import get_runtime

        return get_runtime().embedder().load()
    if isinstance(embedder, EmbedderConfig):
        from gpuprompt.runtime import get_runtime

        options = {f.name: getattr(embedder, f.name) for f in dataclasses.fields(embedder) if f.name != "model"}
        return get_runtime().embedder(embedder.model, **options).load()
    if isinstance(embedder, Embedder):
        return embedder.load()
    raise fail("embedder", "an Embedder, an EmbedderConfig or None", embedder, error=ConfigurationError)


def _bar(total: int | None, show: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Indexing", unit="chunk", disable=not show, dynamic_ncols=True)


def open_writer(into: str | os.PathLike[str], *, dim: int, embedder: str, collection: str | None = None) -> BulkWriter:
    """The writer for ``into``: a snapshot folder, or a Milvus URI (``http://...`` or ``*.db``).

    Raises:
        InputTypeError: ``into`` is not a path or URI.
        SnapshotError: ``into`` exists but is not a snapshot (nothing is changed).
        DependencyError: a Milvus target without ``pymilvus`` installed.
    """
    if not isinstance(into, (str, os.PathLike)) or not os.fspath(into):
        raise InputTypeError(f"'into' must be a snapshot folder path or a Milvus URI (got {describe(into)}).")
    if is_milvus_target(into):
        from gpuprompt.apps.bulk._milvus import MilvusWriter

        return MilvusWriter(os.fspath(into), dim=dim, embedder=embedder, collection=collection)
    return SnapshotWriter(Path(into), dim=dim, embedder=embedder)
