"""When would a new request start and finish, given the engine's live queue and measured rates."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


class LoadStats(Protocol):
    """The part of the engine's live statistics admission reads (engine.EngineStats satisfies it)."""

    @property
    def waiting(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def waiting_by_tenant(self) -> Mapping[str, int]: ...

    @property
    def waiting_tokens(self) -> int: ...

    @property
    def prefill_tokens_per_s(self) -> float: ...

    @property
    def decode_tokens_per_s(self) -> float: ...

    @property
    def iteration_seconds(self) -> float: ...

    @property
    def max_num_seqs(self) -> int: ...


@dataclass(frozen=True)
class RatePriors:
    """Rates assumed before the engine has measured any (a cold engine reports zeros)."""

    prefill_tokens_per_s: float
    iteration_seconds: float


@dataclass(frozen=True)
class Estimate:
    """Seconds from now until the request starts prefill and until its last token, at worst."""

    start_s: float
    finish_s: float
    tokens_ahead: int
    requests_ahead: int
    run_s: float = 0.0  # its own prefill and decode: its finish on an idle engine, where waiting cannot help

    def waiting_helps(self, seconds_left: float) -> bool:
        """Whether the request could meet a deadline `seconds_left` away on an idle engine: if not, a retry
        never succeeds, and the refusal must not say when to retry (docs/gateway.md, "Refusals")."""
        return self.run_s <= seconds_left


def requests_ahead(stats: LoadStats, tenant_id: str, fair: bool) -> int:
    """Queued requests that the policy serves before a new one from `tenant_id`.

    FCFS serves everything already queued first. A fair-share policy interleaves backlogged
    tenants, so another tenant's queue counts only up to the depth of this tenant's own.
    """
    if not fair:
        return stats.waiting
    own = stats.waiting_by_tenant.get(tenant_id, 0)
    ahead = own
    for tenant, queued in stats.waiting_by_tenant.items():
        if tenant != tenant_id:
            ahead += min(queued, own + 1)
    return min(ahead, stats.waiting)


def estimate(
    stats: LoadStats,
    tenant_id: str,
    prompt_tokens: int,
    max_tokens: int,
    fair: bool,
    priors: RatePriors,
) -> Estimate:
    """Estimated start and worst-case finish of a request if it were queued now."""
    prefill_rate = (
        stats.prefill_tokens_per_s if stats.prefill_tokens_per_s > 0 else priors.prefill_tokens_per_s
    )
    iteration_s = stats.iteration_seconds if stats.iteration_seconds > 0 else priors.iteration_seconds
    ahead = requests_ahead(stats, tenant_id, fair)
    mean_queued = stats.waiting_tokens / stats.waiting if stats.waiting else 0.0
    tokens_ahead = int(round(ahead * mean_queued))
    start_s = tokens_ahead / prefill_rate
    # With every sequence slot taken, a newcomer also waits for slots to turn over; one
    # iteration per request ahead beyond the free slots is the cheapest turnover possible.
    free_slots = max(stats.max_num_seqs - stats.running, 0)
    if ahead >= free_slots:
        start_s += (ahead - free_slots + 1) * iteration_s
    # Decode advances each running sequence by one token per iteration.
    run_s = prompt_tokens / prefill_rate + max_tokens * iteration_s
    return Estimate(
        start_s=start_s,
        finish_s=start_s + run_s,
        tokens_ahead=tokens_ahead,
        requests_ahead=ahead,
        run_s=run_s,
    )


def drain_seconds(stats: LoadStats, excess_tokens: int, excess_requests: int, priors: RatePriors) -> float:
    """Seconds until the queue has shed `excess_tokens` queued prompt tokens and `excess_requests` requests."""
    prefill_rate = (
        stats.prefill_tokens_per_s if stats.prefill_tokens_per_s > 0 else priors.prefill_tokens_per_s
    )
    iteration_s = stats.iteration_seconds if stats.iteration_seconds > 0 else priors.iteration_seconds
    mean_queued = stats.waiting_tokens / stats.waiting if stats.waiting else 0.0
    by_tokens = max(excess_tokens, 0) / prefill_rate
    by_requests = max(excess_requests, 0) * max(mean_queued / prefill_rate, iteration_s)
    return max(by_tokens, by_requests)
