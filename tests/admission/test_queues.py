from __future__ import annotations

import threading

import pytest

from admission.queues import AdmissionQueues, QueueFull, QueueSlot
from tests.defaults import queue_bounds


def test_tenant_bound_then_release_frees_a_slot() -> None:
    q = AdmissionQueues(queue_bounds(max_queued_requests=10, default_tenant_queued_requests=2))
    a1 = q.try_enter("a", 5, None)
    a2 = q.try_enter("a", 5, None)
    assert isinstance(a1, QueueSlot) and isinstance(a2, QueueSlot)
    full = q.try_enter("a", 5, None)
    assert isinstance(full, QueueFull) and full.scope == "tenant"
    assert isinstance(q.try_enter("b", 5, None), QueueSlot)
    a1.start()
    a1.release()  # idempotent: counted once
    assert q.queued("a") == 1
    assert isinstance(q.try_enter("a", 5, None), QueueSlot)


def test_explicit_tenant_bound_overrides_default() -> None:
    q = AdmissionQueues(queue_bounds(default_tenant_queued_requests=1))
    assert isinstance(q.try_enter("a", 1, 3), QueueSlot)
    assert isinstance(q.try_enter("a", 1, 3), QueueSlot)


def test_global_token_bound() -> None:
    q = AdmissionQueues(queue_bounds(max_queued_requests=10, max_queued_tokens=100))
    big = q.try_enter("a", 150, None)  # alone, a large request may enter
    assert isinstance(big, QueueSlot)
    full = q.try_enter("a", 1, None)  # a is over its share: nobody to push out
    assert isinstance(full, QueueFull) and full.scope == "share" and full.excess_tokens == 51
    big.release()
    assert q.queued() == 0 and q.queued_tokens() == 0


def test_flood_of_large_prompts_cannot_lock_out_an_equal_tenant() -> None:
    """The #25 flood: 64 x 2,047 tokens fill the token bound; the other tenant still gets in, and the
    flood's newest request is the one pushed out (its callback told)."""
    q = AdmissionQueues(queue_bounds(max_queued_tokens=131072))  # the bound #25 was found with
    told: list[QueueSlot] = []
    flood = []
    for _ in range(64):
        slot = q.try_enter("b", 2047, 64)
        assert isinstance(slot, QueueSlot)
        slot.on_push_out = told.append
        flood.append(slot)
    assert isinstance(q.try_enter("b", 2047, 65), QueueFull)  # b alone borrowed everything
    for n in range(1, 20):
        assert isinstance(q.try_enter("a", 100, None), QueueSlot)
        assert q.queued("a") == n
    assert told == flood[-len(told) :] and all(s.pushed_out for s in told)
    assert told[0] is flood[-1]  # newest first
    assert q.queued_tokens() <= 131072


def test_weights_divide_the_bound_and_at_share_is_503() -> None:
    q = AdmissionQueues(queue_bounds(max_queued_requests=4, default_tenant_queued_requests=3))
    heavy = [q.try_enter("h", 1, None, weight=3.0) for _ in range(3)]
    light = q.try_enter("l", 1, None, weight=1.0)
    assert all(isinstance(s, QueueSlot) for s in [*heavy, light])
    # h holds 3 of its 3 (weight 3 of 4); l holds 1 of its 1: everyone at share, so l's next is refused
    # as over its share (429), and a newcomer's first request, over its share of a full queue, as global (503).
    again = q.try_enter("l", 1, None, weight=1.0)
    assert isinstance(again, QueueFull) and again.scope == "share"
    newcomer = q.try_enter("n", 1, None, weight=1.0)
    assert isinstance(newcomer, QueueFull) and newcomer.scope == "global"
    assert not any(isinstance(s, QueueSlot) and s.pushed_out for s in heavy)
    assert not q.could_enter("l", 1.0) and not q.could_enter("new", 1.0)


def test_released_slot_is_never_pushed_out() -> None:
    q = AdmissionQueues(queue_bounds(max_queued_requests=2, default_tenant_queued_requests=1))
    old = q.try_enter("a", 1, 5)
    new = q.try_enter("a", 1, 5)
    assert isinstance(old, QueueSlot) and isinstance(new, QueueSlot)
    new.start()
    assert isinstance(q.try_enter("a", 1, 5), QueueSlot)
    assert isinstance(q.try_enter("b", 1, None), QueueSlot)
    assert not new.pushed_out and q.queued() == 2


def test_bounds_validated() -> None:
    with pytest.raises(ValueError, match="max_queued_tokens"):
        AdmissionQueues(queue_bounds(max_queued_tokens=0))
    defaults = queue_bounds()  # one tenant's default can take neither bound whole at a 2,048-token context
    assert defaults.default_tenant_queued_requests < defaults.max_queued_requests
    assert defaults.default_tenant_queued_requests * 2048 < defaults.max_queued_tokens


def test_concurrent_entries_never_exceed_bound() -> None:
    q = AdmissionQueues(queue_bounds(max_queued_requests=50, default_tenant_queued_requests=10))
    taken: list[QueueSlot] = []
    lock = threading.Lock()

    def enter() -> None:
        for _ in range(100):
            slot = q.try_enter("t", 1, 1000)
            if isinstance(slot, QueueSlot):
                with lock:
                    taken.append(slot)

    threads = [threading.Thread(target=enter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 50 == q.queued()


def test_push_out_ties_rotate_between_equally_loaded_tenants() -> None:
    """Issue 45: A and C hold equal queues and refill what they lose (closed loops); each arrival of B, under
    its share, pushes one out. The hits take turns instead of all landing on A, the earliest backlogged."""
    q = AdmissionQueues(queue_bounds(max_queued_requests=64, default_tenant_queued_requests=64))
    told: list[QueueSlot] = []

    def enter(tenant: str) -> QueueSlot:
        slot = q.try_enter(tenant, 10, None)
        assert isinstance(slot, QueueSlot)
        slot.on_push_out = told.append
        return slot

    for _ in range(32):
        enter("a")
        enter("c")
    for _ in range(16):
        enter("b").start()  # B's request pushes one out, then starts and leaves the queue
        enter(told[-1].tenant_id)  # the tenant that lost a slot sends again into the room B's start left
        assert q.queued("a") == q.queued("c") == 32
    hits = [slot.tenant_id for slot in told]
    assert len(hits) == 16 and hits.count("a") == hits.count("c") == 8
