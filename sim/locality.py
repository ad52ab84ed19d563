"""Simulator scenario for `vtc-locality` (fairness/locality.py): few prompt families, many tenants.

    .venv/bin/python -m sim.locality

Every tenant stays backlogged with requests whose prompt is one of a few long shared prefixes (a
family: a public prefix, or a prompt shared in one cache group) plus a short private suffix. The KV
cache holds only some families at once. Plain VTC admits the least-served tenant's head whatever its
family; vtc-locality admits, among tenants within Δ of the least served, the head whose prefix is
cached. Reported for both, on the same workload: completed requests per simulated second, the hit
rate, and the largest service difference between tenants while all are backlogged, against the bound
(VTC's 2·max(w_in·L_in, w_out·M), plus Δ for vtc-locality).

Prompts are real token lists here (the base simulator's are placeholders), so prefix hits are the
pool's own: `FamilySimulator.make_request` builds them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from engine.core.request import Request
from fairness.config import FairnessConfig
from sim.simulator import SimConfig, SimRequest, Simulator


@dataclass
class LocalitySetup:
    """The geometry of the prefix-heavy workload."""

    tenants: int = 16
    families: int = 12
    family_tokens: int = 1024
    suffix_tokens: int = 32
    output_tokens: int = 16
    requests_per_tenant: int = 400  # more than the run can serve: everyone stays backlogged
    duration_s: float = 60.0
    num_blocks: int = 512
    block_size: int = 16
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    locality_slack: float = 2048.0
    seed: int = 0

    def config(self, policy: str) -> SimConfig:
        """One simulated engine with prefix caching on (w_in=1, w_out=2, one class)."""
        return SimConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            enable_prefix_caching=True,
            fairness=FairnessConfig(
                policy=policy, priority_classes=False, locality_slack=self.locality_slack
            ),
        )

    def workload(self) -> list[SimRequest]:
        """Each tenant's requests, all queued at t=0, each of a random family (seeded)."""
        rng = random.Random(self.seed)
        prompt = self.family_tokens + self.suffix_tokens
        return [
            SimRequest(f"t{t}-{i}-f{rng.randrange(self.families)}", f"t{t}", 0.0, prompt, self.output_tokens)
            for i in range(self.requests_per_tenant)
            for t in range(self.tenants)
        ]

    def vtc_bound(self) -> float:
        """2·max(w_in·L_in, w_out·M) with M the KV cache's tokens (as sim/scenarios.py states it)."""
        return 2 * max(
            1.0 * (self.family_tokens + self.suffix_tokens), 2.0 * self.num_blocks * self.block_size
        )


class FamilySimulator(Simulator):
    """A simulator whose prompts are a family's shared tokens then the request's own: "<name>-f<family>"."""

    def __init__(self, config: SimConfig, setup: LocalitySetup) -> None:
        super().__init__(config)
        self.setup = setup
        self._serial = 0

    def make_request(self, spec: SimRequest) -> Request:
        """`spec`'s request with a family prefix (one cache group for all tenants) and a unique suffix."""
        request = super().make_request(spec)
        family = int(spec.name.rsplit("-f", 1)[1])
        self._serial += 1
        base = 1_000_000 * (family + 1)
        suffix = [2 + (self._serial * 7919 + j) % 999_983 for j in range(self.setup.suffix_tokens)]
        request.prompt_token_ids = [base + j for j in range(self.setup.family_tokens)] + suffix
        request.meta.cache_group = "shared"
        return request


def locality_scenario(setup: LocalitySetup | None = None) -> dict[str, Any]:
    """vtc and vtc-locality on the same prefix-heavy workload: throughput, hits and the service spread."""
    setup = setup or LocalitySetup()
    report: dict[str, Any] = {"vtc_bound": setup.vtc_bound(), "slack": setup.locality_slack}
    for policy in ("vtc", "vtc-locality"):
        sim = FamilySimulator(setup.config(policy), setup)
        cached = 0

        def count_hits(s: Simulator, out: Any) -> None:
            nonlocal cached
            cached += out.cached_tokens

        result = sim.run(
            setup.workload(), until=setup.duration_s, track_service=True, on_iteration=count_hits
        )
        done = len(result.completions)
        report[policy] = {
            "requests_per_s": done / result.clock,
            "completed": done,
            "cached_share": cached / max(1, cached + result.batched_tokens),
            "max_service_difference": result.max_service_difference,
        }
    report["throughput_ratio"] = report["vtc-locality"]["requests_per_s"] / report["vtc"]["requests_per_s"]
    return report


if __name__ == "__main__":
    print(json.dumps(locality_scenario(), indent=2))
