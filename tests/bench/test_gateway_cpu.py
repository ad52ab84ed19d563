"""`python -m bench.gateway_cpu`, run tiny: every server is measured, and the report has the ratios and the
per-token cost in their places (no timing is asserted: times belong to the benchmark)."""

from __future__ import annotations

import json

import pytest

from bench.gateway_cpu import main


def test_tiny_run_reports_the_ratio_to_the_floor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rounds", "1", "--requests", "16", "--concurrency", "2", "--stream-tokens", "4"]) == 0
    summary, _, raw = capsys.readouterr().out.strip().rpartition("\n")
    report = json.loads(raw)
    assert report["rounds"] == 1 and report["requests"] == 16
    for name in ("floor", "fairserve"):
        assert {"nonstream_ms", "stream_ms", "per_token_ms"} <= set(report[name])
    assert report["fairserve"]["nonstream_ratio"] > 0 and report["fairserve"]["stream_ratio"] > 0
    assert "vs floor" in summary and "4-token stream" in summary
