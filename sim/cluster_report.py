"""What a cluster run (sim/cluster.py) is reduced to: service gap vs the VTC bound, Jain's index,
throughput; plus the named two-router case that reproduces Dynamo's skewed-ingress finding.

Fairness is measured over the window [warmup_s, duration_s] among the tenants that had requests
queued (somewhere in the cluster) at every sample of the window: the tenants VTC's bound speaks of.
x_k is tenant k's charged service in the window divided by its weight:
- gap = max over samples of (max_k x_k(t) − min_k x_k(t)), against the single-engine bound
  2·max(w_in·L_in, w_out·M)/w_min and the same bound with the cluster's KV capacity N·M;
- Jain's index = (Σx)² / (n·Σx²): 1 when every backlogged tenant got the same weighted service.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.cluster import ClusterConfig, ClusterSim, Sample, TenantSpec
from sim.shared import RouteWeights


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index of `values` (1.0 for an empty or all-zero list: nobody is treated worse)."""
    square_sum = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * square_sum) if square_sum > 0 else 1.0


def window_fairness(samples: Sequence[Sample], weight: dict[str, float]) -> dict[str, Any]:
    """Gap, Jain's index and weighted service over the window, among the tenants backlogged throughout."""
    if len(samples) < 2:
        return {"backlogged": 0, "max_gap": 0.0, "jain": 1.0, "weighted_service": {}}
    backlogged = set.intersection(*(s.waiting for s in samples))
    start = samples[0].service
    gap = 0.0
    for s in samples[1:]:
        x = [(s.service.get(k, 0.0) - start.get(k, 0.0)) / weight[k] for k in backlogged]
        if x:
            gap = max(gap, max(x) - min(x))
    end = samples[-1].service
    served = {k: (end.get(k, 0.0) - start.get(k, 0.0)) / weight[k] for k in sorted(backlogged)}
    return {
        "backlogged": len(backlogged),
        "max_gap": gap,
        "jain": jain_index(list(served.values())),
        "weighted_service": served,
    }


def cluster_scenario(config: ClusterConfig, keep_service: bool = False) -> dict[str, Any]:
    """Run `config` and report fairness, throughput and the simulator's own speed."""
    sim = ClusterSim(config)
    wall = sim.run()
    fairness = window_fairness(sim.samples, sim.weight)
    window = sim.samples
    served = (
        {k: window[-1].service.get(k, 0.0) - window[0].service.get(k, 0.0) for k in sim.weight}
        if len(window) > 1
        else {}
    )
    span = window[-1].t - window[0].t if len(window) > 1 else 0.0
    results = [e.result for e in sim.engines]
    request_iterations = sum(r.request_iterations for r in results)
    bound = config.single_engine_bound()
    report: dict[str, Any] = {
        "engines": config.engines,
        "routers": config.routers,
        "tenants": len(sim.tenants),
        "sharing": config.staleness_s is not None,
        "staleness_ms": None if config.staleness_s is None else config.staleness_s * 1e3,
        "duration_s": config.duration_s,
        "warmup_s": config.warmup_s,
        "load": config.load,
        "backlogged": fairness["backlogged"],
        "max_gap": fairness["max_gap"],
        "bound": bound,
        "gap_over_bound": fairness["max_gap"] / bound,
        "cluster_bound": config.cluster_bound(),
        "jain": fairness["jain"],
        "service_per_s": sum(served.values()) / span if span else 0.0,
        "output_tokens_per_s": sum(r.output_tokens for r in results) / config.duration_s,
        "tokens_per_s": sum(r.batched_tokens for r in results) / config.duration_s,
        "prefix_hit_rate": sim.prefix_hits / sim.routed if sim.routed else 0.0,
        "requests": sim.routed,
        "completed": sum(len(r.completions) for r in results),
        "request_iterations": request_iterations,
        "wall_seconds": wall,
        "request_iterations_per_s": request_iterations / wall if wall else 0.0,
    }
    if keep_service:
        report["service"] = served
    return report


def dynamo_config(sharing: bool, staleness_s: float = 0.0, duration_s: float = 12.0) -> ClusterConfig:
    """Dynamo's skewed ingress (DEP #15187): tenant A (weight 4) enters only through router 0, B (weight 1)
    only through router 1, both backlogged, each router's affinity pinning its tenant to its own engine."""
    tenants = [
        TenantSpec("A", 1.0, 4.0, home_router=0, home_share=1.0),
        TenantSpec("B", 1.0, 1.0, home_router=1, home_share=1.0),
    ]
    return ClusterConfig(
        engines=2,
        routers=2,
        tenant_specs=tenants,
        staleness_s=staleness_s if sharing else None,
        duration_s=duration_s,
        warmup_s=2.0,
        load=3.0,
        seed_affinity=True,
        route=RouteWeights(affinity=1000.0),
        prefix_tokens=0,
    )
