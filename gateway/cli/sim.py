"""`fairserve sim`: run the real scheduler on a virtual clock (essay trace, two-tenant fairness, scale, and a
cluster of engines behind routers)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.core.step_cost import StepCost
from fairness import DEFAULT_POLICY, POLICIES
from sim.cluster import ClusterConfig
from sim.cluster_report import cluster_scenario
from sim.scenarios import TwoTenantSetup, essay_scenario, scale_scenario, two_tenants_scenario
from sim.simulator import SimulationError
from sim.upstream import upstream_scenario

SCENARIOS = ("essay", "two-tenants", "scale", "cluster", "upstream")


def register(subparsers: Any) -> None:
    """Add the `sim` command."""
    sim = subparsers.add_parser("sim", help="simulate the scheduler with a virtual clock and a cost model")
    sim.add_argument("--scenario", choices=SCENARIOS, default="essay", help="which workload to simulate")
    sim.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    sim.add_argument(
        "--duration",
        type=float,
        default=None,
        help="simulated seconds (two-tenants: default 60; cluster: default 15)",
    )
    sim.add_argument(
        "--step-cost-context",
        type=float,
        default=0.0,
        help="two-tenants: the step cost model's per-position attention coefficient (engine/core/step_cost.py)",
    )
    sim.add_argument(
        "--step-cost-sequence",
        type=float,
        default=0.0,
        help="two-tenants: the step cost model's per-sequence constant, in new tokens",
    )
    sim.add_argument("--requests", type=int, default=100_000, help="scale: number of requests")
    sim.add_argument("--tenants", type=int, default=1000, help="scale, cluster: number of tenants")
    sim.add_argument("--max-num-seqs", type=int, default=256, help="scale: batch size (seats)")
    sim.add_argument(
        "--policy", choices=list(POLICIES), default=DEFAULT_POLICY, help="scale: fairness policy"
    )
    sim.add_argument("--seed", type=int, default=0, help="scale: workload seed")
    sim.add_argument("--engines", type=int, default=8, help="cluster: number of engines")
    sim.add_argument("--routers", type=int, default=4, help="cluster: number of routers (skewed ingress)")
    sim.add_argument(
        "--staleness-ms",
        default="100",
        help="cluster: counter publication period in virtual ms (0 = exact), or 'none' for no sharing",
    )
    sim.add_argument(
        "--warmup", type=float, default=5.0, help="cluster: seconds before the measurement window"
    )
    sim.add_argument("--load", type=float, default=3.0, help="cluster: offered work / estimated capacity")
    sim.add_argument(
        "--windows",
        default="1,4,16,64",
        help="upstream: dispatch windows to compare (requests in flight to a request-serving engine)",
    )
    sim.set_defaults(func=run_sim)


def run_sim(args: argparse.Namespace) -> int:
    """Run the chosen scenario and print its report; 2 on bad arguments."""
    try:
        if args.scenario == "essay":
            report = essay_scenario()
            text = _essay_text(report)
        elif args.scenario == "two-tenants":
            duration = 60.0 if args.duration is None else args.duration
            if not duration > 0:
                raise SimulationError("--duration must be > 0")
            try:
                step_cost = StepCost(args.step_cost_context, args.step_cost_sequence)
            except ValueError as exc:
                raise SimulationError(str(exc)) from exc
            report = two_tenants_scenario(TwoTenantSetup(duration_s=duration, step_cost=step_cost))
            text = _two_tenants_text(report)
        elif args.scenario == "cluster":
            report = cluster_scenario(_cluster_config(args))
            text = cluster_text([report])
        elif args.scenario == "upstream":
            report = upstream_scenario(_windows(args.windows))
            text = upstream_text(report)
        else:
            if args.requests < 1 or args.tenants < 1 or args.max_num_seqs < 1:
                raise SimulationError("--requests, --tenants and --max-num-seqs must be >= 1")
            report = scale_scenario(args.requests, args.tenants, args.max_num_seqs, args.policy, args.seed)
            text = _scale_text(report)
    except SimulationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report) if args.json else text)
    return 0


def _cluster_config(args: argparse.Namespace) -> ClusterConfig:
    if args.staleness_ms.strip().lower() == "none":
        staleness: float | None = None
    else:
        try:
            staleness = float(args.staleness_ms) / 1e3
        except ValueError:
            raise SimulationError("--staleness-ms must be a number of milliseconds or 'none'") from None
    config = ClusterConfig(
        engines=args.engines,
        routers=args.routers,
        tenants=args.tenants,
        staleness_s=staleness,
        duration_s=15.0 if args.duration is None else args.duration,
        warmup_s=args.warmup,
        load=args.load,
        seed=args.seed,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise SimulationError(f"--{str(exc).replace('_s ', ' ').replace('_', '-')}") from None
    return config


def _windows(text: str) -> tuple[int, ...]:
    try:
        windows = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise SimulationError("--windows must be comma-separated integers") from None
    if not windows or min(windows) < 1:
        raise SimulationError("--windows must be integers >= 1")
    return windows


def upstream_text(report: dict[str, Any]) -> str:
    """One table row per (window, policy): A's token share (weights 3:1), the largest weighted-service
    difference while both tenants waited at the gateway, and the bound max(2, W)·U / w_min."""
    lines = [
        "| window | policy | A's token share (goal 0.75) | max weighted difference | bound | engine queue |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["windows"]:
        lines.append(
            f"| {r['window']} | {r['policy']} | {r['share_A']:.3f} | {r['max_difference']:,.0f} | "
            f"{r['bound']:,.0f} | {r['max_engine_queue']} |"
        )
    return "\n".join(lines)


def cluster_text(reports: list[dict[str, Any]]) -> str:
    """One table row per cluster run (also the table of docs/scale.md)."""
    lines = [
        "| engines | sharing (staleness) | backlogged tenants | max weighted gap | gap ÷ bound | Jain | "
        "tokens/s (virtual) | prefix hits | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        sharing = "none" if r["staleness_ms"] is None else f"{r['staleness_ms']:g} ms"
        lines.append(
            f"| {r['engines']} | {sharing} | {r['backlogged']} | {r['max_gap']:,.0f} | "
            f"{r['gap_over_bound']:.3f} | {r['jain']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{r['prefix_hit_rate']:.0%} | {r['wall_seconds']:.1f} |"
        )
    return "\n".join(lines)


def _essay_text(report: dict[str, Any]) -> str:
    lines = ["policy      completion steps (A B C D)  mean flow  occupancy"]
    for name, r in report.items():
        steps = " ".join(str(v) for v in r["completion_steps"].values())
        lines.append(
            f"{name:<11} {steps:<27} {r['mean_flow_time']:<10.2f} "
            f"{r['useful_request_steps']}/{r['slot_positions']} = {r['occupancy']:.1%}"
        )
    return "\n".join(lines)


def _two_tenants_text(report: dict[str, Any]) -> str:
    lines = [
        f"service per tenant over time (w_in=1, w_out=2); VTC bound 2·max(w_in·L_in, w_out·M) = "
        f"{report['bound']:.0f}"
    ]
    for policy in ("fcfs", "vtc"):
        r = report[policy]
        lines.append(f"\n{policy}: max service difference {r['max_service_difference']:.0f}")
        lines.append("     t        X          Y")
        lines += [f"{s['t']:6.1f} {s['X']:10.0f} {s['Y']:10.0f}" for s in r["service_over_time"]]
    return "\n".join(lines)


def _scale_text(report: dict[str, Any]) -> str:
    return (
        f"{report['requests']} requests, {report['tenants']} tenants, batch {report['max_num_seqs']}, "
        f"{report['policy']}: {report['iterations']} iterations, {report['request_iterations']} "
        f"request-iterations in {report['wall_seconds']:.1f} s wall "
        f"= {report['request_iterations_per_s']:,.0f} request-iterations/s "
        f"({report['seconds_per_iteration'] * 1e3:.2f} ms per iteration)"
    )
