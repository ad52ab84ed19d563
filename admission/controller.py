"""The edge admission decision: deadline passed or infeasible, queue bounds, with Retry-After estimates."""

from __future__ import annotations

import random
from dataclasses import dataclass

from admission.backoff import retry_after_seconds
from admission.feasibility import Estimate, LoadStats, RatePriors, drain_seconds, estimate
from admission.queues import AdmissionQueues, QueueBounds, QueueFull, QueueSlot
from admission.quota import QuotaDecision


@dataclass
class AdmissionSettings:
    """Admission knobs, built from the settings tree (`GatewaySettings.admission_settings`)."""

    bounds: QueueBounds
    retry_jitter: float
    fair_policy: bool  # the engine interleaves tenants (VTC) rather than serving FCFS
    priors: RatePriors

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        self.bounds.validate()
        if not 0 <= self.retry_jitter <= 1:
            raise ValueError("retry_jitter must be in [0, 1]")


@dataclass(frozen=True)
class Rejection:
    """A request refused at the edge: HTTP status, machine code, message, and when to retry."""

    status: int
    code: str
    message: str
    retry_after_s: int | None = None
    estimated_start_ms: int | None = None
    quota: QuotaDecision | None = None  # the tenant's quota state, for RateLimit headers (admission/edge.py)
    param: str | None = None  # the request field a non-retryable refusal is about
    retryable: bool = True  # False: waiting cannot help; sent with `x-should-retry: false`, no Retry-After


@dataclass(frozen=True)
class Admitted:
    """An accepted request: its queue slot and the estimate it was accepted on."""

    slot: QueueSlot
    estimated_start_ms: int


class AdmissionController:
    """Decides, before anything is queued, whether a request enters the engine."""

    def __init__(self, settings: AdmissionSettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.settings.validate()
        self.queues = AdmissionQueues(self.settings.bounds)
        self._rng = rng or random.Random()

    def retry_after(self, seconds: float) -> int:
        """Retry-After seconds for an estimated wait, with this controller's jitter."""
        return retry_after_seconds(seconds, self.settings.retry_jitter, self._rng)

    def admit(
        self,
        tenant_id: str,
        prompt_tokens: int,
        max_tokens: int,
        deadline: float | None,
        now: float,
        stats: LoadStats,
        tenant_queue_bound: int | None = None,
        weight: float = 1.0,
    ) -> Admitted | Rejection:
        """Admit (taking a queue slot, perhaps pushing out over-share work) or reject with status 408, 429
        or 503 and a retry estimate."""
        if deadline is not None and deadline <= now:
            return Rejection(408, "deadline_passed", f"deadline passed {(now - deadline) * 1000:.0f} ms ago")
        est = estimate(
            stats, tenant_id, prompt_tokens, max_tokens, self.settings.fair_policy, self.settings.priors
        )
        start_ms = int(round(est.start_s * 1000))
        if deadline is not None and now + est.finish_s > deadline:
            return self.infeasible(est, deadline - now)
        slot = self.queues.try_enter(tenant_id, prompt_tokens, tenant_queue_bound, weight)
        if isinstance(slot, QueueFull):
            wait = drain_seconds(stats, slot.excess_tokens, slot.excess_requests, self.settings.priors)
            if slot.scope == "tenant":
                return Rejection(429, "tenant_queue_full", slot.message, self.retry_after(wait), start_ms)
            if slot.scope == "share":
                return Rejection(429, "over_share", slot.message, self.retry_after(wait), start_ms)
            return Rejection(503, "overloaded", slot.message, self.retry_after(wait), start_ms)
        return Admitted(slot, start_ms)

    def infeasible(self, est: Estimate, left: float) -> Rejection:
        """The refusal of a deadline `left` seconds away that `est` cannot meet.

        When the request's own run time (prefill and max_tokens decode steps on an idle engine) exceeds the
        deadline, waiting cannot help: 400 `deadline_unmeetable`, not retryable. Otherwise 503
        `deadline_infeasible`, retry once the queue ahead has drained by the amount the request overshoots.
        """
        start_ms = int(round(est.start_s * 1000))
        said = (
            f"estimated start in {start_ms} ms, finish in {est.finish_s * 1000:.0f} ms, "
            f"deadline in {left * 1000:.0f} ms"
        )
        if not est.waiting_helps(left):
            return Rejection(
                400,
                "deadline_unmeetable",
                f"cannot finish by the deadline even on an idle engine: its own run takes an estimated "
                f"{est.run_s * 1000:.0f} ms ({said}); lower max_tokens or allow more time",
                estimated_start_ms=start_ms,
                param="max_tokens",
                retryable=False,
            )
        overshoot = est.finish_s - left
        wait = min(overshoot, est.start_s) if est.start_s > 0 else overshoot
        return Rejection(
            503,
            "deadline_infeasible",
            f"cannot finish by the deadline: {said}",
            retry_after_s=self.retry_after(wait),
            estimated_start_ms=start_ms,
        )

    def pushed_out(self, slot: QueueSlot, stats: LoadStats) -> Rejection:
        """The answer to a request pushed out of the full queue by a tenant under its share: 429, retry
        once the queue has drained by this request's work."""
        wait = drain_seconds(stats, slot.tokens, 1, self.settings.priors)
        return Rejection(
            429,
            "pushed_out",
            "the server queue is full and this tenant is over its share of it; "
            "a tenant under its share took this request's place",
            self.retry_after(wait),
        )

    def shed(self, stats: LoadStats, tenant_id: str, weight: float = 1.0) -> Rejection | None:
        """Cheap early refusal (before parsing a body) when the global request bound is reached and this
        tenant could not push anyone out: one more request would put it over its share."""
        bounds = self.settings.bounds
        if self.queues.could_enter(tenant_id, weight):
            return None
        queued = self.queues.queued()
        wait = drain_seconds(stats, 0, queued + 1 - bounds.max_queued_requests, self.settings.priors)
        if self.queues.queued(tenant_id) > 0:  # its own queued work already holds its share
            message = f"server queue is full ({queued} requests queued) and this tenant is at its share of it"
            return Rejection(429, "over_share", message, self.retry_after(wait))
        return Rejection(
            503, "overloaded", f"server queue is full ({queued} requests queued)", self.retry_after(wait)
        )
