"""`python -m bench.report_poll --quick`: the pollers run against a real `fairserve serve` whose ledger holds
the polled task, and the report says what the other tenant got beside them and what the pollers got back."""

from __future__ import annotations

from pathlib import Path

from bench.report_poll import run

TREE = Path(__file__).resolve().parents[2]


def test_quick_run_reports_both_tenants() -> None:
    result = run(2.0, 1, 2000, 16, TREE)
    assert result["alone"]["ok"] > 0 and result["beside"]["ok"] > 0
    assert result["pollers"].get("200", 0) > 0  # the seeded task is found: the rows reached its report
    assert result["pollers"].get("429", 0) > 0  # and back-to-back polling meets the tenant's budget
    assert set(result["pollers"]) <= {"200", "429"}
    assert result["answers_kept"] > 0.0
