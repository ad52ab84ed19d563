"""Edge refusals: counted in metrics and the dashboard's recent list, with the headers that say when to retry."""

from __future__ import annotations

from admission.backoff import ratelimit_headers
from admission.controller import Rejection
from admission.quota import QuotaDecision
from gateway.edge.errors import APIError
from gateway.state import GatewayState


def quota_headers(decision: QuotaDecision | None) -> dict[str, str]:
    """`RateLimit-Policy` and `RateLimit` for the tenant's binding window; none without a quota."""
    if decision is None or decision.limit is None or not decision.policy:
        return {}
    return ratelimit_headers(decision.policy, decision.limit, decision.remaining or 0, decision.reset_s)


def refused(state: GatewayState, tenant_id: str | None, err: APIError) -> APIError:
    """Count and log an edge refusal (metrics and the dashboard's recent list); returns `err`."""
    state.metrics.rejections.labels(err.code or "other").inc()
    state.rejections.record(
        err.code or "other", err.status, err.headers.get("Retry-After"), tenant_id, err.message
    )
    return err


def rejected(state: GatewayState, tenant_id: str, r: Rejection) -> APIError:
    """An admission refusal as a counted APIError: RateLimit, Retry-After and X-Estimated-Start-Ms headers."""
    headers = quota_headers(r.quota)
    if not r.retryable:  # waiting cannot help: told so in the form openai-python and others obey
        headers["x-should-retry"] = "false"
    elif r.retry_after_s is not None:
        headers["Retry-After"] = str(r.retry_after_s)
    if r.estimated_start_ms is not None:
        headers["X-Estimated-Start-Ms"] = str(r.estimated_start_ms)
    return refused(state, tenant_id, APIError(r.status, r.message, r.code, r.param, headers=headers))
