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
    full = q.try_enter("b", 1, None)
    assert isinstance(full, QueueFull) and full.scope == "global" and full.excess_tokens == 51
    big.release()
    assert q.queued() == 0 and q.queued_tokens() == 0


def test_bounds_validated() -> None:
    with pytest.raises(ValueError, match="max_queued_tokens"):
        AdmissionQueues(queue_bounds(max_queued_tokens=0))


def test_concurrent_entries_never_exceed_bound() -> None:
    q = AdmissionQueues(queue_bounds(max_queued_requests=50, default_tenant_queued_requests=1000))
    taken: list[QueueSlot] = []
    lock = threading.Lock()

    def enter() -> None:
        for _ in range(100):
            slot = q.try_enter("t", 1, None)
            if isinstance(slot, QueueSlot):
                with lock:
                    taken.append(slot)

    threads = [threading.Thread(target=enter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 50 == q.queued()
