"""Co-located against disaggregated pools of 4 simulated engines on the four workloads (docs/scale.md).

    .venv/bin/python -m experiments.disagg_sim [--duration 5] [--out docs/img/disagg_goodput.png]

For each workload of bench/workloads.py (its prompt and output lengths, tenants, arrival shapes and
fan-out; every fan-out attempt runs to its end) and each offered rate of a grid, one run per pool
layout: 4 co-located engines, and 1/2/3 prefill engines with the rest decoding (sim/disagg.py,
KV over a 10 GB/s link). SLO attainment is read under two targets from the same runs: a tight TPOT
(TTFT 0.5 s, TPOT 20 ms, five iteration floors of the cost model) and a loose one (TTFT 0.5 s, TPOT
100 ms). Goodput is DistServe's: the highest rate of the grid at which >= 90% of requests meet both.
Prints the markdown tables; writes the attainment curves under the tight target. Then the link's cost
on retrieval: 2P2D at 1, 10 and 100 GB/s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from bench.workloads import WORKLOADS, plan  # noqa: E402
from sim.disagg import Link, Pool, PoolResult  # noqa: E402
from sim.simulator import SimConfig, SimRequest  # noqa: E402

ENGINES = 4
LAYOUTS = {"co-located": 0, "1P3D": 1, "2P2D": 2, "3P1D": 3}
# Offered arrivals/s per workload: doubling from well under the pool's capacity to well over it.
RATES = {
    name: tuple(round(base * 2 ** (k / 2)) for k in range(9))
    for name, base in (("chat", 200), ("mixed", 100), ("retrieval", 25), ("agent", 50))
}
SLOS = {"tight": (0.5, 0.020), "loose": (0.5, 0.100)}  # (TTFT s, TPOT s)
NAMES = ("chat", "mixed", "retrieval", "agent")


def requests(name: str, rate: float, duration: float) -> list[SimRequest]:
    """The workload's plan as simulated requests (one per fan-out attempt)."""
    return [
        SimRequest(f"r{i}.{k}", p.tenant, p.at, len(p.prompt) + 1, m)
        for i, p in enumerate(plan(WORKLOADS[name], rate, duration))
        for k, m in enumerate(p.max_tokens)
    ]


def goodput(curve: dict[float, float]) -> float:
    """Highest rate whose attainment is >= 90% (0 when none)."""
    return max((r for r, a in curve.items() if a >= 0.9), default=0.0)


def sweep(duration: float) -> dict[str, dict[str, dict[str, dict[float, float]]]]:
    """attainment[slo][workload][layout][rate]."""
    out: dict[str, dict[str, dict[str, dict[float, float]]]] = {s: {} for s in SLOS}
    for name in NAMES:
        for rate in RATES[name]:
            work = requests(name, rate, duration)
            for layout, prefill in LAYOUTS.items():
                t0 = time.perf_counter()
                result = Pool(ENGINES, prefill, SimConfig()).run(work)
                for slo, (ttft, tpot) in SLOS.items():
                    out[slo].setdefault(name, {}).setdefault(layout, {})[rate] = result.attainment(ttft, tpot)
                print(
                    f"{name} {rate}/s {layout}: tight {out['tight'][name][layout][rate]:.2f} "
                    f"loose {out['loose'][name][layout][rate]:.2f} ({time.perf_counter() - t0:.1f} s)",
                    flush=True,
                )
    return out


def table(att: dict[str, dict[str, dict[float, float]]], slo: str) -> str:
    ttft, tpot = SLOS[slo]
    lines = [
        f"SLO TTFT <= {ttft:g} s, TPOT <= {tpot * 1e3:g} ms: goodput (req/s at >= 90% attainment)",
        "",
        "| workload | " + " | ".join(LAYOUTS) + " | best disaggregated / co-located |",
        "|---|" + "---:|" * (len(LAYOUTS) + 1),
    ]
    for name in NAMES:
        g = {layout: goodput(att[name][layout]) for layout in LAYOUTS}
        best = max(g[k] for k in LAYOUTS if k != "co-located")
        ratio = f"{best / g['co-located']:.2f}" if g["co-located"] else ("inf" if best else "-")
        lines.append(f"| {name} | " + " | ".join(f"{g[k]:g}" for k in LAYOUTS) + f" | {ratio} |")
    return "\n".join(lines)


def plot(att: dict[str, dict[str, dict[float, float]]], path: Path) -> None:
    fig, axes = plt.subplots(1, len(NAMES), figsize=(16, 3.6), sharey=True)
    for ax, name in zip(axes, NAMES, strict=True):
        for layout in LAYOUTS:
            curve = att[name][layout]
            ax.plot(list(curve), list(curve.values()), marker="o", label=layout)
        ax.axhline(0.9, color="grey", linestyle=":")
        ax.set_title(name)
        ax.set_xlabel("offered requests/s")
    axes[0].set_ylabel("SLO attainment (TTFT 0.5 s, TPOT 20 ms)")
    axes[-1].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def link_cost(duration: float) -> str:
    """Retrieval at 100 req/s, 2P2D, over links of three speeds: what the transfer costs."""
    lines = [
        "| link | transfer p50 (ms) | TPOT p50 (ms) | TPOT p99 (ms) | tight attainment |",
        "|---|---:|---:|---:|---:|",
    ]
    work = requests("retrieval", 100, duration)
    for gbps in (1, 10, 100):
        result: PoolResult = Pool(ENGINES, 2, SimConfig(), Link(gbps * 1e9)).run(work)
        transfers = [s.transfer_s for s in result.served.values()]
        tpots = sorted(s.tpot for s in result.served.values() if s.tpot is not None)
        lines.append(
            f"| {gbps} GB/s | {statistics.median(transfers) * 1e3:.2f} | {statistics.median(tpots) * 1e3:.2f} "
            f"| {tpots[int(0.99 * (len(tpots) - 1))] * 1e3:.2f} | {result.attainment(*SLOS['tight']):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per run")
    parser.add_argument("--out", type=Path, default=Path("docs/img/disagg_goodput.png"))
    args = parser.parse_args()
    att = sweep(args.duration)
    for slo in SLOS:
        print("\n" + table(att[slo], slo))
    plot(att["tight"], args.out)
    print("\n" + link_cost(args.duration))


if __name__ == "__main__":
    main()
