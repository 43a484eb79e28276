"""Bulk indexing: a corpus (JSONL, Parquet, a folder of text files) chunked, embedded and written.

``index_bulk(input, into)`` runs in this process, or with ``ray=True`` on Ray Data (an actor pool of
embedders); either way it is resumable: run it again after a crash and the chunks already written
are not embedded again. Importing this package loads neither torch nor Ray.
"""

from __future__ import annotations

from gpuprompt.apps.bulk._chunk import DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_SIZE, chunk_text
from gpuprompt.apps.bulk._cli import add_arguments, main, run_args
from gpuprompt.apps.bulk._run import DEFAULT_BATCH_SIZE, BulkResult, RayOptions, index_bulk
from gpuprompt.apps.bulk._writers import BulkWriter, SnapshotWriter

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CHUNK_OVERLAP",
    "DEFAULT_CHUNK_SIZE",
    "BulkResult",
    "BulkWriter",
    "RayOptions",
    "SnapshotWriter",
    "add_arguments",
    "chunk_text",
    "index_bulk",
    "main",
    "run_args",
]
