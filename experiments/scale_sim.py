"""Scale on paper: the cluster simulator swept over engines and counter staleness (docs/scale.md).

    .venv/bin/python -m experiments.scale_sim [--engines 8 16 32 64] [--staleness-engines 16] [--out DIR]

Runs `sim.cluster` (N real schedulers behind 4 routers, 1,000 Zipf tenants, skewed ingress):
(1) every N with per-engine counters only and with counters shared every 100 ms; (2) at one N, the
staleness sweep. Prints the markdown tables of docs/scale.md and writes the two figures
(docs/img/scale_engines.png, docs/img/scale_staleness.png by default). Each run reports its own wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from gateway.cli.sim import cluster_text  # noqa: E402
from sim.cluster import ClusterConfig  # noqa: E402
from sim.cluster_report import cluster_scenario  # noqa: E402

STALENESS_MS: tuple[float | None, ...] = (None, 0.0, 10.0, 100.0, 1000.0, 3000.0, 10000.0)


def run(
    engines: int, staleness_ms: float | None, tenants: int, duration: float, warmup: float
) -> dict[str, Any]:
    """One cluster run, printed as it finishes (a sweep takes minutes)."""
    config = ClusterConfig(
        engines=engines,
        tenants=tenants,
        duration_s=duration,
        warmup_s=warmup,
        staleness_s=None if staleness_ms is None else staleness_ms / 1e3,
    )
    report = cluster_scenario(config)
    print(cluster_text([report]).splitlines()[-1], file=sys.stderr, flush=True)
    return report


def slip(sweep: list[dict[str, Any]]) -> dict[str, Any]:
    """The smallest staleness at which fairness slips: Jain 0.02 below exact sharing's, or the gap over the bound."""
    exact = next(r for r in sweep if r["staleness_ms"] == 0.0)
    for r in sorted((r for r in sweep if r["staleness_ms"] is not None), key=lambda r: r["staleness_ms"]):
        if r["jain"] < exact["jain"] - 0.02 or r["gap_over_bound"] > 1.0:
            return {
                "staleness_ms": r["staleness_ms"],
                "jain": r["jain"],
                "gap_over_bound": r["gap_over_bound"],
            }
    return {"staleness_ms": None}


def plot_engines(rows: list[dict[str, Any]], path: Path) -> None:
    """Throughput and Jain's index against N, per-engine vs shared counters."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for sharing, label, color in (
        (False, "per-engine counters", "tab:red"),
        (True, "shared, 100 ms", "tab:blue"),
    ):
        rs = sorted((r for r in rows if r["sharing"] == sharing), key=lambda r: r["engines"])
        n = [r["engines"] for r in rs]
        left.plot(n, [r["tokens_per_s"] / 1e3 for r in rs], marker="o", color=color, label=label)
        right.plot(n, [r["jain"] for r in rs], marker="o", color=color, label=label)
    left.set(xlabel="engines", ylabel="k tokens / virtual s", title="throughput", xscale="log", yscale="log")
    right.set(
        xlabel="engines",
        ylabel="Jain's index (backlogged tenants)",
        title="fairness",
        xscale="log",
        ylim=(0, 1.05),
    )
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("1,000 tenants, 4 routers, skewed ingress (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_staleness(sweep: list[dict[str, Any]], path: Path) -> None:
    """Jain's index and gap ÷ bound against the counter publication period."""
    rs = sorted((r for r in sweep if r["staleness_ms"] is not None), key=lambda r: r["staleness_ms"])
    alone = next((r for r in sweep if r["staleness_ms"] is None), None)
    x = [max(r["staleness_ms"], 1.0) for r in rs]  # S=0 drawn at 1 ms on the log axis
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.plot(x, [r["jain"] for r in rs], marker="o", label="shared counters")
    right.plot(x, [r["gap_over_bound"] for r in rs], marker="o", label="shared counters")
    if alone is not None:
        left.axhline(alone["jain"], color="tab:red", linestyle="--", label="per-engine counters")
        right.axhline(alone["gap_over_bound"], color="tab:red", linestyle="--", label="per-engine counters")
    left.set(
        xlabel="staleness S (ms, log; 0 drawn at 1)", ylabel="Jain's index", xscale="log", ylim=(0, 1.05)
    )
    right.set(
        xlabel="staleness S (ms, log; 0 drawn at 1)", ylabel="max weighted gap ÷ VTC bound", xscale="log"
    )
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{rs[0]['engines']} engines, 1,000 tenants: how stale may shared counters be?")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--staleness-engines", type=int, default=16, help="N of the staleness sweep")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=Path("docs/img"), help="where the two figures go")
    parser.add_argument("--json", type=Path, default=None, help="also write every run's report here")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [run(n, s, args.tenants, args.duration, args.warmup) for n in args.engines for s in (None, 100.0)]
    sweep = [r for r in rows if r["engines"] == args.staleness_engines]
    sweep += [
        run(args.staleness_engines, s, args.tenants, args.duration, args.warmup)
        for s in STALENESS_MS
        if s not in {r["staleness_ms"] for r in sweep}
    ]
    plot_engines(rows, args.out / "scale_engines.png")
    plot_staleness(sweep, args.out / "scale_staleness.png")
    result = {"engines": rows, "staleness": sweep, "slip": slip(sweep)}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    print("## engines\n\n" + cluster_text(rows))
    print(
        "\n## staleness\n\n"
        + cluster_text(sorted(sweep, key=lambda r: -1 if r["staleness_ms"] is None else r["staleness_ms"]))
    )
    print(f"\nslip: {json.dumps(result['slip'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
