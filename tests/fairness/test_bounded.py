"""Flat client-chosen keys (`--fairness-key user`): per-tenant state is bounded, forgetting is lossless."""

from __future__ import annotations

import random

import pytest

from fairness import FairnessConfig, make_policy
from fairness.bounded import BoundedVTCPolicy
from fairness.keys import user_key
from fairness.vtc import VTCPolicy
from tests.defaults import COST
from tests.fairness.stand_in import Job, Meta, Server, job

LIFT = 64.0


def bounded(cap: int) -> BoundedVTCPolicy[Job]:
    return BoundedVTCPolicy(COST, user_key, lift_allowance=LIFT, max_keys_per_tenant=cap)


def test_a_tenant_inventing_names_holds_at_most_its_cap() -> None:
    """3,000 requests under 3,000 user names remember at most `cap` of them; b's one user is untouched."""
    rng = random.Random(0)
    policy = bounded(8)
    server = Server(policy, capacity=64)
    for i in range(3000):
        server.submit(Job(f"a-{i}", Meta(tenant_id="a", user=f"sybil-{i}"), rng.randint(1, 8), 2))
        if i % 3 == 0:
            server.submit(Job(f"b-{i}", Meta(tenant_id="b", user="solo"), rng.randint(1, 8), 2))
        server.step()
        assert policy.keys_of("a") <= 8
    assert policy.keys_of("b") == 1
    assert policy.known() <= 8 + 1 + 2  # a's keys, b's user, and the tenants' own keys


def test_every_key_queued_at_the_cap_counts_a_new_name_as_the_tenant() -> None:
    """With a/u1 and a/u2 queued at a cap of 2, a third name is queued under "a" itself."""
    policy = bounded(2)
    for rid, user in (("r1", "u1"), ("r2", "u2"), ("r3", "u3")):
        policy.add(job(rid, "a", user=user), 0.0)
    assert policy.waiting() == {"a/u1": 1, "a/u2": 1, "a": 1}


def test_a_forgotten_key_returns_with_the_counter_it_would_have_had() -> None:
    """A user idle long enough to be forgotten comes back lifted exactly as under unbounded VTC."""
    plain: VTCPolicy[Job] = VTCPolicy(COST, user_key, lift_allowance=LIFT)
    small = bounded(1)
    for policy in (plain, small):
        early = job("early", "a", user="u1")
        policy.add(early, 0.0)
        policy.pop(early)
        policy.charge(early, 4, 0, 0)
        policy.finish(early)
        for i in range(20):  # b is served far past u1 + the allowance while u1 is idle
            busy = job(f"b{i}", "b", user="solo")
            policy.add(busy, 1.0 + i)
            policy.pop(busy)
            policy.charge(busy, 32, 0, 0)
            policy.finish(busy)
        policy.add(job("keep-b-backlogged", "b", user="solo"), 30.0)
        policy.add(job("other", "a", user="u2"), 31.0)  # at the cap of 1: u1 is forgotten for u2
    assert not small.holds("a/u1") and plain.holds("a/u1")
    for policy in (plain, small):
        policy.add(job("back", "a", user="u1"), 32.0)
    assert small.counter("a/u1") == pytest.approx(plain.counter("a/u1"))


def test_the_registry_bounds_flat_user_and_api_key_keys_only() -> None:
    """`--fairness-key user|api_key` get the bounded policy; `tenant` keeps plain VTC."""
    for key, bounded_kind in (("user", True), ("api_key", True), ("tenant", False)):
        config = FairnessConfig.model_validate(
            {"key": key, "priority_classes": False, "max_flows_per_tenant": 4}
        )
        policy = make_policy(config)
        assert isinstance(policy, BoundedVTCPolicy) is bounded_kind, key
