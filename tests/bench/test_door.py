"""`python -m bench.door --quick`: every flood runs against a real `fairserve serve`, and the report says
what the equal-weight tenant got and what each flood got back."""

from __future__ import annotations

from bench.door import FLOODS, run


def test_quick_run_reports_every_flood() -> None:
    result = run(1.5, 1)
    assert result["alone"]["ok"] > 0
    for kind in FLOODS:
        assert 0.0 <= result[kind]["success_rate"] <= 1.0 and result[kind]["sent"] > 0
    assert result["queue"]["flood"].get("200", 0) > 0  # the flood is served too, within its share
    assert result["refusable"]["flood"].get("400", 0) > 0  # refused, never served
    assert "200" not in result["refusable"]["flood"]
    assert result["messages"]["flood"].get("400", 0) > 0 and "200" not in result["messages"]["flood"]
    assert result["slow_headers"]["flood"].get("closed_by_server", 0) > 0
    assert result["spoofed_xff"]["flood"].get("429", 0) > 0  # the spoofed header did not reset the budget
    assert (
        result["long_prefills_over_one"] > 0
    )  # issue 45's ratio: A beside 62 long-prompt loops over one loop
