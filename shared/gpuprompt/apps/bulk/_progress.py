"""The progress file of a bulk job: which shards of the chunk stream are written to the target.

A shard is ``batch_size`` consecutive chunks of the deterministic stream, recorded with a digest of
its contents (a shard whose chunks changed since is written again). The file is rewritten
(temp file, fsync, rename) only after the target has made those shards durable, so after a crash
it never claims more than the target holds; at worst a shard is embedded again and upserted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuprompt.errors import InvalidInputError

__all__ = ["Progress", "fingerprint"]

logger = logging.getLogger(__name__)

_FORMAT = 1


def fingerprint(settings: Mapping[str, Any]) -> str:
    """A digest of everything that decides the chunk stream and its vectors."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Progress:
    """Completed shards of one job, persisted beside its target.

    Args:
        path: the progress file.
        fingerprint: the job's :func:`fingerprint`; a file written for another fingerprint (another
            input path, chunking, embedder or shard size) is not resumed from.
    """

    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.done: dict[int, str] = {}  # shard number -> digest of its contents
        self.complete = False
        self._load()

    def __repr__(self) -> str:
        return f"<Progress {str(self.path)!r} shards_done={len(self.done)} complete={self.complete}>"

    def _load(self) -> None:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        try:
            data = json.loads(raw)
            if data.get("format") != _FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            done = {int(number): str(digest) for number, digest in data["done"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidInputError(
                f"progress file '{self.path}' is unreadable ({exc}); delete it to index from the start "
                "(chunks already in the target are then upserted again)."
            ) from None
        if data.get("fingerprint") != self.fingerprint:
            logger.warning(
                "progress file %s belongs to another input or settings: indexing everything again (upserts)", self.path
            )
            return
        self.done = done
        self.complete = bool(data.get("complete"))

    def save(self, settings: Mapping[str, Any], *, chunks_written: int) -> None:
        """Write the file atomically: temp file, fsync, rename, fsync of the folder."""
        data = {
            "format": _FORMAT,
            "fingerprint": self.fingerprint,
            "settings": dict(settings),
            "complete": self.complete,
            "shards_done": len(self.done),
            "chunks_written": chunks_written,
            "done": {str(n): self.done[n] for n in sorted(self.done)},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        with temp.open("w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, self.path)
        try:
            fd = os.open(self.path.parent, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
