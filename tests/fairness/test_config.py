"""FairnessConfig validation, make_policy composition, and queue integrity under random operations."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from fairness import (
    POLICIES,
    EDFPolicy,
    FairnessConfig,
    FCFSPolicy,
    PolicyEntry,
    PriorityPolicy,
    VTCPolicy,
    make_policy,
)
from tests.fairness.stand_in import Job, Meta, drain, job
from tests.fairness.test_vtc import steady_state_cost


def test_the_engine_config_holds_the_fairness_config_itself() -> None:
    engine = EngineConfig.model_validate({"fairness": {"policy": "fcfs", "key": "user", "edf": True}})
    assert isinstance(engine.fairness, FairnessConfig)
    assert engine.fairness == FairnessConfig(policy="fcfs", key="user", edf=True)
    assert EngineConfig().fairness.policy == "vtc"


def test_a_registered_policy_is_accepted_and_built(monkeypatch: pytest.MonkeyPatch) -> None:
    class Lottery(FCFSPolicy[Any]):
        """A stand-in new policy: the registry line is all it needs."""

    with pytest.raises(ValueError, match="lottery"):
        FairnessConfig(policy="lottery")
    monkeypatch.setitem(POLICIES, "lottery", PolicyEntry("lottery", Lottery, True, "test"))
    assert isinstance(make_policy(FairnessConfig(policy="lottery", priority_classes=False)), Lottery)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"policy": "lottery"}, "policy"),
        ({"key": "ip"}, "key"),
        ({"w_in": -1.0}, "w_in"),
        ({"w_out": float("nan")}, "w_out"),
        ({"w_in": 0.0, "w_out": 0.0}, "never grow"),
        ({"max_queue_age_s": 0.0}, "max_queue_age_s"),
        ({"max_queue_age_s": float("nan")}, "max_queue_age_s"),
        ({"edf_": True}, "edf_"),
    ],
)
def test_bad_settings_are_refused_with_the_field_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FairnessConfig(**fields)


def test_make_policy_composes_what_the_config_asks_for() -> None:
    assert isinstance(make_policy(FairnessConfig(policy="fcfs", priority_classes=False)), FCFSPolicy)
    assert isinstance(make_policy(FairnessConfig(policy="vtc", priority_classes=False)), VTCPolicy)
    edf = make_policy(FairnessConfig(policy="vtc", priority_classes=False, edf=True))
    assert isinstance(edf, EDFPolicy) and isinstance(edf.base, VTCPolicy)
    layered = make_policy(FairnessConfig(policy="vtc", edf=True, max_queue_age_s=7.0))
    assert isinstance(layered, PriorityPolicy) and layered.max_queue_age_s == 7.0


def test_configured_prices_and_key_reach_the_policy() -> None:
    policy = make_policy(FairnessConfig(policy="vtc", key="api_key", w_in=3.0, w_out=5.0, w_cached=0.5))
    item = job("x", "acme", api_key_id="k1")
    policy.add(item, 0.0)
    policy.pop(item)
    assert policy.charge(item, 2, 1, 4) == 2 * 3.0 + 5.0 + 4 * 0.5
    assert set(policy.service()) == {"k1"}


ALL_CONFIGS = [
    FairnessConfig.model_validate({"policy": p, "priority_classes": c, "edf": e, "max_queue_age_s": 3.0})
    for p, c, e in itertools.product(["fcfs", "vtc"], [False, True], [False, True])
]

operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "front", "remove", "pop", "charge"]),
        st.integers(0, 30),  # request index
        st.integers(0, 3),  # tenant
        st.integers(0, 2),  # priority
        st.one_of(st.none(), st.floats(0, 50)),  # deadline
    ),
    max_size=80,
)


@pytest.mark.parametrize(
    "config", ALL_CONFIGS, ids=lambda c: f"{c.policy}-classes{c.priority_classes}-edf{c.edf}"
)
@settings(max_examples=60, deadline=None)
@given(ops=operations)
def test_queue_never_loses_or_duplicates_items(config: FairnessConfig, ops: list[Any]) -> None:
    policy = make_policy(config)
    queued: dict[str, Job] = {}
    now = 0.0
    for op, index, tenant, priority, deadline in ops:
        now += 0.5
        rid = f"r{index}"
        if op in ("add", "front"):
            if rid in queued:
                continue
            item = Job(
                rid, Meta(tenant_id=f"t{tenant}", priority=priority, deadline=deadline, arrival_time=now)
            )
            policy.add(item, now, front=op == "front")
            queued[rid] = item
        elif op == "remove":
            policy.remove(queued.pop(rid, None) or Job(rid, Meta()))
        elif op == "pop":
            head = policy.peek(now)
            assert (head is None) == (not queued)
            if head is not None:
                assert queued.pop(head.request_id) is head
                policy.pop(head)
        else:
            policy.charge(Job(rid, Meta(tenant_id=f"t{tenant}", priority=priority)), index, tenant, 0)
        assert len(policy) == len(queued)
        assert all(item in policy for item in queued.values())
    order = drain(policy, now)
    assert sorted(order) == sorted(queued)
    assert len(policy) == 0 and policy.peek(now) is None


def test_full_stack_admission_cost_does_not_grow_with_ten_times_more_waiting_items() -> None:
    def full() -> Any:
        return make_policy(FairnessConfig(policy="vtc", edf=True, max_queue_age_s=1e6))

    assert steady_state_cost(full(), waiting=5000, keys=20) <= 1.25 * steady_state_cost(full(), 500, keys=20)
