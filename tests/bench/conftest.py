"""A live `fairserve serve` subprocess on a free 127.0.0.1 port, and the checks every bench report must pass."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.serve_process import ServeProcess


@dataclass
class LiveServer:
    """A running `fairserve serve`: its URL and the demo tenant's API key."""

    url: str
    api_key: str
    metrics_token: str
    log: list[str]  # the server's output so far, for failure messages

    def errors(self) -> str:
        """The server's ERROR lines and tracebacks, to put beside an assertion about what it recorded."""
        return "".join(
            line for line in self.log if "ERROR" in line or "Traceback" in line or "Error:" in line
        )


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`fairserve serve --port 0` with embedded defaults; stopped with SIGTERM after the module."""
    server = ServeProcess(tmp_path_factory.mktemp("serve-data"), timeout=180)
    try:
        yield LiveServer(server.url, server.banner["api_key"], server.banner["metrics_token"], server.output)
    finally:
        server.stop()


def _ordered(p: dict[str, Any], where: str) -> None:
    if p["n"]:
        assert p["p50"] <= p["p95"] <= p["p99"], f"{where}: percentiles out of order {p}"
    else:
        assert p["p50"] is None and p["p99"] is None, f"{where}: percentiles without samples"


def check_section(s: dict[str, Any]) -> None:
    """Internal consistency of one run section, checked from the raw numbers (not the bench's own checker)."""
    where = f"{s['workload']} @ {s['rate']}"
    c, a = s["counts"], s["achieved"]
    assert c["sent"] > 0, where
    assert c["sent"] == c["accepted"] + c["rejected"] + c["failed"], where
    assert c["accepted"] == c["completed"] + c["cancelled"] + c["ended_otherwise"], where
    assert sum(c["rejected_by_reason"].values()) == c["rejected"], where
    assert sum(t["sent"] for t in s["tenants"].values()) == c["sent"], where
    assert sum(t["completed"] for t in s["tenants"].values()) == c["completed"], where
    for name in ("ttft", "tpot", "e2e"):
        _ordered(s["latency_s"][name], f"{where} {name}")
    for tenant, t in s["tenants"].items():
        _ordered(t["ttft"], f"{where} {tenant} ttft")
    assert 0 <= a["goodput_requests_per_s"] <= a["requests_per_s"] <= a["completed_per_s"] + 1e-9, where
    assert a["good"] <= a["useful"] <= c["completed"], where
    assert a["requests_per_s"] == pytest.approx(a["useful"] / s["window_s"]), where
    # The server recorded every request it accepted exactly once, with the status the client saw.
    server = s["server"]["requests_by_status"]
    assert sum(server.values()) == c["accepted"], f"{where}: server {server} vs client {c}"
    assert server.get("completed", 0) == c["completed"], where
    assert server.get("cancelled", 0) == c["cancelled"], where
    assert sum(s["server"]["admission_rejections_by_reason"].values()) >= c["rejected"], where
    if s["server"]["kv_occupancy_peak"] is not None:
        assert 0 <= s["server"]["kv_occupancy_mean"] <= s["server"]["kv_occupancy_peak"] <= 1, where
    cancel = s.get("cancellation")
    if cancel:
        assert cancel["attempts_cancelled"] <= cancel["attempts_cancel_sent"], where
        assert cancel["attempts_cancelled"] == c["cancelled"], where
        assert cancel["tasks_with_a_kept_attempt"] <= cancel["tasks"], where
        assert cancel["tokens_computed_after_cancel"] >= 0, where


def check_report(report: dict[str, Any], out: Path) -> None:
    """The whole report: every section, the sweep, the outputs on disk."""
    assert report["consistency_problems"] == []
    sections = [*report["workloads"], report["closed_loop"], *report["sweep"]["points"]]
    for s in sections:
        check_section(s)
    assert (
        report["closed_loop"]["mode"].startswith("closed loop")
        and "comparison only" in report["closed_loop"]["mode"]
    )
    assert all(s["mode"] == "open loop" for s in report["workloads"])
    offered = [p["offered"]["requests_per_s"] for p in report["sweep"]["points"]]
    rates = [p["rate"] for p in report["sweep"]["points"]]
    assert rates == sorted(rates) and len(set(rates)) == len(rates)
    cap = report["sweep"]["capacity"]
    if cap is not None:
        assert cap["offered_requests_per_s"] in offered
    md = (out / "report.md").read_text()
    assert "| workload | offered req/s" in md and "## Load sweep through the knee" in md
    for s in report["workloads"]:
        assert f"| {s['workload']} (open loop)" in md
    for name in report["plots"].values():
        blob = (out / name).read_bytes()
        assert blob[:8] == b"\x89PNG\r\n\x1a\n" and len(blob) > 5000, name
    decl = report["declaration"]
    for key in ("model", "dtype", "hardware", "engine", "cache_state", "arrivals", "workloads"):
        assert decl[key], key
