"""`fairserve sim`: run the real scheduler on a virtual clock (essay trace, two-tenant fairness, scale)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.sim import SimulationError
from engine.sim_scenarios import TwoTenantSetup, essay_scenario, scale_scenario, two_tenants_scenario
from fairness import DEFAULT_POLICY, POLICIES

SCENARIOS = ("essay", "two-tenants", "scale")


def register(subparsers: Any) -> None:
    """Add the `sim` command."""
    sim = subparsers.add_parser("sim", help="simulate the scheduler with a virtual clock and a cost model")
    sim.add_argument("--scenario", choices=SCENARIOS, default="essay", help="which workload to simulate")
    sim.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    sim.add_argument("--duration", type=float, default=60.0, help="two-tenants: simulated seconds")
    sim.add_argument("--requests", type=int, default=100_000, help="scale: number of requests")
    sim.add_argument("--tenants", type=int, default=1000, help="scale: number of tenants")
    sim.add_argument("--max-num-seqs", type=int, default=256, help="scale: batch size (seats)")
    sim.add_argument("--policy", choices=list(POLICIES), default=DEFAULT_POLICY, help="scale: fairness policy")
    sim.add_argument("--seed", type=int, default=0, help="scale: workload seed")
    sim.set_defaults(func=run_sim)


def run_sim(args: argparse.Namespace) -> int:
    """Run the chosen scenario and print its report; 2 on bad arguments."""
    try:
        if args.scenario == "essay":
            report = essay_scenario()
            text = _essay_text(report)
        elif args.scenario == "two-tenants":
            if not args.duration > 0:
                raise SimulationError("--duration must be > 0")
            report = two_tenants_scenario(TwoTenantSetup(duration_s=args.duration))
            text = _two_tenants_text(report)
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


def _essay_text(report: dict[str, Any]) -> str:
    lines = ["policy      completion steps (A B C D)  mean flow  occupancy"]
    for name, r in report.items():
        steps = " ".join(str(v) for v in r["completion_steps"].values())
        lines.append(f"{name:<11} {steps:<27} {r['mean_flow_time']:<10.2f} "
                     f"{r['useful_request_steps']}/{r['slot_positions']} = {r['occupancy']:.1%}")
    return "\n".join(lines)


def _two_tenants_text(report: dict[str, Any]) -> str:
    lines = [f"service per tenant over time (w_in=1, w_out=2); VTC bound 2·max(w_in·L_in, w_out·M) = "
             f"{report['bound']:.0f}"]
    for policy in ("fcfs", "vtc"):
        r = report[policy]
        lines.append(f"\n{policy}: max service difference {r['max_service_difference']:.0f}")
        lines.append("     t        X          Y")
        lines += [f"{s['t']:6.1f} {s['X']:10.0f} {s['Y']:10.0f}" for s in r["service_over_time"]]
    return "\n".join(lines)


def _scale_text(report: dict[str, Any]) -> str:
    return (f"{report['requests']} requests, {report['tenants']} tenants, batch {report['max_num_seqs']}, "
            f"{report['policy']}: {report['iterations']} iterations, {report['request_iterations']} "
            f"request-iterations in {report['wall_seconds']:.1f} s wall "
            f"= {report['request_iterations_per_s']:,.0f} request-iterations/s "
            f"({report['seconds_per_iteration'] * 1e3:.2f} ms per iteration)")
