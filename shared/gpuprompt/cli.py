"""The ``gpuprompt`` command: ``demo``, ``bench`` and (with the server extra) ``serve``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

__all__ = ["main"]


def _bench(args: argparse.Namespace) -> int:
    from gpuprompt.bench import BenchContext, ScenarioResult, run_scenario, scenarios, write_summary
    from gpuprompt.bench._registry import environment

    table = scenarios()
    if args.scenario == ["list"]:
        for name, item in sorted(table.items()):
            print(f"{name:22s} {item.description}")
        return 0
    if args.scenario == ["all"]:
        # gpu-smoke only says something on a CUDA machine; elsewhere it is left out of "all".
        names = [n for n in sorted(table) if n != "gpu-smoke" or _has_cuda()]
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
            logging.getLogger("gpuprompt.bench").exception("scenario %s failed", name)
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
    from gpuprompt.demo import run_demo

    return run_demo(products=args.products, customers=args.customers, max_tokens=args.max_tokens,
                    llm_backend=args.llm_backend)


def _serve(args: argparse.Namespace) -> int:
    try:
        from gpuprompt.server import serve
    except ImportError as exc:
        print(f"the server needs the 'server' extra: pip install 'gpuprompt[server]' ({exc})", file=sys.stderr)
        return 2
    # Options left unset keep serve()'s own defaults (one place for them).
    options = {
        "llm_backend": args.llm_backend,
        "embedding_model": args.embedding_model,
        "chat_model": args.chat_model,
        "device": args.device,
        "max_body_bytes": args.max_body_bytes,
        "max_in_flight": args.max_in_flight,
        "default_max_tokens": args.default_max_tokens,
        "max_collections": args.max_collections,
        "max_collection_records": args.max_collection_records,
        "graceful_timeout_s": args.graceful_timeout,
        "log_level": args.log_level,
    }
    options = {name: value for name, value in options.items() if value is not None}
    if args.any_model_name:
        options["strict_model_names"] = False
    return serve(host=args.host, port=args.port, api_key=args.api_key, **options)


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
    parser = argparse.ArgumentParser(prog="gpuprompt", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="e-commerce support RAG demo on the bundled models")
    demo.add_argument("--products", type=_positive_int, default=2000, help="catalogue size (default 2000)")
    demo.add_argument("--customers", type=_positive_int, default=32,
                      help="concurrent customers in the burst (default 32)")
    demo.add_argument("--max-tokens", type=_positive_int, default=48, help="new tokens per answer (default 48)")
    demo.add_argument("--llm-backend", choices=["auto", "vllm", "transformers"], default="auto",
                      help="LLM engine backend (default auto: vLLM when it starts, else transformers)")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="measure a scenario against the stock classes (JSON + PNG)")
    bench.add_argument("scenario", nargs="+", help="one or more scenario names, 'all', or 'list'")
    bench.add_argument("--quick", action="store_true", help="smaller, faster variant")
    bench.add_argument("--runs", type=int, default=3, help="repeats; medians are reported (default 3)")
    bench.add_argument("--out", default="bench-results", help="output folder (default bench-results)")
    bench.set_defaults(func=_bench)

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server over the batched core")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=os.environ.get("GPUPROMPT_API_KEY") or None,
                       help="require 'Authorization: Bearer KEY' (default: $GPUPROMPT_API_KEY, else no key)")
    serve.add_argument("--llm-backend", choices=["auto", "vllm", "transformers"], help="default: auto")
    serve.add_argument("--embedding-model", help="local folder or hub id (default: bundled)")
    serve.add_argument("--chat-model", help="local folder, .gguf file or hub id (default: bundled)")
    serve.add_argument("--device", help="auto (default), cpu, cuda, cuda:N or mps")
    serve.add_argument("--max-body-bytes", type=int, help="larger bodies get 413 (default 16 MiB)")
    serve.add_argument("--max-in-flight", type=int, help="more concurrent model requests get 429 (default 1024)")
    serve.add_argument("--default-max-tokens", type=int, help="when a request names none (default 512)")
    serve.add_argument("--max-collections", type=int, help="most vector collections; more get 409 (default 64)")
    serve.add_argument("--max-collection-records", type=int,
                       help="most records in one collection; more get 409 (default 1,000,000)")
    serve.add_argument("--any-model-name", action="store_true", help="accept any 'model' name (no 404)")
    serve.add_argument("--graceful-timeout", type=float, help="seconds to drain on SIGTERM (default 60)")
    serve.add_argument("--log-level", help="uvicorn log level (default info)")
    serve.set_defaults(func=_serve)
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
    try:
        return int(args.func(args) or 0)
    finally:
        # Close the shared models now, before interpreter exit: other libraries' exit hooks (vLLM's
        # among them) would otherwise tear the engine down under it first.
        from gpuprompt.runtime import _shutdown_default

        _shutdown_default()


if __name__ == "__main__":
    sys.exit(main())
