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
    for name in ("floor", "waiting_floor", "fairserve"):
        assert {"nonstream_ms", "stream1_ms", "stream_ms", "per_token_ms"} <= set(report[name])
    fairserve, waiting = report["fairserve"], report["waiting_floor"]
    assert fairserve["nonstream_ratio"] > 0 and fairserve["stream_ratio"] > 0
    # The waiting floor was paced by what fairserve's requests took (a probe: a wait, never zero).
    assert waiting["tick_ms"] > 0 and waiting["reply_ticks"] >= 1
    assert fairserve["nonstream_ratio_waiting"] > 0 and fairserve["stream_ratio_waiting"] > 0
    assert "vs floor" in summary and "vs waiting floor" in summary and "4-token stream" in summary


def test_the_waiting_floor_can_be_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--rounds",
        "1",
        "--requests",
        "8",
        "--concurrency",
        "2",
        "--stream-tokens",
        "2",
        "--waiting-floor",
        "0",
    ]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out.strip().rpartition("\n")[2])
    assert "waiting_floor" not in report and "nonstream_ratio_waiting" not in report["fairserve"]
