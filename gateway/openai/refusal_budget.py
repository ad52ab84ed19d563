"""Refused work is charged to its sender: a per-tenant budget of refusals.

A request that can only be refused (a prompt over the context, a bad field) still costs the server its
body, its parsing and perhaps its tokenisation, and writes no ledger row and spends no quota. Each one
is charged here to its tenant: a token bucket (`burst`, refilled at `rate_per_s`, the same bucket as the
per-address authentication failures, gateway/edge/auth_guard.py) that, once empty, answers the tenant's
next requests 429 + Retry-After before their bodies are parsed. The CPU of the work itself, refused or
not, is bounded and ordered by gateway/openai/preprocess.py.
"""

from __future__ import annotations

from gateway.edge.auth_guard import FailureBudget


class RefusalBudget(FailureBudget):
    """Per tenant: refusals allowed (a token bucket, keyed by tenant id).

    The bucket is FailureBudget itself (`retry_after`, `charge`), inherited rather than wrapped: every
    generation request asks `retry_after` once or twice, and a wrapper doubled those calls."""
