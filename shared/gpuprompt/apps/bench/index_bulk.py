"""``index-bulk``: texts/s of ``gpuprompt index-bulk`` with ``--ray`` (Ray Data embedder actors on a
local cluster) vs one process, on the same corpus, end to end (read, chunk, embed, write, save)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from gpuprompt.apps.bench._registry import BenchContext, Chart, ScenarioResult, scenario

__all__: list[str] = []

_PRODUCTS = ["dress", "jeans", "sweater", "rain jacket", "sneakers", "scarf", "t-shirt", "chinos"]
_COLOURS = ["red", "navy", "olive", "black", "white", "mustard", "grey", "teal"]
_FABRICS = ["cotton", "wool", "linen", "denim", "polyester", "silk"]


def corpus(path: Path, n: int, salt: str) -> Path:
    """Write ``n`` product descriptions (one chunk each) as JSON lines; ``salt`` makes them new
    texts, so that no embedding cache serves a later run."""
    with path.open("w", encoding="utf-8") as handle:
        for i in range(n):
            product, colour = _PRODUCTS[i % 8], _COLOURS[(i // 8) % 8]
            fabric = _FABRICS[(i // 64) % len(_FABRICS)]
            text = (
                f"{salt} {colour} {product} #{i}: {fabric}, machine wash at {30 + 10 * (i % 3)} C, shrinks "
                f"{i % 5}% after the first wash, sizes XS to XL, {19 + i % 80} EUR, delivered in {2 + i % 4} days."
            )
            handle.write(json.dumps({"id": f"p{i}", "text": text}) + "\n")
    return path


@scenario(
    "index-bulk",
    "index-bulk over the same JSONL corpus of product texts: one process (the shared Embedder, batched) "
    "vs --ray (Ray Data map_batches over one embedder actor per CPU on a local cluster), texts/s end to end.",
)
def index_bulk_scenario(ctx: BenchContext) -> ScenarioResult:
    from gpuprompt.apps.bulk import RayOptions, index_bulk
    from gpuprompt.apps.bulk._ray import ensure_ray, import_ray
    from gpuprompt.runtime import get_runtime

    n = 512 if ctx.quick else 4096
    batch_size = 64
    cpus = os.cpu_count() or 1
    ray = import_ray()
    started = time.perf_counter()
    started_here = ensure_ray(ray, None, num_cpus=cpus, log_to_driver=False)
    cluster_s = time.perf_counter() - started
    embedder = get_runtime().embedder().load()
    # Like for like: on a GPU machine each Ray actor gets a GPU, as the one-process embedder has one.
    gpus = 1.0 if embedder.device.startswith("cuda") and ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
    run_id = iter(range(10**6))
    try:
        with tempfile.TemporaryDirectory(prefix="gpuprompt-bench-bulk-") as tmp:
            work = Path(tmp)

            def measure() -> dict[str, float]:
                run = next(run_id)
                data = corpus(work / f"docs-{run}.jsonl", n, f"run {run}")
                # Both paths embed texts never seen before: the one-process embedder's cache cannot help.
                one = index_bulk(data, work / f"one-{run}", batch_size=batch_size, id_field="id", progress=False,
                                 embedder=embedder)
                data = corpus(work / f"docs-ray-{run}.jsonl", n, f"ray run {run}")
                on_ray = index_bulk(data, work / f"ray-{run}", ray=True, batch_size=batch_size, id_field="id",
                                    progress=False, embedder=embedder.config, ray_options=RayOptions(num_gpus=gpus))
                return {
                    "one_process_texts_per_s": one.texts_per_s,
                    "ray_texts_per_s": on_ray.texts_per_s,
                    "ray_vs_one_process": on_ray.texts_per_s / one.texts_per_s,
                    "ray_actors": on_ray.actors,
                    "one_process_s": one.seconds,
                    "ray_s": on_ray.seconds,
                }

            medians, runs = ctx.repeat(measure)
    finally:
        if started_here:
            ray.shutdown()
    medians["texts"] = n
    medians["ray_cluster_start_s"] = cluster_s
    ratio = medians["ray_vs_one_process"]
    return ScenarioResult(
        metrics=medians,
        goal="--ray texts/s >= one process on the same machine",
        goal_met=ratio >= 1.0,
        runs=runs,
        chart=Chart(kind="bar", title=f"index-bulk: {n} texts, {cpus} CPU(s)", ylabel="texts/s",
                    labels=["one process", f"--ray ({int(medians['ray_actors'])} actors)"],
                    values=[medians["one_process_texts_per_s"], medians["ray_texts_per_s"]]),
        notes=(
            f"{cpus} CPU(s){', one GPU per actor' if gpus else ''}. The --ray time includes starting the actors and loading one embedder in each "
            "(the local cluster was started once before, in "
            f"{cluster_s:.1f} s, and is not counted). On one machine the one-process embedder already uses "
            "every core, so Ray adds actor start-up and data movement and cannot win; its point is scale-out "
            "over many nodes/GPUs, where each actor brings its own cores."
        ),
        ratio=ratio,
        ratio_label="index-bulk --ray vs one process (texts/s)",
    )
