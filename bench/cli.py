"""`fairserve bench`: its options, flags and entry points.

The gateway never imports `bench/`, so the subcommand plugs into `fairserve` through the
`fairserve.commands` entry point; `python -m bench.cli` runs the same thing without the dispatcher.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.workloads import WORKLOADS

# Flags whose value the report writes as the environment variable that can hold it, never as given.
SECRETS = {
    "api_key": "FAIRSERVE_API_KEY",
    "metrics_token": "FAIRSERVE_METRICS_TOKEN",
    "admin_token": "FAIRSERVE_ADMIN_TOKEN",
}
# `--quick`: the whole run fits in under two minutes on a 2-core machine.
QUICK: dict[str, Any] = {"duration_s": 4.0, "sweep_rates": [4.0, 16.0, 32.0, 64.0], "sweep_duration_s": 2.5}


@dataclass
class BenchOptions:
    """Everything one `fairserve bench` invocation does; defaults are the full run."""

    url: str | None = None
    api_key: str | None = None
    metrics_token: str = ""  # with --url: the server's metrics (or admin) token, for /metrics
    # With --url: the admin token, to give each workload tenant its own tenant, weight and key (bench/provision.py).
    admin_token: str = ""
    quick: bool = False
    out: Path = Path("bench-report")
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    seed: int = 0
    duration_s: float = 20.0
    rate_scale: float = 1.0  # multiplies every workload's default arrival rate
    sweep_rates: list[float] = field(default_factory=lambda: [4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0])
    sweep_duration_s: float = 10.0
    sweep_workload: str = "chat"
    policy_workload: str = "retrieval"
    policy_rate: float = 16.0  # arrivals/s: busy enough that ordering and chunking matter
    closed_loop_clients: int = 4
    comparisons: bool = True
    litellm_bin: str | None = None
    command: str = "fairserve bench"

    def validate(self) -> None:
        """Raise ValueError naming the first bad option."""
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise ValueError(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
        if self.duration_s <= 0 or self.sweep_duration_s <= 0:
            raise ValueError("durations must be > 0")
        if self.rate_scale <= 0 or any(r <= 0 for r in self.sweep_rates):
            raise ValueError("rates must be > 0")
        if self.url is not None and not self.api_key and not self.admin_token:
            raise ValueError("--url needs --api-key (every tenant on that key) or --admin-token (a key each)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench flags."""
    a = p.add_argument
    a("--quick", action="store_true", help="small sizes: the whole run takes under two minutes")
    a("--url", help="a running server (default: start one in-process on a free port)")
    a("--api-key", help=f"tenant API key for --url (or ${SECRETS['api_key']})")
    a("--metrics-token", help=f"the metrics (or admin) token of --url (or ${SECRETS['metrics_token']})")
    a(
        "--admin-token",
        help="the admin token of --url: each bench tenant gets its own tenant (bench-NAME), weight and key "
        f"through the admin API, so charged service per tenant is measured (or ${SECRETS['admin_token']})",
    )
    a("--out", default="bench-report", help="directory for report.json, report.md and the PNGs")
    a("--workload", nargs="+", metavar="NAME", help=f"workloads (default: all of {', '.join(WORKLOADS)})")
    a("--duration", type=float, help="seconds of traffic per workload")
    a("--rate-scale", type=float, default=1.0, help="multiply every workload's arrival rate")
    a("--sweep-rates", type=float, nargs="+", metavar="RPS", help="offered loads (arrivals/s) of the sweep")
    a("--seed", type=int, default=0)
    a("--no-comparisons", action="store_true", help="skip the engine, policy and gateway comparisons")
    a(
        "--deadlines",
        action="store_true",
        help="instead: tight, mixed deadlines over a slow and a fast model "
        "under X-On-Infeasible reject, fallback and partial (bench/deadlines.py; --duration, --rate-scale, --seed)",
    )
    a("--litellm-bin", help="litellm executable, the gateway peer (else $FAIRSERVE_LITELLM_BIN, PATH)")


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
    """The invocation as a person would type it again: the flags not at their default, secrets as `$VARIABLE`."""
    fresh = argparse.ArgumentParser()
    add_arguments(fresh)
    words = ["fairserve", "bench"]
    for dest, default in vars(fresh.parse_args([])).items():
        value, flag = getattr(args, dest), "--" + dest.replace("_", "-")
        if value == default:
            continue
        if dest in SECRETS:
            words += [flag, f"${SECRETS[dest]}"]
        elif value is True:
            words.append(flag)
        else:
            values = value if isinstance(value, list) else [value]
            words += [flag, *(shlex.quote(f"{v:g}" if isinstance(v, float) else str(v)) for v in values)]
    return " ".join(words)


def options(args: argparse.Namespace) -> BenchOptions:
    """BenchOptions from parsed flags (not yet validated)."""
    given: dict[str, Any] = {
        "workloads": list(dict.fromkeys(args.workload)) if args.workload else None,
        "duration_s": args.duration,
        "sweep_rates": sorted(args.sweep_rates) if args.sweep_rates else None,
    }
    sizes = (QUICK if args.quick else {}) | {k: v for k, v in given.items() if v is not None}
    return BenchOptions(
        url=args.url,
        api_key=args.api_key or os.environ.get(SECRETS["api_key"]),
        metrics_token=args.metrics_token or os.environ.get(SECRETS["metrics_token"], ""),
        admin_token=args.admin_token or os.environ.get(SECRETS["admin_token"], ""),
        quick=args.quick,
        out=Path(args.out),
        seed=args.seed,
        rate_scale=args.rate_scale,
        comparisons=not args.no_comparisons,
        litellm_bin=args.litellm_bin,
        command=retyped(args),
        **sizes,
    )


DEADLINE_RATE = 1.0  # arrivals/s of the deadline workload, before --rate-scale: about what `slow` serves


def bench_command(args: argparse.Namespace) -> int:
    """Run the bench; exit status 2 with a message on bad options."""
    # Imported here: every `fairserve` command builds this parser, and the runs import matplotlib.
    if args.deadlines:
        from bench.deadlines import run_deadlines

        duration = args.duration or (10.0 if args.quick else 20.0)
        rate, rounds = DEADLINE_RATE * args.rate_scale, 1 if args.quick else 2
        paths = run_deadlines(Path(args.out), rate, duration, rounds, args.seed)
    else:
        opts = options(args)
        try:
            opts.validate()
        except ValueError as exc:
            print(f"fairserve bench: {exc}", file=sys.stderr)
            return 2
        try:
            from bench.run import run_bench
        except ModuleNotFoundError as exc:  # the serving install (`pip install .`) has no plotting library
            print(
                f"fairserve bench: {exc.name} is not installed; pip install '.[bench]' adds what the "
                "report needs",
                file=sys.stderr,
            )
            return 2

        paths = run_bench(opts)
    for kind, path in paths.items():
        print(f"{kind}: {path}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.cli`: the same as `fairserve bench`."""
    parser = argparse.ArgumentParser(prog="fairserve bench", description=__doc__)
    add_arguments(parser)
    return bench_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
