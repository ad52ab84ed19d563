"""bench.lora with tiny settings: every configuration runs and the charge comes from the policy's counters."""

from __future__ import annotations

import json
from pathlib import Path

from bench.lora import main


def test_tiny_run_reports_ratios_and_the_charge(tmp_path: Path) -> None:
    out = tmp_path / "lora.json"
    args = [
        "--adapters",
        "2",
        "--distinct",
        "1",
        "2",
        "--requests",
        "4",
        "--max-tokens",
        "2",
        "--rounds",
        "1",
    ]
    assert main([*args, "--fair-seqs", "2", "--fair-steps", "6", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    runs = {run["adapters"]: run for run in report["throughput"]}
    assert set(runs) == {0, 1, 2} and runs[0]["x_base"] == 1.0
    assert all(run["tokens_per_s"] > 0 and run["x_base_cpu"] > 0 for run in runs.values())
    assert runs[0]["x_base_cpu"] == 1.0
    charge = report["charge"]
    assert charge["service_scale"]["rank64"] > charge["service_scale"]["rank8"] > 1
    service = charge["charged_service"]
    assert service["rank8"] > 0 and service["rank64"] > 0
    assert charge["ratio_rank8_to_rank64"] == service["rank8"] / service["rank64"]
    assert sum(charge["output_tokens"].values()) > 0
    assert min(charge["unfinished"].values()) > 2  # both tenants backlogged to the end: over the 2 seats
