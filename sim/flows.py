"""Two-level fair share in the simulator (fairness/flows.py, docs/fairness.md "Two levels").

Closed-loop streams on the real Scheduler and policy, on a virtual clock:

- Sybil: tenant A spreads its streams over many `user` names, tenant B sends as one user. Under the flat
  `user` key A gets a share per name; under `tenant/user` the tenants split the engine by weight.
- Fan-out: tenant A runs an agent (one workflow run, `fan_out` parallel calls, each replaced as it ends)
  beside a chat (another workflow run, one request at a time); tenant B keeps the engine busy. Under the
  flat `tenant` key the chat queues behind its own agent's calls; under `tenant/workflow` it waits only
  for its flow's fair share of A's service.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from dataclasses import dataclass
from typing import Any

from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from fairness import FairnessConfig
from fairness.config import FairnessKey
from sim.simulator import SimConfig, SimRequest, Simulator


@dataclass
class Stream:
    """A closed-loop client: keeps `concurrency` requests of one tenant and flow in flight."""

    tenant: str
    concurrency: int
    prompt: int
    output: int
    user: str | None = None
    workflow: str | None = None


@dataclass
class FlowsSetup:
    """Engine geometry shared by both scenarios (8 seats, as in issue 28's setup)."""

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    num_blocks: int = 2048
    duration_s: float = 20.0
    lift_allowance: float = 1024.0

    def config(self, key: FairnessKey) -> SimConfig:
        """The simulated engine under fairness key `key`."""
        return SimConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_blocks=self.num_blocks,
            fairness=FairnessConfig(key=key, lift_allowance=self.lift_allowance),
        )


def run_streams(
    setup: FlowsSetup, key: FairnessKey, streams: list[Stream]
) -> tuple[Simulator, list[Request]]:
    """Run closed-loop `streams` for `setup.duration_s`; the simulator and every request submitted."""
    sim = Simulator(setup.config(key))
    names = itertools.count()
    live: list[list[Request]] = [[] for _ in streams]
    done: list[Request] = []

    def hook(sim: Simulator, out: SchedulerOutput) -> None:
        for stream, requests in zip(streams, live, strict=True):
            done.extend(r for r in requests if r.is_finished)
            requests[:] = [r for r in requests if not r.is_finished]
            while len(requests) < stream.concurrency:
                spec = SimRequest(
                    f"{stream.tenant}-{next(names)}",
                    stream.tenant,
                    sim.clock,
                    stream.prompt,
                    stream.output,
                    user=stream.user,
                    workflow_run_id=stream.workflow,
                )
                requests.append(sim.submit(spec))

    sim.run([SimRequest("start", "B", 0.0, 1, 1)], until=setup.duration_s, on_iteration=hook)
    return sim, done + [r for requests in live for r in requests]


def tenant_service(sim: Simulator) -> dict[str, float]:
    """Charged service by tenant, whatever the key (a flat `user` key names "<tenant>/<user>")."""
    totals: dict[str, float] = {}
    for key, value in sim.service().items():
        tenant = key.split("/")[0]
        totals[tenant] = totals.get(tenant, 0.0) + value
    return totals


def sybil(
    setup: FlowsSetup | None = None, users: int = 24, key: FairnessKey = "tenant/user"
) -> dict[str, Any]:
    """A's `users` names (one stream each) against B's one user with as many streams: A's share over B's."""
    setup = setup or FlowsSetup()
    streams = [Stream("A", 1, 64, 64, user=f"a{i}") for i in range(users)]
    streams.append(Stream("B", users, 64, 64, user="b"))
    sim, _ = run_streams(setup, key, streams)
    service = tenant_service(sim)
    return {
        "key": key,
        "service": service,
        "ratio": service["A"] / service["B"],
        "preemptions": sim.scheduler.preemptions_total,
    }


def fan_out(
    setup: FlowsSetup | None = None, key: FairnessKey = "tenant/workflow", calls: int = 20
) -> dict[str, Any]:
    """A's agent (`calls` parallel) beside A's chat, B busy: the tenants' ratio and the chat's median latency."""
    setup = setup or FlowsSetup()
    streams = [
        Stream("A", calls, 64, 64, workflow="agent"),
        Stream("A", 1, 32, 32, workflow="chat"),
        Stream("B", calls, 64, 64, workflow="b"),
    ]
    sim, requests = run_streams(setup, key, streams)
    chat = [r for r in requests if r.meta.workflow_run_id == "chat"]
    agent_admitted = sorted(
        r.first_scheduled_time
        for r in requests
        if r.meta.workflow_run_id == "agent" and r.first_scheduled_time is not None
    )
    ahead = [  # agent calls admitted while a chat request waited (admitted in a later iteration than it arrived)
        bisect.bisect_left(agent_admitted, r.first_scheduled_time)
        - bisect.bisect_right(agent_admitted, r.meta.arrival_time)
        for r in chat
        if r.first_scheduled_time is not None
    ]
    latencies = [r.finished_time - r.meta.arrival_time for r in chat if r.finished_time is not None]
    service = tenant_service(sim)
    return {
        "key": key,
        "service": service,
        "ratio": service["A"] / service["B"],
        "chat_done": len(latencies),
        "chat_median_s": statistics.median(latencies),
        "agent_calls_ahead_of_chat_max": max(ahead),
        "preemptions": sim.scheduler.preemptions_total,
    }
