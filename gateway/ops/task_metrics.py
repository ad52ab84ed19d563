"""Per-tenant task telemetry for Prometheus: outcomes and wasted tokens of requests that name a task or run.

No task label (its values are the clients' choice, so unbounded): totals per tenant label only. "replaced"
counts, as the ledger's task report does (billing/tasks.py), the engine tokens of completed attempts below
the highest completed attempt of their task; it is known when that later attempt completes, so the tokens
of each task's completed attempts are remembered for the most recent tasks only (`MAX_TASKS`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

MAX_TASKS = 10_000


class ReplacedAttempts:
    """Per recent task: the highest completed attempt and its engine tokens; yields tokens a retry replaced."""

    def __init__(self, max_tasks: int = MAX_TASKS) -> None:
        self.max_tasks = max_tasks
        self._kept: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()

    def completed(self, tenant_id: str, task_id: str, attempt: int, tokens: int) -> int:
        """Record a completed attempt; the engine tokens this completion shows were replaced (0 if none)."""
        key = (tenant_id, task_id)
        kept = self._kept.get(key)
        if kept is not None and attempt < kept[0]:
            return tokens  # a later attempt already answered: this one's answer is replaced
        replaced = 0
        if kept is not None and attempt == kept[0]:
            tokens += kept[1]
        elif kept is not None:
            replaced = kept[1]
        self._kept[key] = (attempt, tokens)
        self._kept.move_to_end(key)
        if len(self._kept) > self.max_tasks:
            self._kept.popitem(last=False)
        return replaced


class TaskMetrics:
    """fairserve_task_requests{tenant,outcome} and fairserve_task_wasted_tokens{tenant,kind}."""

    def __init__(self, registry: CollectorRegistry, label: Callable[[str], str]) -> None:
        self._label = label
        self.requests = Counter(
            "fairserve_task_requests",
            "Finished or refused requests that name a task or workflow run, by outcome",
            ["tenant", "outcome"],
            registry=registry,
        )
        self.wasted = Counter(
            "fairserve_task_wasted_tokens",
            "Engine tokens of task requests wasted: cancelled branches, computed after a cancel, replaced by a retry",
            ["tenant", "kind"],
            registry=registry,
        )
        self._replaced = ReplacedAttempts()

    def infeasible(self, tenant_id: str) -> None:
        """A task request refused for an infeasible deadline."""
        self.requests.labels(self._label(tenant_id), "rejected_infeasible").inc()

    def finished(self, tenant_id: str, task_id: str | None, attempt: int, status: str, m: Any) -> None:
        """One ended task or run request (`m`: its RequestMetrics, or None when it never ran)."""
        t = self._label(tenant_id)
        self.requests.labels(t, status).inc()
        if m is None:
            return
        tokens = max(m.prompt_tokens - m.cached_tokens, 0) + m.completion_tokens
        if status == "cancelled":
            self.wasted.labels(t, "cancelled").inc(tokens)
        if m.tokens_after_cancel:
            self.wasted.labels(t, "after_cancel").inc(m.tokens_after_cancel)
        if status == "completed" and task_id is not None:
            replaced = self._replaced.completed(tenant_id, task_id, attempt, tokens)
            if replaced:
                self.wasted.labels(t, "replaced").inc(replaced)
