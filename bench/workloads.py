"""The four benchmark workloads, declared in full: arrivals, lengths, prefixes, tenants, sampling, SLOs.

A workload is a fixed shape; the offered rate is a separate knob, so a sweep raises load without changing
anything else. `plan()` turns a shape, a rate and a duration into the exact requests of a run.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.harness import text

# Prompts are ASCII: the embedded byte tokenizer maps one character to one token (plus BOS).
_ALPHABET = "abcdefghijklmnopqrstuvwxyz     .,"


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: uniform on [low, high], or a weighted choice of fixed lengths."""

    low: int
    high: int
    choices: tuple[tuple[int, float], ...] = ()

    def sample(self, rng: random.Random) -> int:
        """One length."""
        if self.choices:
            lengths, weights = zip(*self.choices, strict=True)
            return int(rng.choices(lengths, weights)[0])
        return rng.randint(self.low, self.high)

    def describe(self) -> str:
        """Human-readable form for the report."""
        if self.choices:
            return " or ".join(f"{n} ({w:.0%})" for n, w in self.choices)
        return f"uniform {self.low}-{self.high}"


@dataclass(frozen=True)
class TenantTraffic:
    """One tenant: its fair-share weight, its share of the offered load, and its arrival shape."""

    name: str
    weight: float
    share: float
    arrival: str = "poisson"  # poisson | bursty
    on_s: float = 0.5  # bursty: seconds sending ...
    off_s: float = 1.5  # ... then seconds silent; the mean rate is preserved
    noisy: bool = False


@dataclass(frozen=True)
class SLO:
    """Service objectives a request must meet to count toward goodput (seconds)."""

    ttft_s: float
    tpot_s: float
    e2e_s: float
    deadline_s: float | None = None  # sent as X-Timeout-Ms: the server may refuse infeasible requests

    def met(self, ttft: float | None, tpot: float | None, e2e: float | None) -> bool:
        """True when every measured latency is within its objective."""
        if ttft is None or e2e is None:
            return False
        return ttft <= self.ttft_s and e2e <= self.e2e_s and (tpot is None or tpot <= self.tpot_s)


DEFAULT_TENANTS: tuple[TenantTraffic, ...] = (
    TenantTraffic("steady", weight=2.0, share=0.3),
    TenantTraffic("interactive", weight=1.0, share=0.2),
    TenantTraffic("noisy", weight=1.0, share=0.5, arrival="bursty", noisy=True),
)


@dataclass(frozen=True)
class Workload:
    """A workload shape: everything but the offered rate."""

    name: str
    description: str
    prompt: LengthDist
    output: LengthDist
    slo: SLO
    prefix_share: float = 0.0  # fraction of requests that start with the shared prefix
    prefix_tokens: int = 0
    fanout: int = 1  # >1: each arrival is an agent task sending this many parallel attempts
    temperature: float = 0.0  # every request ignores EOS: it ends at max_tokens, the declared length
    tenants: tuple[TenantTraffic, ...] = DEFAULT_TENANTS
    default_rate: float = 4.0  # arrivals/s used when the run does not set one

    def declare(self) -> dict[str, Any]:
        """The declaration block of the report (the essay's list, minus what the run itself adds)."""
        return {
            "name": self.name,
            "description": self.description,
            "prompt_tokens": self.prompt.describe(),
            "output_tokens": self.output.describe(),
            "prefix_sharing": {"share": self.prefix_share, "prefix_tokens": self.prefix_tokens},
            "fanout": self.fanout,
            "sampling": {"temperature": self.temperature, "ignore_eos": True, "stop_condition": "max_tokens"},
            "tenants": [asdict(t) for t in self.tenants],
            "slo": asdict(self.slo),
        }


@dataclass
class PlannedRequest:
    """One arrival of the plan: when, whose, what prompt, how many tokens (per attempt for fan-out)."""

    at: float
    tenant: str
    prompt: str
    max_tokens: list[int] = field(default_factory=list)
    task_id: str | None = None
    seeds: list[int] = field(default_factory=list)


WORKLOADS: dict[str, Workload] = {
    "chat": Workload(
        "chat",
        "short uniform chat: short prompts, short outputs",
        prompt=LengthDist(16, 48),
        output=LengthDist(8, 24),
        slo=SLO(ttft_s=1.0, tpot_s=0.25, e2e_s=5.0, deadline_s=20.0),
        default_rate=6.0,
    ),
    "mixed": Workload(
        "mixed",
        "mixed short and long outputs: 80% short answers, 20% long generations",
        prompt=LengthDist(16, 64),
        output=LengthDist(0, 0, ((8, 0.8), (96, 0.2))),
        slo=SLO(ttft_s=1.0, tpot_s=0.25, e2e_s=20.0, deadline_s=40.0),
        default_rate=3.0,
    ),
    "retrieval": Workload(
        "retrieval",
        "long-prefill retrieval: long prompts behind a shared document prefix, short outputs",
        prompt=LengthDist(320, 480),
        output=LengthDist(4, 12),
        prefix_share=0.75,
        prefix_tokens=256,
        slo=SLO(ttft_s=2.0, tpot_s=0.25, e2e_s=6.0, deadline_s=30.0),
        default_rate=2.0,
    ),
    "agent": Workload(
        "agent",
        "bursty agent fan-out: each task sends 3 parallel attempts, keeps the first, cancels the rest",
        prompt=LengthDist(24, 64),
        output=LengthDist(8, 64),
        fanout=3,
        temperature=0.8,
        slo=SLO(ttft_s=1.5, tpot_s=0.25, e2e_s=10.0, deadline_s=30.0),
        tenants=(
            TenantTraffic("steady", 2.0, 0.4),
            TenantTraffic("noisy", 1.0, 0.6, "bursty", 0.5, 1.5, True),
        ),
        default_rate=1.5,
    ),
}


def arrival_times(tenant: TenantTraffic, rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Open-loop arrival offsets (seconds) for one tenant at mean `rate`/s over `duration_s`."""
    if rate <= 0:
        return []
    times: list[float] = []
    if tenant.arrival == "poisson":
        t = rng.expovariate(rate)
        while t < duration_s:
            times.append(t)
            t += rng.expovariate(rate)
        return times
    # On/off: Poisson at a raised rate while on, silent while off, so the long-run mean is `rate`.
    period = tenant.on_s + tenant.off_s
    on_rate = rate * period / tenant.on_s
    start = rng.uniform(0, period)  # tenants do not burst in lock-step with the run's start
    t = 0.0
    while t < duration_s:
        phase = (t + start) % period
        if phase >= tenant.on_s:  # skip to the next on period
            t += period - phase
            continue
        t += rng.expovariate(on_rate)
        if t < duration_s and (t + start) % period < tenant.on_s:
            times.append(t)
    return times


def plan(workload: Workload, rate: float, duration_s: float, seed: int = 0) -> list[PlannedRequest]:
    """Every request of one run, sorted by arrival; the same arguments always give the same plan."""
    rng, n = random.Random(f"{workload.name}:{seed}"), workload.prefix_tokens
    prefix = text(n, random.Random(f"prefix:{workload.name}"), _ALPHABET) if n else ""
    total_share = sum(t.share for t in workload.tenants) or 1.0
    planned: list[PlannedRequest] = []
    for tenant in workload.tenants:
        for at in arrival_times(tenant, rate * tenant.share / total_share, duration_s, rng):
            n_prompt = workload.prompt.sample(rng)
            shared = prefix if prefix and rng.random() < workload.prefix_share else ""
            prompt = shared + text(max(n_prompt - len(shared), 1), rng, _ALPHABET)
            max_tokens = [workload.output.sample(rng) for _ in range(workload.fanout)]
            seeds = [rng.randrange(1 << 30) for _ in range(workload.fanout)]
            planned.append(PlannedRequest(at, tenant.name, prompt, max_tokens, seeds=seeds))
    planned.sort(key=lambda p: p.at)
    for i, p in enumerate(planned):
        p.task_id = f"{workload.name}-task-{seed}-{i}" if workload.fanout > 1 else None
    return planned


def offered_tokens(planned: list[PlannedRequest]) -> tuple[int, int]:
    """Offered prompt and output tokens of a plan (every attempt counts: it is sent)."""
    prompt = sum((len(p.prompt) + 1) * len(p.max_tokens) for p in planned)
    output = sum(sum(p.max_tokens) for p in planned)
    return prompt, output
