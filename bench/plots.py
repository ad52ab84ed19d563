"""PNG figures of a bench report (matplotlib, Agg): timelines, latency, the knee, per-tenant service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from fairness import FairnessConfig  # noqa: E402


def save(fig: Any, path: Path, rect: tuple[float, ...] = (0, 0, 1, 1), dpi: int = 100) -> Path:
    """Lay out, write and close `fig`."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def timeline(runs: list[dict[str, Any]], path: Path) -> Path:
    """Batch size, iteration time and KV occupancy over time, one row per workload."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.4 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        tl = run["timeline"]
        t, used, blocks = tl["t"], tl["kv_blocks_used"], tl["kv_blocks_total"]
        ax.plot(t, tl["batch_size"], color="tab:blue", label="batch size (seqs)")
        occ = [u / n * 100 if n else 0.0 for u, n in zip(used, blocks, strict=True)]
        ax.plot(t, occ, color="tab:green", label="KV occupancy (%)")
        ax.set_ylabel(f"{run['workload']}\nseqs | KV %")
        ax2 = ax.twinx()
        ms = [s * 1e3 for s in tl["iteration_seconds"]]
        ax2.plot(t, ms, color="tab:red", alpha=0.7, label="iteration (ms)")
        ax2.set_ylabel("iteration (ms)", color="tab:red")
        if ax is axes[0, 0]:
            lines = ax.get_lines() + ax2.get_lines()
            ax.legend(lines, [str(ln.get_label()) for ln in lines], loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("time into the run (s)")
    fig.suptitle("Engine over time: batch size (seqs), KV occupancy (%), iteration time (ms), from /metrics")
    return save(fig, path)


def latency(runs: list[dict[str, Any]], path: Path) -> Path:
    """p50/p95/p99 TTFT and completion latency per workload."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [r["workload"] for r in runs]
    for ax, metric, title in ((axes[0], "ttft", "TTFT"), (axes[1], "e2e", "completion latency")):
        for i, q in enumerate(("p50", "p95", "p99")):
            vals = [r["latency_s"][metric][q] or 0.0 for r in runs]
            ax.bar([x + (i - 1) * 0.27 for x in range(len(runs))], vals, width=0.27, label=q)
        for x, r in enumerate(runs):  # the SLO each workload is held to
            slo = r["slo"]["ttft_s" if metric == "ttft" else "e2e_s"]
            ax.hlines(slo, x - 0.45, x + 0.45, colors="black", linestyles="dashed")
        ax.set_xticks(range(len(runs)), names)
        ax.set_title(f"{title} p50/p95/p99 (s; dashed: SLO)")
        ax.set_ylabel("seconds")
        ax.legend(fontsize=8)
    return save(fig, path)


def knee(sweep: list[dict[str, Any]], capacity: dict[str, Any] | None, path: Path) -> Path:
    """Throughput and SLO goodput against offered load, with the useful capacity point marked."""
    fig, ax = plt.subplots(figsize=(7, 4))
    offered, achieved = [p["offered"]["requests_per_s"] for p in sweep], [p["achieved"] for p in sweep]
    ax.plot(offered, [a["requests_per_s"] for a in achieved], "o-", label="throughput (req/s)")
    ax.plot(offered, [a["goodput_requests_per_s"] for a in achieved], "s-", label="SLO goodput (req/s)")
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
    p99 = [p["latency_s"]["ttft"]["p99"] or 0.0 for p in sweep]
    ax2.plot(offered, p99, "^--", color="tab:purple", alpha=0.6)
    ax2.set_ylabel("p99 TTFT (s)", color="tab:purple")
    ax.set_xlabel("offered load (requests/s, open loop)")
    ax.set_ylabel("achieved (requests/s)")
    ax.set_title(f"Load sweep through the knee: {sweep[0]['workload'] if sweep else ''}")
    ax.legend(fontsize=8, loc="upper left")
    return save(fig, path)


BACKLOGGED = 0.5  # a tenant with requests waiting in at least this share of the samples is marked backlogged


def charge_weights(engine: dict[str, Any] | str) -> tuple[float, float, bool]:
    """(w_in, w_out, assumed): the engine's charge per prompt and output token; the defaults for a remote server."""
    if isinstance(engine, dict) and "fairness" in engine:
        return float(engine["fairness"]["w_in"]), float(engine["fairness"]["w_out"]), False
    default = FairnessConfig()
    return default.w_in, default.w_out, True


def _tenant_bars(ax: Any, run: dict[str, Any], w_in: float, w_out: float) -> None:
    """One workload's panel: offered and charged service shares per tenant, and the weight share mark."""
    ts = run["tenants"]
    offered = {
        n: w_in * t["offered_prompt_tokens"] + w_out * t["offered_output_tokens"] for n, t in ts.items()
    }
    offered_total = sum(offered.values()) or 1.0
    wsum = sum(t["weight"] for t in ts.values()) or 1.0
    xs = list(range(len(ts)))
    ax.bar([x - 0.2 for x in xs], [offered[n] / offered_total for n in ts], 0.4, color="tab:orange")
    ax.bar([x + 0.2 for x in xs], [t["service_share"] or 0.0 for t in ts.values()], 0.4, color="tab:blue")
    labels = []
    for x, (name, t) in zip(xs, ts.items(), strict=True):
        frac = t["backlogged_fraction"]
        bound = frac is not None and frac >= BACKLOGGED
        style, width = ("solid", 2.2) if bound else ("dotted", 1.2)
        ax.hlines(t["weight"] / wsum, x - 0.45, x + 0.45, colors="black", linestyles=style, linewidth=width)
        labels.append(f"{name}\nbacklogged {'n/a' if frac is None else f'{frac:.0%}'}")
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_title(run["workload"])


def tenants(runs: list[dict[str, Any]], path: Path, engine: dict[str, Any] | str) -> Path:
    """Per tenant: its share of the offered service beside its share of the charged service, in one unit.

    Offered service is the plan's tokens at the engine's charge weights (w_in per prompt token, w_out per
    output token), so it compares like with like with what the server charged. The weight share is the
    target only while the tenant is backlogged (has requests waiting); a solid mark says it was, most of the run.
    """
    w_in, w_out, assumed = charge_weights(engine)
    fig, axes = plt.subplots(1, len(runs), figsize=(max(3.8 * len(runs), 10.0), 4.6), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        _tenant_bars(ax, run, w_in, w_out)
    axes[0, 0].set_ylabel("share of the workload's service (0-1)")
    target = f"weight share: the target (backlogged >= {BACKLOGGED:.0%} of samples)"
    handles = [
        Patch(color="tab:orange", label="offered: planned tokens at the charge weights"),
        Patch(color="tab:blue", label="charged by the server (cached prompt tokens at w_cached)"),
        Line2D([], [], color="black", linewidth=2.2, label=target),
        Line2D([], [], color="black", linewidth=1.2, linestyle="dotted", label="weight share, not binding"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    unit = f"service = {w_in:g} x prompt + {w_out:g} x output tokens"
    assumed_note = " (default weights assumed)" if assumed else ""
    fig.suptitle(f"Per tenant: share of offered vs charged service\nboth in {unit}{assumed_note}")
    return save(fig, path, rect=(0, 0.12, 1, 1))
