"""``gpuprompt index-bulk INPUT --into DIR [--ray]``: the command line of :func:`index_bulk`."""

from __future__ import annotations

import argparse
import sys

from gpuprompt.apps.bulk._chunk import DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_SIZE

__all__ = ["add_arguments", "main", "run_args"]

_DESCRIPTION = (
    "Chunk, embed and write a corpus (a JSONL or Parquet file, or a folder of .txt/.md files) into a "
    "VectorIndex snapshot folder or a Milvus collection. Resumable: run the same command again after a crash "
    "and the chunks already written are skipped. --ray embeds on Ray Data (an actor pool of embedders)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``index-bulk`` options to ``parser`` (the ``gpuprompt`` command's sub-parser)."""
    from gpuprompt.apps.bulk._run import DEFAULT_BATCH_SIZE, DEFAULT_CHECKPOINT_EVERY

    parser.add_argument("input", metavar="INPUT", help="a .jsonl/.parquet file, or a folder of .txt/.md files")
    parser.add_argument("--into", required=True, metavar="TARGET",
                        help="snapshot folder to create or upsert into, or a Milvus URI (http://host:19530 or a .db file)")
    parser.add_argument("--collection", default=None, help="Milvus collection of a Milvus target (default gpuprompt)")
    parser.add_argument("--ray", action="store_true", help="embed on Ray Data actors instead of in this process")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE,
                        help=f"most characters per chunk (default {DEFAULT_CHUNK_SIZE})")
    parser.add_argument("--chunk-overlap", type=int, default=DEFAULT_CHUNK_OVERLAP,
                        help=f"characters shared by consecutive chunks (default {DEFAULT_CHUNK_OVERLAP})")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help=f"chunks per embedding call and per resumable shard (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--text-field", default="text", help="record field holding the text (default text)")
    parser.add_argument("--id-field", default=None,
                        help="record field naming each record (default: <input path>:<line>, the path relative "
                             "to the current folder when inside it, else absolute)")
    parser.add_argument("--id-prefix", default=None,
                        help="name the input by this instead of its path in the default ids (resume from "
                             "another folder with the same ids)")
    parser.add_argument("--metadata-field", dest="metadata_fields", action="append", default=None, metavar="FIELD",
                        help="record field copied into the metadata (repeat for several)")
    parser.add_argument("--checkpoint-every", type=int, default=DEFAULT_CHECKPOINT_EVERY,
                        help=f"chunks between commits of the target (default {DEFAULT_CHECKPOINT_EVERY})")
    parser.add_argument("--model", default=None, help="embedding model folder or id (default: bundled MiniLM)")
    parser.add_argument("--device", default="auto", help="embedding device (default auto)")
    parser.add_argument("--ray-address", default=None,
                        help="Ray cluster to join (default: the running one, else a local cluster on loopback)")
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per embedder actor (default 1)")
    parser.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per embedder actor (default 0)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="embedder actors (default: as many as the cluster's CPUs or GPUs allow)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run_args(args: argparse.Namespace) -> int:
    """Run ``index-bulk`` with parsed arguments; a typed error becomes a message and exit code 2."""
    from gpuprompt.apps.bulk._run import RayOptions, index_bulk
    from gpuprompt.embed import EmbedderConfig
    from gpuprompt.errors import GPUPromptError

    try:
        result = index_bulk(
            args.input,
            args.into,
            ray=args.ray,
            chunk_size=args.chunk_size,
            chunk_overlap=args.chunk_overlap,
            batch_size=args.batch_size,
            text_field=args.text_field,
            id_field=args.id_field,
            metadata_fields=args.metadata_fields,
            progress=args.progress,
            embedder=EmbedderConfig(model=args.model, device=args.device),
            checkpoint_every=args.checkpoint_every,
            ray_options=RayOptions(address=args.ray_address, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
                                   concurrency=args.concurrency),
            collection=args.collection,
            id_prefix=args.id_prefix,
        )
    except GPUPromptError as exc:
        print(f"gpuprompt index-bulk: {exc}", file=sys.stderr)
        return 2
    print(
        f"indexed {result.embedded} chunks into {result.into} ({result.skipped} already there, {result.chunks} in all) "
        f"in {result.seconds:.1f} s: {result.texts_per_s:.1f} texts/s"
        + (f" on {result.actors} Ray actor(s)" if result.ray else "")
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``gpuprompt index-bulk`` on its own (also ``python -m gpuprompt.apps.bulk``)."""
    parser = argparse.ArgumentParser(prog="gpuprompt index-bulk", description=_DESCRIPTION)
    add_arguments(parser)
    return run_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
