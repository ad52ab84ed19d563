"""vtc-locality in the simulator (real Scheduler, real BlockPool, real prefix hits): on a prefix-heavy
workload it serves more than plain VTC, and its service spread stays inside VTC's bound plus Δ."""

from __future__ import annotations

import json

from sim.locality import LocalitySetup, locality_scenario


def test_locality_raises_throughput_within_the_stated_bound() -> None:
    setup = LocalitySetup(duration_s=20.0)
    report = locality_scenario(setup)
    print(json.dumps(report, indent=2))  # the figures docs/fairness.md quotes (pytest -s)
    vtc, local = report["vtc"], report["vtc-locality"]
    assert report["throughput_ratio"] >= 1.3
    assert local["cached_share"] > vtc["cached_share"]
    assert local["max_service_difference"] <= setup.vtc_bound() + setup.locality_slack
    # Sharper than the bound: the spread grows by at most Δ over what VTC itself showed on this workload.
    assert local["max_service_difference"] <= vtc["max_service_difference"] + setup.locality_slack


def test_zero_slack_is_plain_vtc() -> None:
    report = locality_scenario(LocalitySetup(duration_s=5.0, locality_slack=0.0))
    assert report["vtc-locality"] == report["vtc"]
