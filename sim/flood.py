"""A short request beside another tenant's flood of long prompts, counted in engine steps (issue 45).

Tenant A keeps one 100-token request (`max_tokens` 1) in flight; tenant B keeps `b_loops` 2,047-token
requests (`max_tokens` 1) in flight: closed loops, as clients over HTTP, on the real Scheduler and policy
with the engine's default budgets (64 seats, a 512-token step budget). What is counted is A's time to first
token in steps: the iterations from the one after A's request arrived to the one that sampled its token
(1 = the very next step). A step's duration depends on the hardware; how many steps A waits depends only on
the scheduler, which is what a fair step budget must bound (docs/fairness.md, "The step's budget").

    .venv/bin/python -m sim.flood            # A alone, beside 1 B loop, beside 62 B loops
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig
from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from sim.simulator import SimConfig, SimRequest, Simulator


def _engine_default(name: str) -> int:
    """A served engine's default, from the one settings tree (engine/config.py)."""
    return int(EngineConfig.model_fields[name].default)


@dataclass
class FloodSetup:
    """The engine's default budgets and the issue's request shapes."""

    max_num_seqs: int = field(default_factory=lambda: _engine_default("max_num_seqs"))
    max_num_batched_tokens: int = field(default_factory=lambda: _engine_default("max_num_batched_tokens"))
    num_blocks: int = 16384  # 62 prompts of 2,047 tokens fit: the flood is a compute flood, not a memory one
    a_prompt: int = 100
    b_prompt: int = 2047
    iterations: int = 2000


def run(b_loops: int, setup: FloodSetup | None = None) -> dict[str, Any]:
    """A's time to first token in steps (every A request that got its token) beside `b_loops` B loops."""
    setup = setup or FloodSetup()
    sim = Simulator(
        SimConfig(
            max_num_seqs=setup.max_num_seqs,
            max_num_batched_tokens=setup.max_num_batched_tokens,
            num_blocks=setup.num_blocks,
        )
    )
    names = itertools.count()
    a_live: list[tuple[Request, int]] = []  # (request, iteration it arrived after)
    b_live: list[Request] = []
    a_steps: list[int] = []
    b_done = 0
    most_b_prefills = 0  # the most B prompt chunks in a step that also ran an A prompt chunk

    def submit(tenant: str, prompt: int) -> Request:
        return sim.submit(SimRequest(f"{tenant}-{next(names)}", tenant, sim.clock, prompt, 1))

    def hook(sim: Simulator, out: SchedulerOutput) -> None:
        nonlocal b_done, most_b_prefills
        prompts = [c.request.meta.tenant_id for c in out.chunks if c.start < c.request.num_prompt_tokens]
        if "A" in prompts:
            most_b_prefills = max(most_b_prefills, prompts.count("B"))
        for request, since in a_live:
            if request.first_token_time is not None:
                a_steps.append(sim.scheduler.iteration - since)
        a_live[:] = [(r, since) for r, since in a_live if r.first_token_time is None]
        b_done += sum(1 for r in b_live if r.is_finished)
        b_live[:] = [r for r in b_live if not r.is_finished]
        if not a_live:
            a_live.append((submit("A", setup.a_prompt), sim.scheduler.iteration))
        while len(b_live) < b_loops:
            b_live.append(submit("B", setup.b_prompt))

    sim.run([SimRequest("start", "B", 0.0, 1, 1)], max_iterations=setup.iterations, on_iteration=hook)
    return {
        "b_loops": b_loops,
        "a_answers": len(a_steps),
        "b_answers": b_done,
        "a_ttft_steps_p50": statistics.median(a_steps),
        "a_ttft_steps_max": max(a_steps),
        "most_b_prefills_beside_a": most_b_prefills,
        "simulated_s": round(sim.clock, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Print A's time to first token in steps alone and beside each flood size, as JSON."""
    p = argparse.ArgumentParser(prog="python -m sim.flood", description=__doc__.split("\n")[0])
    p.add_argument("--loops", default="0,1,62", help="B loop counts, comma-separated")
    p.add_argument("--iterations", type=int, default=FloodSetup.iterations, help="steps simulated per run")
    args = p.parse_args(argv)
    setup = FloodSetup(iterations=args.iterations)
    print(json.dumps([run(int(n), setup) for n in args.loops.split(",")], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
