"""experiments/retry_storm.py on a small burst: the report adds up, and fairserve_client's calls are generated once each."""

from __future__ import annotations

import argparse

from experiments.retry_storm import run


def test_small_storm_report_adds_up_and_the_client_never_generates_twice() -> None:
    args = argparse.Namespace(
        clients=8,
        rounds=1,
        max_tokens=64,
        timeout=1.0,
        max_retries=5,
        max_num_seqs=2,
        tenant_queue=2,
        out=None,
    )
    report = run(args)
    rounds = {r["kind"]: r for r in report["rounds"]}
    assert set(rounds) == {"plain", "fairserve"}
    for r in rounds.values():
        assert r["ledger_rows"] == r["calls_with_a_row"] + r["duplicate_generations"]
        assert r["attempts"] >= r["calls"] and r["calls_with_a_row"] >= r["answered"]
        assert r["tokens_generated"] >= r["tokens_received"] == r["answered"] * 64
        assert r["responses_by_status"].get(429, 0) > 0  # the burst met the tenant's queue bound
    fs = rounds["fairserve"]
    assert fs["answered"] == fs["calls"] and fs["duplicate_generations"] == 0 and fs["wasted_tokens"] == 0
    assert report["totals"]["fairserve"]["duplicate_generations"] == 0
