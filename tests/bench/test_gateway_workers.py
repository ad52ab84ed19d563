"""`python -m bench.gateway_workers`, run tiny: one engine, a 1-worker and a 2-worker gateway, every stream's
tokens counted (no timing is asserted: times belong to the benchmark)."""

from __future__ import annotations

import json

import pytest

from bench.gateway_workers import main
from tests.billing.services import require


def test_tiny_run_reports_tokens_and_cores_for_each_worker_count(capsys: pytest.CaptureFixture[str]) -> None:
    require("127.0.0.1", 6379, "Redis")
    args = ["--rounds", "2", "--seconds", "1", "--concurrency", "2", "--stream-tokens", "4"]
    args += ["--redis", "redis://127.0.0.1:6379/14"]
    assert main(args) == 0
    summary, _, raw = capsys.readouterr().out.strip().rpartition("\n")
    report = json.loads(raw)
    assert report["rounds"] == 2 and report["stream_tokens"] == 4
    for n in (1, 2):
        row = report[f"workers_{n}"]
        assert row["tokens_per_s"] > 0 and row["gateway_us_per_token"] > 0
        assert {"gateway_cores", "engine_cores", "client_cores"} <= set(row)
        assert f"--workers {n}:" in summary
    assert len(report["tokens_per_s_2_over_1"]) == 2
