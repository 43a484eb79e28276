"""The Ray Data path of ``index_bulk``: chunks in, vectors out of an actor pool of embedders.

The driver reads and chunks (the one reader and splitter), Ray Data ships the pending chunks'
texts to ``map_batches`` over actors that each hold one :class:`~gpuprompt.Embedder`, and the
driver streams the vectors back into the writer, recording each shard once all its chunks are in.
Only ``(row, text)`` travels to the actors and ``(row, vector)`` back; documents and metadata stay
on the driver.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt.errors import ConfigurationError, DependencyError

if TYPE_CHECKING:
    from gpuprompt.apps.bulk._shards import RayOptions, Shard
    from gpuprompt.embed import EmbedderConfig

__all__ = ["LOOPBACK", "EmbedActor", "embed_on_ray", "import_ray"]

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.2"
"""The node address of a local cluster started here. ``ray.init`` rewrites 127.0.0.1 (and
"localhost") to the machine's external address on purpose; any other loopback address is kept
(Linux routes all of 127.0.0.0/8 to the loopback device)."""

_BLOCKS_PER_ACTOR = 4  # enough input blocks that every actor stays busy and the tail is short


def import_ray() -> Any:
    """``import ray`` and ``ray.data``, or a :class:`DependencyError` naming the install command."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise DependencyError(
            "the Ray path needs Ray Data: pip install 'ray[data]==2.60.*' (never 'ray[llm]', which pins an "
            f"older vLLM) ({exc})"
        ) from exc
    return ray


def ensure_ray(ray: Any, address: str | None, **init_options: Any) -> bool:
    """Connect to ``address`` or start a local cluster on loopback unless Ray is up already.

    Returns:
        True if this call started (and the caller must shut down) the connection.
    """
    if ray.is_initialized():
        return False
    if address is None:
        init_options.setdefault("_node_ip_address", LOOPBACK)
        init_options.setdefault("log_to_driver", False)  # the actors' model-loading output is noise here
    ray.init(address=address, include_dashboard=False, **init_options)
    return True


class EmbedActor:
    """A Ray Data map_batches callable that holds one Embedder for its lifetime.

    Args:
        config: the :class:`~gpuprompt.EmbedderConfig` fields (a dict travels to the actor).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        from gpuprompt.embed import Embedder, EmbedderConfig

        self.embedder = Embedder(config=EmbedderConfig(**config)).load()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(text) for text in batch["text"]]
        return {"row": np.asarray(batch["row"]), "vector": self.embedder.embed(texts, show_progress=False)}


def embed_on_ray(
    shards: Iterator[Shard], job: Any, config: EmbedderConfig, batch_size: int, options: RayOptions, bar: Any
) -> tuple[int, int, int]:
    """Embed every shard that is not done on a Ray Data actor pool and write it through ``job``.

    Returns:
        ``(embedded, skipped, actors)``.
    """
    ray = import_ray()
    pending: list[Shard] = []
    for shard in shards:
        if job.is_done(shard):
            bar.update(len(shard.chunks))
        else:
            pending.append(shard)
    if not pending:
        return 0, job.skipped, 0
    started_here = ensure_ray(ray, options.address)
    try:
        embedded, actors = _run(ray, pending, job, config, batch_size, options, bar)
        return embedded, job.skipped, actors
    finally:
        if started_here:
            ray.shutdown()


def _run(
    ray: Any, pending: list[Shard], job: Any, config: EmbedderConfig, batch_size: int, options: RayOptions, bar: Any
) -> tuple[int, int]:
    import pyarrow as pa
    from ray.data import ActorPoolStrategy, DataContext

    chunks = [chunk for shard in pending for chunk in shard.chunks]
    shard_of = np.fromiter((shard.number for shard in pending for _ in shard.chunks), dtype=np.int64, count=len(chunks))
    remaining = {shard.number: len(shard.chunks) for shard in pending}
    by_number = {shard.number: shard for shard in pending}
    actors = _actors(ray, options, len(pending))
    per_block = max(1, len(pending) // (actors * _BLOCKS_PER_ACTOR))
    tables, row = [], 0
    for first in range(0, len(pending), per_block):
        group = [chunk for shard in pending[first : first + per_block] for chunk in shard.chunks]
        tables.append(pa.table({"row": np.arange(row, row + len(group)), "text": [c.text for c in group]}))
        row += len(group)
    context = DataContext.get_current()
    saved = context.enable_progress_bars
    context.enable_progress_bars = False  # our own bar counts chunks written, Ray's would interleave
    try:
        dataset = ray.data.from_arrow(tables).map_batches(
            EmbedActor,
            fn_constructor_kwargs={"config": _config_dict(config)},
            batch_size=batch_size,
            batch_format="numpy",
            compute=ActorPoolStrategy(size=actors),
            num_cpus=options.num_cpus,
            num_gpus=options.num_gpus or None,
        )
        for batch in _batches(ray, dataset):
            rows = batch["row"].tolist()
            job.write([chunks[r] for r in rows], np.array(batch["vector"], dtype=np.float32))
            for r in rows:
                number = int(shard_of[r])
                remaining[number] -= 1
                if remaining[number] == 0:
                    job.shard_done(by_number[number])
            bar.update(len(rows))
    finally:
        context.enable_progress_bars = saved
    return len(chunks), actors


def _batches(ray: Any, dataset: Any) -> Iterator[dict[str, np.ndarray]]:
    """The dataset's output batches; a failure inside Ray (an actor that could not load or embed)
    becomes an :class:`~gpuprompt.errors.EngineError` carrying Ray's report."""
    from gpuprompt.errors import EngineError

    iterator = iter(dataset.iter_batches(batch_format="numpy", batch_size=None))
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except ray.exceptions.RayError as exc:
            raise EngineError(f"the Ray embedding job failed: {exc}") from exc
        yield batch


def _actors(ray: Any, options: RayOptions, shards: int) -> int:
    if options.concurrency is not None:
        return options.concurrency
    resources = ray.cluster_resources()
    if options.num_gpus:
        fit = int(resources.get("GPU", 0) // options.num_gpus)
        if fit < 1:
            raise ConfigurationError(
                f"num_gpus={options.num_gpus} per actor but the Ray cluster has {resources.get('GPU', 0)} GPU(s); "
                "set num_gpus=0 to embed on CPUs."
            )
    else:
        fit = int(resources.get("CPU", 1) // options.num_cpus)
    return max(1, min(fit, shards))


def _config_dict(config: EmbedderConfig) -> dict[str, Any]:
    data = dataclasses.asdict(config)
    data["show_progress"] = False
    return data
