"""The units of a bulk job: :class:`Shard` (consecutive chunks, digested so a re-run skips what it
already wrote) and :class:`RayOptions` (how the Ray Data path runs)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

from gpuprompt.apps.bulk._read import Chunk
from gpuprompt.errors import ConfigurationError
from gpuprompt.validation import check_int, check_number, check_str

__all__ = ["RayOptions", "Shard"]

_MAX = 2**31 - 1


@dataclass(frozen=True)
class Shard:
    """``batch_size`` consecutive chunks of the stream (the last shard may hold fewer).

    Its :attr:`digest` covers every chunk's id, text and metadata: a re-run skips a shard only if
    the same number was written with the same contents, so after an edit of the input only the
    shards from the edit on are embedded again.
    """

    number: int
    chunks: list[Chunk]

    @cached_property
    def digest(self) -> str:
        h = hashlib.sha256()
        for chunk in self.chunks:
            for part in (chunk.id, chunk.text, json.dumps(chunk.metadata, sort_keys=True, ensure_ascii=False)):
                data = part.encode("utf-8")
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
        return h.hexdigest()[:32]


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """How the Ray path runs.

    Attributes:
        address: the cluster to join (``"auto"``, ``"ray://host:10001"``...), or None: use the
            running one if ``ray.init`` was called, else start a local cluster bound to loopback.
        num_cpus: CPUs reserved per embedder actor.
        num_gpus: GPUs per embedder actor (0 on CPU clusters; 1 puts one embedder on each GPU).
        concurrency: embedder actors; None = as many as the cluster's CPUs (or GPUs) allow.
    """

    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    concurrency: int | None = None

    def __post_init__(self) -> None:

        check_str(self.address, "address", allow_none=True, allow_empty=False, error=ConfigurationError)
        object.__setattr__(self, "num_cpus", check_number(self.num_cpus, "num_cpus", min=0, max=1e6, error=ConfigurationError))
        object.__setattr__(self, "num_gpus", check_number(self.num_gpus, "num_gpus", min=0, max=1e6, error=ConfigurationError))
        check_int(self.concurrency, "concurrency", min=1, max=100_000, allow_none=True, error=ConfigurationError)
        if self.num_cpus == 0 and self.num_gpus == 0:
            raise ConfigurationError("'num_cpus' and 'num_gpus' must not both be 0: an actor needs a CPU or a GPU.")
