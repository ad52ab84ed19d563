"""The VTC lift rule in the simulator: (a) no banked credit, (b) weights hold for closed-loop tenants.

Run with `-s` to see the figures docs/fairness.md quotes.
"""

from __future__ import annotations

from sim.lift import BankedCreditSetup, ClosedLoopSetup, banked_credit, closed_loop_weights


def test_a_trickling_key_that_floods_leads_by_at_most_the_vtc_bound() -> None:
    report = banked_credit(BankedCreditSetup())
    print(
        f"\n(a) banked credit: lead {report['lead']:.0f} service units, VTC bound {report['bound']:.0f} "
        f"(lead/bound = {report['lead_over_bound']:.3f}), lift_allowance {report['lift_allowance']:.0f}"
    )
    assert report["lead"] > 0  # the flood did get ahead, so the measurement saw it
    assert report["lead"] <= report["bound"]


def test_closed_loop_tenants_weighted_3_to_1_are_served_3_to_1() -> None:
    report = closed_loop_weights(ClosedLoopSetup())
    print(
        f"\n(b) closed-loop 3:1: served {report['ratio']:.3f}:1 (error {report['error']:.1%}), "
        f"lift_allowance {report['lift_allowance']:.0f}"
    )
    assert report["error"] <= 0.10


def test_the_papers_lift_erases_closed_loop_weights() -> None:
    """Why the allowance exists: lifting exactly to the backlogged minimum gives the weight-3 tenant far less."""
    report = closed_loop_weights(ClosedLoopSetup(lift_allowance=0.0))
    print(f"\n(b) with the paper's lift (allowance 0): served {report['ratio']:.3f}:1")
    assert report["error"] > 0.10
