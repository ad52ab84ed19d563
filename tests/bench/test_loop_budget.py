"""`python -m bench.loop_budget --runs 1`: every piece of bounded loop work runs and is timed."""

from __future__ import annotations

from bench.loop_budget import run


def test_every_piece_is_timed() -> None:
    report = run(1)
    assert len(report) == 6
    for piece in report.values():
        assert 0 < piece["best_ms"] <= piece["median_ms"]
