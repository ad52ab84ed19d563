"""The submit-wake bench runs real ProcessEngine workers under each CPU policy it compares."""

from __future__ import annotations

import os

import pytest

from bench.diagnostics.submit_wake import measure


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is a Linux policy")
def test_each_mode_runs_its_worker_under_the_policy_it_names() -> None:
    report = measure(rate=40.0, seconds=0.5, rounds=1)
    assert report["normal"]["worker_policy"] == "SCHED_OTHER"
    assert (
        report["batch"]["worker_policy"] == "SCHED_BATCH"
    )  # EngineConfig.worker_batch_scheduling took effect
    for mode in report.values():
        assert mode["n"] == 20
        assert 0 < mode["p50_us"] <= mode["p90_us"] <= mode["p99_us"] <= mode["max_us"]  # type: ignore[operator]
