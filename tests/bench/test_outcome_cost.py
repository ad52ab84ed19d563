"""Cost per verified completion and fan-out waste per task (bench/report.py, rendered by bench/markdown.py)."""

from __future__ import annotations

import pytest

from bench.loadgen import Outcome
from bench.markdown import cost_lines
from bench.report import cost_per_outcome
from bench.workloads import WORKLOADS


def attempt(
    rid: str, task: str | None, reason: str, prompt: int, cached: int, out: int, kept: bool
) -> Outcome:
    o = Outcome(rid, "agents", 0.0, status=200, finish_reason=reason, task_id=task, kept=kept)
    o.prompt_tokens, o.cached_tokens, o.completion_tokens = prompt, cached, out
    return o


def test_agent_tasks_cost_their_kept_answer_plus_cancelled_branches_and_retries() -> None:
    workload = WORKLOADS["agent"]
    tenant = workload.tenants[0].name
    outcomes = [
        attempt("t1-a", "t1", "length", 100, 20, 50, True),  # 130 engine tokens, kept and within the SLO
        attempt("t1-b", "t1", "cancelled", 100, 0, 10, False),  # 110 in a cancelled branch
        attempt("t1-c", "t1", "length", 100, 0, 50, False),  # 150: an answer produced and not kept
        attempt("t2-a", "t2", "length", 80, 0, 20, True),  # 100, kept but missed the SLO: not verified
        attempt("t2-b", "t2", "cancelled", 80, 80, 5, False),  # 5: the prompt came from the cache
    ]
    for o in outcomes:
        o.tenant = tenant
    refused = Outcome("t3-a", tenant, 0.0, status=503, task_id="t3")  # never computed: costs nothing
    cost = cost_per_outcome([*outcomes, refused], workload, good={"t1-a"})
    mine = cost["tenants"][tenant]
    assert mine["verified_completions"] == 1
    assert mine["engine_tokens"] == 130 + 110 + 150 + 100 + 5
    assert mine["engine_tokens_per_verified"] == pytest.approx(495.0)
    waste = cost["wasted_tokens_per_task"]
    assert waste["tasks"] == 3
    assert waste["cancelled_branches"] == pytest.approx((110 + 5) / 3)
    assert waste["retries"] == pytest.approx(150 / 3)
    text = "\n".join(cost_lines([{"workload": "agent", "cost_per_outcome": cost}]))
    assert f"| agent | {tenant} | 1 | 495 | 495 |" in text and "cancelled branches" in text


def test_without_fan_out_there_is_no_waste_section_and_no_verified_means_no_ratio() -> None:
    workload = WORKLOADS["chat"]
    tenant = workload.tenants[0].name
    done = attempt("c1", None, "length", 10, 0, 10, False)
    done.tenant = tenant
    cost = cost_per_outcome([done], workload, good=set())
    assert "wasted_tokens_per_task" not in cost
    assert cost["tenants"][tenant]["engine_tokens_per_verified"] is None
