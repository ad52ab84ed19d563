"""`fairserve bench`: flags, options and entry points (plugged into `fairserve` via the fairserve.commands group).

The gateway must not import `bench/` (docs/architecture.md, "Layers"; an import-linter contract), so the subcommand is registered from
here through the `fairserve.commands` entry point that `gateway/cli/__init__.py` loads; `python -m bench.cli`
runs the same thing without the dispatcher.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.workloads import WORKLOADS

if TYPE_CHECKING:
    from bench.run import BenchOptions

API_KEY_ENV = "FAIRSERVE_API_KEY"
METRICS_TOKEN_ENV = "FAIRSERVE_METRICS_TOKEN"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench flags."""
    p.add_argument(
        "--url", default=None, help="a running server (default: start one in-process on a free port)"
    )
    p.add_argument("--api-key", default=None, help=f"tenant API key for --url (or ${API_KEY_ENV})")
    p.add_argument(
        "--metrics-token",
        default=None,
        help=f"the server's metrics (or admin) token for scraping /metrics of --url (or ${METRICS_TOKEN_ENV})",
    )
    p.add_argument("--quick", action="store_true", help="small sizes: the whole run takes under two minutes")
    p.add_argument("--out", default="bench-report", help="directory for report.json, report.md and the PNGs")
    p.add_argument(
        "--workload",
        nargs="+",
        default=None,
        metavar="NAME",
        help=f"workloads to run (default: all of {', '.join(WORKLOADS)})",
    )
    p.add_argument("--duration", type=float, default=None, help="seconds of traffic per workload")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply every workload's arrival rate")
    p.add_argument(
        "--sweep-rates",
        type=float,
        nargs="+",
        default=None,
        metavar="RPS",
        help="offered loads (arrivals/s) of the knee sweep",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-comparisons", action="store_true", help="skip the engine, policy and gateway comparisons"
    )
    p.add_argument(
        "--deadlines",
        action="store_true",
        help="instead: tight, mixed deadlines over a slow and a fast model under X-On-Infeasible reject, "
        "fallback and partial (bench/deadlines.py; --duration, --rate-scale, --seed apply)",
    )
    p.add_argument(
        "--litellm-bin",
        default=None,
        help="litellm executable for the gateway comparison (else FAIRSERVE_LITELLM_BIN, PATH)",
    )


def register(subparsers: Any) -> None:
    """Add the `bench` subcommand to the `fairserve` dispatcher."""
    p = subparsers.add_parser(
        "bench",
        help="open-loop benchmark: workloads, knee sweep, comparisons, report",
        description="Measure a fairserve server over HTTP (open loop) and the engine "
        "in-process; write report.json, report.md and PNG plots.",
    )
    add_arguments(p)
    p.set_defaults(func=bench_command)


def retyped(args: argparse.Namespace) -> str:
    """The invocation as a person would type it again; the API key is never written into the report."""
    argv: list[str] = ["--quick"] if args.quick else []
    for flag, value in (
        ("--url", args.url),
        ("--api-key", f"${API_KEY_ENV}" if args.api_key else None),
        ("--metrics-token", f"${METRICS_TOKEN_ENV}" if args.metrics_token else None),
        ("--out", args.out),
        ("--duration", args.duration),
        ("--seed", args.seed or None),
        ("--litellm-bin", args.litellm_bin),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.workload:
        argv += ["--workload", *args.workload]
    if args.rate_scale != 1.0:
        argv += ["--rate-scale", f"{args.rate_scale:g}"]
    if args.sweep_rates:
        argv += ["--sweep-rates", *(f"{r:g}" for r in args.sweep_rates)]
    if args.no_comparisons:
        argv.append("--no-comparisons")
    typed = shlex.join(argv).replace(f"'${API_KEY_ENV}'", f"${API_KEY_ENV}")
    return "fairserve bench " + typed.replace(f"'${METRICS_TOKEN_ENV}'", f"${METRICS_TOKEN_ENV}")


def options(args: argparse.Namespace) -> BenchOptions:
    """BenchOptions from parsed flags (not yet validated)."""
    # Imported here: every `fairserve` command builds this parser, and bench.run pulls in matplotlib.
    from bench.run import BenchOptions

    overrides: dict[str, Any] = {
        "url": args.url,
        "api_key": args.api_key or os.environ.get(API_KEY_ENV),
        "out": Path(args.out),
        "metrics_token": args.metrics_token or os.environ.get(METRICS_TOKEN_ENV, ""),
        "seed": args.seed,
        "rate_scale": args.rate_scale,
        "comparisons": not args.no_comparisons,
        "litellm_bin": args.litellm_bin,
        "command": retyped(args),
    }
    if args.workload:
        overrides["workloads"] = list(dict.fromkeys(args.workload))
    if args.duration is not None:
        overrides["duration_s"] = args.duration
    if args.sweep_rates:
        overrides["sweep_rates"] = sorted(args.sweep_rates)
    return BenchOptions.quick_defaults(**overrides) if args.quick else BenchOptions(**overrides)


DEADLINE_RATE = 1.0  # arrivals/s of the deadline workload, before --rate-scale: about what `slow` serves


def bench_command(args: argparse.Namespace) -> int:
    """Run the bench; exit status 2 with a message on bad options."""
    if args.deadlines:
        from bench.deadlines import run_deadlines

        duration = args.duration or (10.0 if args.quick else 20.0)
        rounds = 1 if args.quick else 2
        paths = run_deadlines(Path(args.out), DEADLINE_RATE * args.rate_scale, duration, rounds, args.seed)
        for kind, path in paths.items():
            print(f"{kind}: {path}", flush=True)
        return 0
    opts = options(args)
    try:
        opts.validate()
    except ValueError as exc:
        print(f"fairserve bench: {exc}", file=sys.stderr)
        return 2
    from bench.run import run_bench

    for kind, path in run_bench(opts).items():
        print(f"{kind}: {path}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.cli`: the same as `fairserve bench`."""
    parser = argparse.ArgumentParser(prog="fairserve bench", description=__doc__)
    add_arguments(parser)
    return bench_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
