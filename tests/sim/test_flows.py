"""Two-level fair share on the real Scheduler (sim/flows.py): Sybil, fan-out, preemption victims."""

from __future__ import annotations

from collections import Counter

import pytest

from sim.flows import FlowsSetup, Stream, fan_out, run_streams, sybil
from sim.lift import BankedCreditSetup, banked_credit

# 40 blocks of 16 tokens for 8 seats of up to 128 tokens: admission outruns memory and preemption is common.
TIGHT = FlowsSetup(num_blocks=40)


@pytest.mark.parametrize("setup", [FlowsSetup(), TIGHT], ids=["roomy", "preempting"])
def test_many_users_do_not_multiply_a_tenants_share(setup: FlowsSetup) -> None:
    flat = sybil(setup, key="user")
    two_level = sybil(setup, key="tenant/user")
    print(f"\nsybil 24 users vs 1: flat user {flat['ratio']:.2f}:1, tenant/user {two_level['ratio']:.3f}:1")
    assert flat["ratio"] > 10  # the flat key hands the engine to whoever invents the most names
    assert two_level["ratio"] == pytest.approx(1.0, rel=0.1)
    if setup is TIGHT:
        assert two_level["preemptions"] > 0


def test_an_agents_fan_out_does_not_hold_back_its_tenants_chat() -> None:
    flat = fan_out(key="tenant")
    two_level = fan_out(key="tenant/workflow")
    print(
        f"\nfan-out: chat median {flat['chat_median_s']:.3f} s (tenant) vs {two_level['chat_median_s']:.3f} s "
        f"(tenant/workflow), tenants {flat['ratio']:.3f}:1 and {two_level['ratio']:.3f}:1"
    )
    for run in (flat, two_level):
        assert run["ratio"] == pytest.approx(1.0, rel=0.1)
    assert two_level["chat_median_s"] <= 0.5 * flat["chat_median_s"]
    # The bound behind it: the chat's flow is lifted to within the allowance below the agent's, so no agent
    # call of the same tenant is admitted while a chat request waits; under the flat key many are.
    assert two_level["agent_calls_ahead_of_chat_max"] == 0
    assert flat["agent_calls_ahead_of_chat_max"] > 5


def test_preemption_takes_the_most_served_flow_first() -> None:
    streams = [
        Stream("A", 20, 64, 64, workflow="agent"),
        Stream("A", 1, 32, 32, workflow="chat"),
        Stream("B", 20, 64, 64, workflow="b"),
    ]
    _, requests = run_streams(TIGHT, "tenant/workflow", streams)
    preempted: Counter[str | None] = Counter()
    sent: Counter[str | None] = Counter()
    for r in requests:
        preempted[r.meta.workflow_run_id] += len(r.preemptions)
        sent[r.meta.workflow_run_id] += 1
    assert preempted["agent"] > 0
    # The chat's flow trails its agent's, so the agent's calls are the tenant's victims.
    assert preempted["chat"] / sent["chat"] < 0.5 * preempted["agent"] / sent["agent"]


def test_the_lift_holds_at_the_inner_level_a_trickling_user_that_floods_leads_by_at_most_the_bound() -> None:
    """sim/lift.py scenario (a) with A, B and T as three users of one tenant under `tenant/user`."""
    report = banked_credit(BankedCreditSetup(key="tenant/user"))
    print(f"\ninner level: lead {report['lead']:.0f}, bound {report['bound']:.0f}")
    assert 0 < report["lead"] <= report["bound"]
