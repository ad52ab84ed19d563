"""PNG figures of a bench report (matplotlib, Agg): timelines, latency, the knee, per-tenant service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first


def timeline(runs: list[dict[str, Any]], path: Path) -> Path:
    """Batch size, iteration time and KV occupancy over time, one row per workload."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.4 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        tl = run["timeline"]
        t = tl["t"]
        ax.plot(t, tl["batch_size"], color="tab:blue", label="batch size (seqs)")
        occ = [
            u / tot * 100 if tot else 0.0
            for u, tot in zip(tl["kv_blocks_used"], tl["kv_blocks_total"], strict=True)
        ]
        ax.plot(t, occ, color="tab:green", label="KV occupancy (%)")
        ax.set_ylabel(run["workload"])
        ax2 = ax.twinx()
        ax2.plot(
            t, [s * 1e3 for s in tl["iteration_seconds"]], color="tab:red", alpha=0.7, label="iteration (ms)"
        )
        ax2.set_ylabel("iteration ms", color="tab:red")
        if ax is axes[0, 0]:
            lines = ax.get_lines() + ax2.get_lines()
            ax.legend(lines, [str(ln.get_label()) for ln in lines], loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("seconds into the run")
    fig.suptitle("Engine over time (sampled from /metrics)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def latency(runs: list[dict[str, Any]], path: Path) -> Path:
    """p50/p95/p99 TTFT and completion latency per workload."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [r["workload"] for r in runs]
    for ax, metric, title in ((axes[0], "ttft", "TTFT (s)"), (axes[1], "e2e", "completion latency (s)")):
        for i, q in enumerate(("p50", "p95", "p99")):
            vals = [r["latency_s"][metric][q] or 0.0 for r in runs]
            ax.bar([x + (i - 1) * 0.27 for x in range(len(runs))], vals, width=0.27, label=q)
        for x, r in enumerate(runs):  # the SLO each workload is held to
            slo = r["slo"]["ttft_s" if metric == "ttft" else "e2e_s"]
            ax.hlines(slo, x - 0.45, x + 0.45, colors="black", linestyles="dashed")
        ax.set_xticks(range(len(runs)), names)
        ax.set_title(title + " (dashed: SLO)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def knee(sweep: list[dict[str, Any]], capacity: dict[str, Any] | None, path: Path) -> Path:
    """Throughput and SLO goodput against offered load, with the useful capacity point marked."""
    fig, ax = plt.subplots(figsize=(7, 4))
    offered = [p["offered"]["requests_per_s"] for p in sweep]
    ax.plot(offered, [p["achieved"]["requests_per_s"] for p in sweep], "o-", label="throughput (req/s)")
    ax.plot(
        offered, [p["achieved"]["goodput_requests_per_s"] for p in sweep], "s-", label="SLO goodput (req/s)"
    )
    lim = max(offered or [1.0])
    ax.plot([0, lim], [0, lim], color="grey", linestyle=":", label="offered = achieved")
    if capacity is not None:
        ax.axvline(
            capacity["offered_requests_per_s"],
            color="tab:red",
            linestyle="--",
            label=f"useful capacity ~{capacity['offered_requests_per_s']:.1f} req/s",
        )
    ax2 = ax.twinx()
    ax2.plot(
        offered, [p["latency_s"]["ttft"]["p99"] or 0.0 for p in sweep], "^--", color="tab:purple", alpha=0.6
    )
    ax2.set_ylabel("p99 TTFT (s)", color="tab:purple")
    ax.set_xlabel("offered load (req/s, open loop)")
    ax.set_ylabel("req/s")
    ax.set_title(f"Load sweep through the knee: {sweep[0]['workload'] if sweep else ''}")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def tenants(runs: list[dict[str, Any]], path: Path) -> Path:
    """Each tenant's share of charged service next to its share of offered load and of weight, per workload."""
    fig, axes = plt.subplots(1, len(runs), figsize=(3.2 * len(runs), 3.4), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        ts = run["tenants"]
        names = list(ts)
        wsum = sum(t["weight"] for t in ts.values()) or 1.0
        xs = range(len(names))
        ax.bar(
            [x - 0.27 for x in xs],
            [t["service_share"] or 0.0 for t in ts.values()],
            0.27,
            label="charged service share",
        )
        ax.bar(list(xs), [t["share_of_offered"] for t in ts.values()], 0.27, label="share of offered load")
        ax.bar(
            [x + 0.27 for x in xs],
            [t["weight"] / wsum for t in ts.values()],
            0.27,
            label="weight share (binds when backlogged)",
        )
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_title(run["workload"])
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Per-tenant charged service (from the server) vs offered load and weight")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
