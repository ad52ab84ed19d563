"""Report arithmetic on hand-built outcomes: counts, percentiles, goodput, the capacity point, the checker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import plots
from bench.loadgen import LoadResult, Outcome
from bench.probe import Timeline, parse_metrics
from bench.report import capacity_point, consistency_problems, percentiles, summarise
from bench.workloads import WORKLOADS, offered_tokens, plan

METRICS = """# TYPE fairserve_requests_total counter
fairserve_requests_total{tenant="steady",status="completed"} %d
# TYPE fairserve_charged_service_total counter
fairserve_charged_service_total{tenant="steady"} %d
"""


def _outcome(
    i: int,
    status: int = 200,
    reason: str | None = "length",
    ttft: float = 0.1,
    e2e: float = 0.5,
    code: str | None = None,
) -> Outcome:
    return Outcome(
        f"r{i}",
        "steady",
        sent_at=float(i),
        status=status,
        error_code=code,
        first_token_at=i + ttft,
        end_at=i + e2e,
        completion_tokens=10,
        finish_reason=reason if status == 200 else None,
    )


def _section(outcomes: list[Outcome], timeline: Timeline | None = None) -> dict[str, Any]:
    w = WORKLOADS["chat"]
    before = parse_metrics(METRICS % (0, 0))
    after = parse_metrics(METRICS % (sum(o.accepted for o in outcomes), 300))
    return summarise(
        w,
        plan(w, 2.0, 5.0),
        2.0,
        5.0,
        LoadResult(outcomes, 0.0, 5.0, 10.0),
        before,
        after,
        timeline or Timeline(),
    )


def test_counts_goodput_and_percentiles_add_up() -> None:
    outcomes = [_outcome(i) for i in range(6)] + [
        _outcome(6, e2e=9.0),
        _outcome(7, reason="cancelled"),
        _outcome(8, 429, code="tenant_queue_full"),
        _outcome(9, 503, code="overloaded"),
    ]
    s = _section(outcomes)
    c = s["counts"]
    assert (c["sent"], c["accepted"], c["rejected"], c["completed"], c["cancelled"]) == (10, 8, 2, 7, 1)
    assert c["rejected_by_reason"] == {"overloaded": 1, "tenant_queue_full": 1}
    assert s["achieved"]["good"] == 6  # the 9 s completion misses the 5 s objective
    assert s["achieved"]["goodput_requests_per_s"] == pytest.approx(0.6)
    assert s["achieved"]["requests_per_s"] == pytest.approx(0.7)
    assert s["tenants"]["steady"]["charged_service"] == 300
    assert s["server"]["requests_by_status"] == {"completed": 8}
    assert consistency_problems(s) == []


def test_checker_catches_broken_counts() -> None:
    s = _section([_outcome(i) for i in range(3)])
    s["counts"]["sent"] += 1
    s["achieved"]["goodput_requests_per_s"] = s["achieved"]["requests_per_s"] + 1
    problems = consistency_problems(s)
    assert any("sent" in p for p in problems) and any("goodput" in p for p in problems)


def test_percentiles() -> None:
    p = percentiles([float(x) for x in range(1, 101)])
    assert p["p50"] == pytest.approx(50.5) and p["p99"] == pytest.approx(99.01) and p["n"] == 100
    assert percentiles([])["p50"] is None


def _point(rate: float, offered: float, achieved: float, good: float, rejected: int = 0) -> dict[str, Any]:
    return {
        "rate": rate,
        "offered": {"requests_per_s": offered},
        "counts": {"sent": 100, "rejected": rejected},
        "achieved": {
            "requests_per_s": achieved,
            "goodput_requests_per_s": good,
            "goodput_fraction": good / achieved if achieved else 0.0,
        },
    }


def test_capacity_point_is_before_goodput_falls() -> None:
    sweep = [_point(5, 5, 5, 5), _point(10, 10, 10, 9.8), _point(20, 20, 15, 14.5), _point(40, 40, 16, 4)]
    cap = capacity_point(sweep)
    assert cap is not None and cap["rate"] == 10  # 20/s still completes within SLO but cannot keep up
    assert capacity_point([_point(40, 40, 16, 4)]) is None


def test_tenants_carry_offered_tokens_and_how_long_they_were_backlogged() -> None:
    # Four samples of the engine queue: steady waits in two, noisy in one, interactive never.
    timeline = Timeline(waiting=[{"steady": 2.0}, {}, {"steady": 1.0, "noisy": 3.0}, {"noisy": 0.0}])
    s = _section([_outcome(i) for i in range(3)], timeline)
    ts = s["tenants"]
    assert {n: t["backlogged_fraction"] for n, t in ts.items()} == {
        "steady": 0.5,
        "interactive": 0.0,
        "noisy": 0.25,
    }
    w = WORKLOADS["chat"]
    planned = plan(w, 2.0, 5.0)
    for name, t in ts.items():
        mine = offered_tokens([p for p in planned if p.tenant == name])
        assert (t["offered_prompt_tokens"], t["offered_output_tokens"]) == mine
    assert sum(t["offered_output_tokens"] for t in ts.values()) == offered_tokens(planned)[1]
    assert _section([_outcome(0)])["tenants"]["steady"]["backlogged_fraction"] is None  # no samples


def test_tenants_plot_uses_the_engines_charge_weights(tmp_path: Path) -> None:
    engine = {"fairness": {"w_in": 1.0, "w_out": 3.0}}
    assert plots.charge_weights(engine) == (1.0, 3.0, False)
    assert plots.charge_weights("remote server")[2] is True  # assumed defaults, and said so
    s = _section([_outcome(i) for i in range(3)], Timeline(waiting=[{"steady": 1.0}]))
    blob = plots.tenants([s], tmp_path / "tenants.png", engine).read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n"
