"""The ``gpuprompt`` command: ``demo``, ``bench``, ``index-bulk`` and (with the server extra) ``serve``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

__all__ = ["main"]

_DESCRIPTION = "gpuprompt: demo, bench, serve (with the server extra) and index-bulk."


def _bench(args: argparse.Namespace) -> int:
    from gpuprompt.apps.bench import BenchContext, ScenarioResult, run_scenario, scenarios, write_summary
    from gpuprompt.apps.bench._registry import environment

    table = scenarios()
    if args.scenario == ["list"]:
        for name, item in sorted(table.items()):
            print(f"{name:22s} {item.description}")
        return 0
    if args.scenario == ["all"]:
        # gpu-smoke only says something on a CUDA machine; elsewhere it is left out of "all".
        # embed-peer installs a peer server (infinity-emb, ~1.6 GB, minutes) the first time: it runs
        # when named (`gpuprompt bench embed-peer`), never as a side effect of "all".
        names = [n for n in sorted(table) if (n != "gpu-smoke" or _has_cuda()) and n != "embed-peer"]
    else:
        names = list(dict.fromkeys(args.scenario))
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"unknown scenario {unknown[0]!r}; choose from: {', '.join(sorted(table))}, all, list", file=sys.stderr)
        return 2
    ctx = BenchContext(quick=args.quick, runs=args.runs, out_dir=Path(args.out))
    env = environment()
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    results: dict[str, ScenarioResult] = {}
    errors: dict[str, str] = {}
    for name in names:
        print(f"== {name} ({'quick, ' if args.quick else ''}median of {args.runs} runs)", flush=True)
        try:
            result = run_scenario(name, ctx)
        except Exception as exc:  # one broken scenario must not hide the others' figures
            logging.getLogger("gpuprompt.apps.bench").exception("scenario %s failed", name)
            errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"   FAILED: {errors[name]}", flush=True)
            continue
        results[name] = result
        width = max(len(k) for k in result.metrics)
        for key, value in result.metrics.items():
            print(f"   {key:{width}s}  {value:12.3f}")
        if result.ratio is not None:
            print(f"   headline: {result.ratio:.2f}x {result.ratio_label}")
        print(f"   goal: {result.goal} -> {'MET' if result.goal_met else 'NOT MET'}")
        if result.notes:
            print(f"   note: {result.notes}")
        print(f"   wrote {ctx.out_dir / (name + '.json')}", flush=True)
    if len(names) > 1 and results:
        print(f"summary: {write_summary(results, ctx)}")
    missed = [n for n, r in results.items() if not r.goal_met]
    if missed:
        print(f"goals not met: {', '.join(missed)}")
    return 1 if errors else 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _demo(args: argparse.Namespace) -> int:
    from gpuprompt.apps.demo import run_demo

    return run_demo(products=args.products, customers=args.customers, max_tokens=args.max_tokens,
                    llm_backend=args.llm_backend, rerank_model=args.rerank_model)


def _serve(args: argparse.Namespace) -> int:
    try:
        from gpuprompt.server import serve
        from gpuprompt.server._settings import ServeSettings, load_settings
    except ImportError as exc:
        print(f"the server needs the 'server' extra: pip install 'gpuprompt[server]' ({exc})", file=sys.stderr)
        return 2
    from gpuprompt.errors import ConfigurationError

    # Flags given on the command line win over GPUPROMPT_* variables, which win over the defaults.
    given = {name: getattr(args, name) for name in ServeSettings.model_fields if hasattr(args, name)}
    try:
        settings = load_settings(**given)
    except ConfigurationError as exc:
        print(f"gpuprompt serve: {exc}", file=sys.stderr)
        return 2
    try:
        return serve(**settings.serve_options())
    except ConfigurationError as exc:  # options that contradict each other (--data-dir with --vector-uri)
        print(f"gpuprompt serve: {exc}", file=sys.stderr)
        return 2


def _add_serve_flags(serve: argparse.ArgumentParser) -> None:
    """One flag per :class:`~gpuprompt.server._settings.ServeSettings` field (each also ``GPUPROMPT_<FLAG>``)."""
    import typing

    try:
        from gpuprompt.server._settings import ServeSettings, env_name, flag_name
    except ImportError:  # without the server extra, `serve` only says how to install it
        serve.add_argument("ignored", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        return
    for name, info in ServeSettings.model_fields.items():
        shown = "" if info.default is None else f"default: {info.default}; "
        help_text = f"{info.description} ({shown}env {env_name(name)})"
        options: dict = {"dest": name, "default": argparse.SUPPRESS, "help": help_text.replace("%", "%%")}
        if info.annotation is bool:
            serve.add_argument(flag_name(name), action="store_true", **options)
            continue
        for kind in (info.annotation, *typing.get_args(info.annotation)):
            if typing.get_origin(kind) is typing.Literal:
                options["choices"] = list(typing.get_args(kind))
        serve.add_argument(flag_name(name), **options)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gpuprompt`` command."""
    parser = argparse.ArgumentParser(prog="gpuprompt", description=_DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="e-commerce support RAG demo on the bundled models")
    demo.add_argument("--products", type=_positive_int, default=2000, help="catalogue size (default 2000)")
    demo.add_argument("--customers", type=_positive_int, default=32,
                      help="concurrent customers in the burst (default 32)")
    demo.add_argument("--max-tokens", type=_positive_int, default=48, help="new tokens per answer (default 48)")
    demo.add_argument("--rerank-model", default=None,
                      help="a cross-encoder (local folder or hub id): retrieve 20, rerank to 4, show the stage")
    demo.add_argument("--llm-backend", choices=["auto", "vllm", "transformers"], default="auto",
                      help="LLM engine backend (default auto: vLLM when it starts, else transformers)")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="measure a scenario against the stock classes (JSON + PNG)")
    bench.add_argument("scenario", nargs="+", help="one or more scenario names, 'all', or 'list'")
    bench.add_argument("--quick", action="store_true", help="smaller, faster variant")
    bench.add_argument("--runs", type=int, default=3, help="repeats; medians are reported (default 3)")
    bench.add_argument("--out", default="bench-results", help="output folder (default bench-results)")
    bench.set_defaults(func=_bench)

    serve = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server over the batched core",
        description="Every flag can also be set by its GPUPROMPT_<FLAG> environment variable; a flag on the "
        "command line wins.",
    )
    _add_serve_flags(serve)
    serve.set_defaults(func=_serve)

    from gpuprompt.apps import bulk

    index_bulk = sub.add_parser(
        "index-bulk",
        help="chunk, embed and index a corpus into a snapshot folder or Milvus (resumable; --ray for Ray Data)",
        description="JSONL / Parquet / a folder of text files -> chunks -> the embedder -> a VectorIndex snapshot "
        "folder or a Milvus collection. Run it again after a crash: chunks already written are not embedded again.",
    )
    bulk.add_arguments(index_bulk)
    index_bulk.set_defaults(func=bulk.run_args)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpuprompt`` command."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    if not args.verbose:
        # vLLM logs every engine step at INFO and weight casts at WARNING; a user wants our output.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' weight-loading bars
        import warnings

        warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from gpuprompt.runtime import _live_default, _shutdown_default

    host = _live_default()  # a runtime the calling process made before (main() called in process)
    try:
        return int(args.func(args) or 0)
    finally:
        # Close the shared models this command loaded now, before interpreter exit: other libraries'
        # exit hooks (vLLM's among them) would otherwise tear the engine down under it first. A
        # runtime the caller already had is the caller's to close.
        _shutdown_default(keep=host)


if __name__ == "__main__":
    sys.exit(main())
