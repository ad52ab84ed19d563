"""The simulator's upstream mode: fairserve's dispatcher in front of an engine that serves requests, not tenants.

What `fairserve serve --upstream` does (upstream/engine.py), on a virtual clock: the gateway holds each
request in the fairness policy's queue (`fairness.make_policy`, the same policy and counters as the
engine's scheduler) and dispatches the policy's head whenever fewer than `window` requests are in
flight, charging the prompt at dispatch and each output token as it is produced. The engine behind it
knows no tenants: `slots` requests run at once, admitted first come first served, each producing one
token per step, so inside the window the split is by request count.

The bound (docs/fairness.md, "In front of an upstream engine"): with two tenants backlogged throughout,
their weighted service differs by at most `max(2, W)·U / w_min`, where W is the window and U the most
one request can be charged (`w_in·prompt + w_out·max_tokens`). A tenant is dispatched only while its
counter is the smallest; from then its counter can grow by at most what its requests in flight still
receive, which is at most W requests' whole service. `upstream_scenario` measures the largest
difference against that bound for several windows.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from engine.core.request import RequestMeta
from fairness import FairnessConfig, make_policy


@dataclass(frozen=True)
class UpstreamSimConfig:
    """Two closed-loop tenants in front of one request-serving engine."""

    window: int = 8
    slots: int = 16  # the engine's batch: requests it runs at once (vLLM's max_num_seqs)
    weights: tuple[float, float] = (3.0, 1.0)
    clients: int = 12  # streaming clients per tenant, each sending its next request when one ends
    prompt_tokens: int = 32
    max_tokens: tuple[int, int] = (16, 128)  # each request's output length, uniform in this range
    steps: int = 20_000
    policy: str = "vtc"
    w_in: float = 1.0
    w_out: float = 2.0
    seed: int = 0

    def request_bound(self) -> float:
        """U: the most one request can be charged."""
        return self.w_in * self.prompt_tokens + self.w_out * self.max_tokens[1]

    def bound(self) -> float:
        """The weighted-service difference two backlogged tenants stay within: max(2, W)·U / w_min."""
        return max(2, self.window) * self.request_bound() / min(self.weights)


@dataclass(eq=False)
class _Request:
    request_id: str
    meta: RequestMeta
    output: int  # tokens it will produce
    produced: int = 0


@dataclass
class UpstreamSimResult:
    """Weighted service by tenant and the largest difference seen while both were backlogged."""

    tokens: dict[str, int] = field(default_factory=dict)
    service: dict[str, float] = field(default_factory=dict)
    max_difference: float = 0.0  # within intervals where both tenants had requests in the gateway's queue
    backlogged_steps: int = 0
    max_engine_queue: int = 0


def simulate_upstream(config: UpstreamSimConfig) -> UpstreamSimResult:
    """Run the dispatcher and the engine for `config.steps` engine steps."""
    rng = random.Random(config.seed)
    policy: Any = make_policy(
        FairnessConfig(policy=config.policy, w_in=config.w_in, w_out=config.w_out, priority_classes=False)
    )
    tenants = ("A", "B")
    weight = dict(zip(tenants, config.weights, strict=True))
    result = UpstreamSimResult({t: 0 for t in tenants}, {t: 0.0 for t in tenants})
    serial = 0
    queued = {t: 0 for t in tenants}
    baseline: dict[str, float] | None = None  # service when the current both-backlogged interval began

    def arrive(tenant: str, now: float) -> None:
        nonlocal serial
        serial += 1
        meta = RequestMeta(tenant_id=tenant, weight=weight[tenant], arrival_time=now)
        policy.add(_Request(f"r{serial}", meta, rng.randint(*config.max_tokens)), now)
        queued[tenant] += 1

    for tenant in tenants:
        for _ in range(config.clients):
            arrive(tenant, 0.0)
    in_flight = 0
    engine_waiting: deque[_Request] = deque()
    running: list[_Request] = []
    for step in range(config.steps):
        now = float(step)
        while in_flight < config.window and len(policy):  # the gateway's dispatch, in the policy's order
            head = policy.peek(now)
            if head is None:
                break
            policy.pop(head)
            queued[head.meta.tenant_id] -= 1
            policy.charge(head, config.prompt_tokens, 0, 0)
            _add(result, head, config.w_in * config.prompt_tokens)
            engine_waiting.append(head)
            in_flight += 1
        while engine_waiting and len(running) < config.slots:  # the engine: first come, first served
            running.append(engine_waiting.popleft())
        result.max_engine_queue = max(result.max_engine_queue, len(engine_waiting))
        for request in running:  # one token per running request per step
            request.produced += 1
            policy.charge(request, 0, 1, 0)
            _add(result, request, config.w_out)
            result.tokens[request.meta.tenant_id] += 1
        for request in [r for r in running if r.produced >= r.output]:
            running.remove(request)
            policy.finish(request)
            in_flight -= 1
            arrive(request.meta.tenant_id, now)
        if all(queued.values()):  # both backlogged at the gateway: the bound's condition
            baseline = baseline or dict(result.service)
            weighted = [(result.service[t] - baseline[t]) / weight[t] for t in tenants]
            result.max_difference = max(result.max_difference, max(weighted) - min(weighted))
            result.backlogged_steps += 1
        else:
            baseline = None
    return result


def _add(result: UpstreamSimResult, request: _Request, cost: float) -> None:
    result.service[request.meta.tenant_id] += cost


def upstream_scenario(windows: tuple[int, ...] = (1, 4, 16, 64), steps: int = 20_000) -> dict[str, Any]:
    """Per window: each tenant's token share, the largest weighted-service difference and the bound."""
    report: dict[str, Any] = {"windows": []}
    for window in windows:
        for policy in ("vtc", "fcfs"):
            config = UpstreamSimConfig(window=window, steps=steps, policy=policy)
            run = simulate_upstream(config)
            total = sum(run.tokens.values()) or 1
            report["windows"].append(
                {
                    "window": window,
                    "policy": policy,
                    "share_A": run.tokens["A"] / total,
                    "max_difference": run.max_difference,
                    "backlogged_steps": run.backlogged_steps,
                    "bound": config.bound(),
                    "max_engine_queue": run.max_engine_queue,
                }
            )
    return report
