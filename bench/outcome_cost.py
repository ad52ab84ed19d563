"""Cost per successful outcome: engine tokens spent per verified completion, and what fan-out wasted per task.

A verified completion is a user-visible answer that counts: the attempt the client kept (every completed
request outside fan-out), ended by length or stop, within the workload's SLO (the goodput set). Engine
tokens are what the engine computed for the tenant in that workload, every attempt included: prompt
computed (prompt - cached) + output. For agent fan-out, the tokens of attempts not kept are split into
cancelled branches (ended cancelled) and retries (ended otherwise: answers produced and thrown away),
per task.
"""

from __future__ import annotations

from typing import Any

from bench.loadgen import Outcome
from bench.workloads import Workload

COMPLETED = ("length", "stop")


def engine_tokens(o: Outcome) -> int:
    """Prompt tokens computed plus output tokens of one attempt, as the server's usage reported them."""
    return max(o.prompt_tokens - o.cached_tokens, 0) + o.completion_tokens if o.accepted else 0


def cost_per_outcome(outcomes: list[Outcome], workload: Workload, good: set[str]) -> dict[str, Any]:
    """Per tenant: verified completions, engine tokens and their ratio; for fan-out, waste per task."""
    tenants: dict[str, Any] = {}
    for t in workload.tenants:
        mine = [o for o in outcomes if o.tenant == t.name]
        verified = sum(1 for o in mine if o.request_id in good)
        tokens = sum(engine_tokens(o) for o in mine)
        tenants[t.name] = {
            "verified_completions": verified,
            "engine_tokens": tokens,
            "engine_tokens_per_verified": tokens / verified if verified else None,
        }
    report: dict[str, Any] = {"tenants": tenants}
    if workload.fanout > 1:
        tasks = {o.task_id for o in outcomes if o.task_id}
        losers = [o for o in outcomes if o.task_id and not o.kept]
        cancelled = sum(engine_tokens(o) for o in losers if o.finish_reason == "cancelled")
        retries = sum(engine_tokens(o) for o in losers if o.finish_reason != "cancelled")
        report["wasted_tokens_per_task"] = {
            "tasks": len(tasks),
            "cancelled_branches": cancelled / len(tasks) if tasks else None,
            "retries": retries / len(tasks) if tasks else None,
        }
    return report
