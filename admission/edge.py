"""One admission call at the edge: deadline, queue bounds and the tenant's token quota, decided together.

`AdmissionController` (synchronous, in-process) decides the deadline and the queue bounds; the quota store
may be Redis, so it is awaited. This module runs both in the one order that holds nothing on a refusal:
the queue slot first (cheap, local), then the quota reservation, releasing the slot when the quota says
no or the caller is cancelled while Redis answers. Every refusal carries the tenant's quota state (a peek
that counts nothing) so the gateway can send `RateLimit` headers with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from admission.controller import AdmissionController, Rejection
from admission.feasibility import LoadStats
from admission.queues import QueueSlot
from admission.quota import QuotaDecision, QuotaLimits, QuotaStore


@dataclass(frozen=True)
class AdmissionAsk:
    """What admission needs to know about one request (the gateway's RequestContext supplies it)."""

    tenant_id: str
    prompt_tokens: int
    max_tokens: int
    deadline: float | None
    arrival: float
    limits: QuotaLimits
    tenant_queue_bound: int | None = None
    weight: float = 1.0  # the tenant's share of the queue bounds is proportional to it


@dataclass(frozen=True)
class Admission:
    """An admitted request: its queue slot, its start estimate and its quota reservation (None: no quota)."""

    slot: QueueSlot
    estimated_start_ms: int
    quota: QuotaDecision | None

    @property
    def quota_unenforced(self) -> bool:
        """Admitted while the quota backend was away (quotas failing open)."""
        return self.quota is not None and self.quota.reason == "backend_unavailable"


class EdgeAdmission:
    """The controller and the quota store behind one `admit` (and the cheap pre-parse `shed`)."""

    def __init__(self, controller: AdmissionController, quota: QuotaStore) -> None:
        self.controller = controller
        self.quota = quota

    async def peek(self, tenant_id: str, limits: QuotaLimits) -> QuotaDecision | None:
        """The tenant's quota state without counting anything; None for a tenant without quotas."""
        return await self.quota.peek(tenant_id, limits) if limits.windows() else None

    async def shed(
        self, stats: LoadStats, tenant_id: str, limits: QuotaLimits, weight: float = 1.0
    ) -> Rejection | None:
        """Refuse before the body is read when the global request bound is reached and this tenant is at
        its share of it."""
        shed = self.controller.shed(stats, tenant_id, weight)
        return None if shed is None else replace(shed, quota=await self.peek(tenant_id, limits))

    async def admit(self, ask: AdmissionAsk, stats: LoadStats) -> Admission | Rejection:
        """Deadline, queue bounds, then the quota reservation (prompt + max_tokens); a refusal holds nothing."""
        verdict = self.controller.admit(
            ask.tenant_id,
            ask.prompt_tokens,
            ask.max_tokens,
            ask.deadline,
            ask.arrival,
            stats,
            ask.tenant_queue_bound,
            ask.weight,
        )
        if isinstance(verdict, Rejection):
            return replace(verdict, quota=await self.peek(ask.tenant_id, ask.limits))
        if not ask.limits.windows():
            return Admission(verdict.slot, verdict.estimated_start_ms, None)
        try:  # Redis is awaited here: a request cancelled meanwhile must not keep its queue slot
            quota = await self.quota.reserve(ask.tenant_id, ask.prompt_tokens + ask.max_tokens, ask.limits)
        except BaseException:
            verdict.slot.release()
            raise
        if verdict.slot.pushed_out:  # a tenant under its share took the place while Redis answered
            if quota.allowed and quota.reservation_id is not None:
                await self.quota.settle(ask.tenant_id, quota.reservation_id, 0, ask.limits)
            return self.controller.pushed_out(verdict.slot, stats)
        if quota.allowed:
            return Admission(verdict.slot, verdict.estimated_start_ms, quota)
        verdict.slot.release()
        return self._quota_refusal(quota, ask)

    def _quota_refusal(self, quota: QuotaDecision, ask: AdmissionAsk) -> Rejection:
        """What a denied reservation answers, naming the tokens asked for and the limit.

        A request larger than the whole quota (`exceeds_limit`) can never be admitted, however long its
        client waits: 400 `quota_exceeds_limit`, no Retry-After, `x-should-retry: false` (a retry must not
        be invited: docs/gateway.md, "Refusals that waiting cannot cure"). Otherwise 429 `quota_exceeded`
        with the wait until enough tokens have left the window.
        """
        if quota.reason == "backend_unavailable":  # quotas fail closed and Redis is away
            retry = self.controller.retry_after(quota.retry_after_s)
            return Rejection(503, "quota_unavailable", "the quota backend is unavailable; retry later", retry)
        asked = ask.prompt_tokens + ask.max_tokens
        what = (
            f"this request reserves {asked} tokens (prompt {ask.prompt_tokens} + {ask.max_tokens} to "
            "generate: max_tokens times n)"
        )
        if quota.reason == "exceeds_limit":
            return Rejection(
                400,
                "quota_exceeds_limit",
                f"{what}, more than the tenant's whole quota of {quota.limit_text()}: it can never be "
                "admitted; lower max_tokens (a request without it reserves the whole context) or the prompt",
                quota=quota,
                param="max_tokens",
                retryable=False,
            )
        return Rejection(
            429,
            "quota_exceeded",
            f"tenant token quota exceeded: {what}, {quota.remaining or 0} of {quota.limit_text()} left now",
            self.controller.retry_after(quota.retry_after_s),
            quota=quota,
        )

    def settle_now(self, tenant_id: str, admission: Admission, used_tokens: int) -> bool:
        """`settle` without awaiting, where nothing needs awaiting: no reservation, or a store that settles
        in this process (MemoryQuota). False when the caller must await `settle` (a Redis reservation)."""
        quota = admission.quota
        if quota is None or quota.reservation_id is None:
            return True
        settle_now = getattr(self.quota, "settle_now", None)  # MemoryQuota's synchronous face
        if settle_now is None:
            return False
        settle_now(tenant_id, quota.reservation_id, used_tokens)
        return True

    async def settle(
        self, tenant_id: str, admission: Admission, used_tokens: int, limits: QuotaLimits
    ) -> None:
        """Replace the reservation by the tokens the request used (nothing to do without one)."""
        if admission.quota is not None and admission.quota.reservation_id is not None:
            await self.quota.settle(tenant_id, admission.quota.reservation_id, used_tokens, limits)
