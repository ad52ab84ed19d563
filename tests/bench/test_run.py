"""`fairserve bench --quick` against live servers: the report adds up (counts, percentiles, goodput), not its speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main
from tests.bench.conftest import LiveServer, check_report, check_section


def test_quick_bench_against_a_live_server_is_consistent(
    live_server: LiveServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    rc = main(
        [
            "bench",
            "--quick",
            "--url",
            live_server.url,
            "--api-key",
            live_server.api_key,
            "--metrics-token",
            live_server.metrics_token,
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = capfd.readouterr().out
    assert f"json: {out / 'report.json'}" in printed
    report = json.loads((out / "report.json").read_text())
    assert live_server.errors() == ""
    check_report(report, out)
    assert [s["workload"] for s in report["workloads"]] == ["chat", "mixed", "retrieval", "agent"]
    agent = report["workloads"][3]
    assert agent["cancellation"]["tasks"] > 0
    # The fan-out runs through fairserve_client's task(): its cancel reached the server's attempts.
    assert agent["cancellation"]["attempts_cancelled"] > 0
    # Cost per verified completion (#28): every tenant's engine tokens, the fan-out's waste per task.
    waste = agent["cost_per_outcome"]["wasted_tokens_per_task"]
    assert waste["tasks"] == agent["cancellation"]["tasks"] and waste["cancelled_branches"] > 0
    assert all(t["engine_tokens"] > 0 for t in agent["cost_per_outcome"]["tenants"].values())
    # Against a remote server the engine and policy can't be reconfigured: said so, not silently dropped.
    cmp = report["comparisons"]
    assert cmp["policy"]["note"].startswith("not measured:")
    assert cmp["gateway"]["note"].startswith("not measured:")


def test_self_started_bench_runs_the_comparisons(tmp_path: Path) -> None:
    out = tmp_path / "report"
    # A subprocess, as a user runs it: everything it prints (its peers' loggers included) is seen here.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "bench",
            "--quick",
            "--workload",
            "agent",
            "--duration",
            "2",
            "--sweep-rates",
            "4",
            "16",
            "--out",
            str(out),
            "--litellm-bin",
            str(tmp_path / "no-such-litellm"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=500,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    # A clean run raises no false alarm: an ERROR line that is no error teaches users to ignore errors.
    assert [line for line in done.stdout.splitlines() if "ERROR" in line] == []
    report = json.loads((out / "report.json").read_text())
    check_report(report, out)
    cmp = report["comparisons"]
    gw = cmp["gateway"]
    assert gw["in_process"]["n"] == gw["fairserve_gateway"]["n"] == gw["requests"]
    for path in ("in_process", "fairserve_gateway"):
        assert gw[path]["ttft_p50_ms"] <= gw[path]["ttft_p99_ms"] <= gw[path]["e2e_p99_ms"]
    assert "added_ttft_p50_ms" in gw["fairserve_gateway"]
    # Each comparison keeps its rounds and gives a number only when they agree within the effect.
    assert len(gw["fairserve_gateway"]["added_ttft_p50_verdict"]["rounds"]) == gw["rounds"] == 3
    policy = cmp["policy"]["rows"]
    assert [r["changed"] for r in policy] == ["-", "policy", "chunked prefill"]
    for row in policy:
        check_section(row["run"])
    engine_rows = {r["system"]: r for r in cmp["engine"]["rows"]}
    assert engine_rows["fairserve"]["tokens_per_s"] > 0
    assert all("tokens_per_s" in r or r["note"].startswith("not measured") for r in engine_rows.values())
    markdown = (out / "report.md").read_text()
    peers = [name for name in engine_rows if name != "fairserve"]
    assert len(peers) == 2
    for peer in peers:
        verdict = engine_rows[peer]["verdict"]
        assert len(verdict["rounds"]) == len(engine_rows[peer]["rounds_tokens_per_s"]) == 3
        assert ("fairserve_speedup" in engine_rows[peer]) == verdict["conclusive"]
        assert verdict["text"].startswith("inconclusive (rounds") != verdict["conclusive"]
        assert verdict["text"] in markdown
