"""A tiny real item for policies, and a discrete-time continuous-batching server that drives one."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Meta:
    """The fields of engine RequestMeta a policy reads."""

    tenant_id: str = "t0"
    api_key_id: str | None = None
    user: str | None = None
    priority: int = 0
    weight: float = 1.0
    deadline: float | None = None
    arrival_time: float = 0.0


@dataclass(eq=False)
class Job:
    """A request as the driver sees it: prompt and output lengths, and progress through them."""

    request_id: str
    meta: Meta = field(default_factory=Meta)
    input_len: int = 8
    output_len: int = 8
    prefilled: int = 0
    decoded: int = 0


def job(rid: str, tenant: str = "t0", **meta: Any) -> Job:
    """A Job with the given request id, tenant and metadata overrides."""
    return Job(rid, Meta(tenant_id=tenant, **meta))


def drain(policy: Any, now: float = 0.0) -> list[str]:
    """Admit everything in policy order; the request ids in that order."""
    order = []
    while (item := policy.peek(now)) is not None:
        policy.pop(item)
        order.append(item.request_id)
    return order


class Server:
    """Continuous batching with capacity M: at most M tokens computed per step and M tokens of KV memory.

    Each step: one decode token per running request whose prompt is done (charged token by
    token), then continuing prefill chunks, then new admissions in policy order, each charged for
    the chunk it gets, as the engine scheduler charges. Admission reserves a job's prompt plus
    output in memory (the simulator knows output lengths) and stops at the first job that does
    not fit, as in the VTC paper's Algorithm 2.
    """

    def __init__(self, policy: Any, capacity: int = 64) -> None:
        self.policy = policy
        self.capacity = capacity
        self.reserved = 0
        self.running: list[Job] = []
        self.waiting: dict[str, int] = {}  # tenant -> queued jobs
        self.now = 0.0

    def submit(self, item: Job) -> None:
        """Queue a job now."""
        item.meta.arrival_time = self.now
        self.policy.add(item, self.now)
        self.waiting[item.meta.tenant_id] = self.waiting.get(item.meta.tenant_id, 0) + 1

    def step(self) -> None:
        """Run one iteration and advance the clock by one."""
        budget = self.capacity
        for r in self.running:
            if r.prefilled == r.input_len:
                self.policy.charge(r, 0, 1, 0)
                r.decoded += 1
                budget -= 1
        for r in self.running:
            if r.decoded == r.output_len:
                self.reserved -= r.input_len + r.output_len
        self.running = [r for r in self.running if r.decoded < r.output_len]
        for r in self.running:
            if budget and r.prefilled < r.input_len:
                budget -= self._prefill(r, budget)
        while budget:
            item = self.policy.peek(self.now)
            if item is None or self.reserved + item.input_len + item.output_len > self.capacity:
                break
            self.policy.pop(item)
            self.reserved += item.input_len + item.output_len
            self.waiting[item.meta.tenant_id] -= 1
            self.running.append(item)
            budget -= self._prefill(item, budget)
        self.now += 1.0

    def _prefill(self, r: Job, budget: int) -> int:
        chunk = min(r.input_len - r.prefilled, budget)
        self.policy.charge(r, chunk, 0, 0)
        r.prefilled += chunk
        return chunk

    def backlogged(self, *tenants: str) -> bool:
        """True while every named tenant has queued jobs."""
        return all(self.waiting.get(t, 0) > 0 for t in tenants)


def random_jobs(
    tenant: str, count: int, rng: random.Random, max_in: int, max_out: int, **meta: Any
) -> list[Job]:
    """`count` jobs of `tenant` with uniform random prompt and output lengths."""
    return [
        Job(f"{tenant}-{i}", Meta(tenant_id=tenant, **meta), rng.randint(1, max_in), rng.randint(1, max_out))
        for i in range(count)
    ]
