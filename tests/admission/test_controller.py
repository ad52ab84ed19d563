from __future__ import annotations

import random

from admission.controller import AdmissionController, Admitted, Rejection
from tests.admission.stats import Stats
from tests.defaults import admission_settings

NOW = 1_000.0


def controller(**bounds: int) -> AdmissionController:
    return AdmissionController(admission_settings(retry_jitter=0.0, **bounds), random.Random(0))


def test_passed_deadline_is_408() -> None:
    out = controller().admit("a", 10, 1, NOW - 0.001, NOW, Stats())
    assert isinstance(out, Rejection) and out.status == 408 and out.code == "deadline_passed"
    assert controller().queues.queued() == 0


def test_infeasible_deadline_is_503_with_estimate_and_retry() -> None:
    stats = Stats(waiting=5, waiting_by_tenant={"b": 5}, waiting_tokens=5000, prefill_tokens_per_s=1000.0)
    c = controller()
    out = c.admit("a", 10, 1, NOW + 0.5, NOW, stats)
    assert isinstance(out, Rejection)
    assert (out.status, out.code) == (503, "deadline_infeasible")
    # FCFS-or-fair, a alone: b's 5 requests interleave at most one ahead -> 1000 tokens = 1 s.
    assert out.estimated_start_ms is not None and out.estimated_start_ms >= 1000
    assert out.retry_after_s is not None and out.retry_after_s >= 1
    assert c.queues.queued() == 0


def test_a_deadline_its_own_run_cannot_meet_is_400_without_retry() -> None:
    # An empty queue: 10 prompt tokens and 100 decode steps of the priors' iteration time take longer than
    # the 0.05 s left, so waiting cannot help.
    c = controller()
    out = c.admit("a", 10, 100, NOW + 0.05, NOW, Stats())
    assert isinstance(out, Rejection)
    assert (out.status, out.code, out.retryable, out.retry_after_s) == (
        400,
        "deadline_unmeetable",
        False,
        None,
    )
    assert out.param == "max_tokens" and "idle engine" in out.message
    assert c.queues.queued() == 0


def test_feasible_deadline_admits_and_takes_slot() -> None:
    c = controller()
    out = c.admit("a", 10, 4, NOW + 5.0, NOW, Stats())
    assert isinstance(out, Admitted)
    assert c.queues.queued("a") == 1
    out.slot.release()
    assert c.queues.queued("a") == 0


def test_tenant_queue_429_push_out_then_global_503() -> None:
    c = controller(max_queued_requests=3, default_tenant_queued_requests=2)
    held = [c.admit("a", 1, 1, None, NOW, Stats()) for _ in range(2)]
    assert all(isinstance(h, Admitted) for h in held)
    over = c.admit("a", 1, 1, None, NOW, Stats())
    assert isinstance(over, Rejection) and over.status == 429 and over.code == "tenant_queue_full"
    assert isinstance(c.admit("b", 1, 1, None, NOW, Stats()), Admitted)
    # Full (3 of 3): c is under its share (1 of 3), a is over it (2 of 1): a's newest request makes room.
    assert isinstance(c.admit("c", 1, 1, None, NOW, Stats()), Admitted)
    first, newest = (h.slot for h in held if isinstance(h, Admitted))
    assert newest.pushed_out and not first.pushed_out and c.queues.queued("a") == 1
    # Every backlogged tenant is at its share now: a fourth tenant gets the 503.
    glob = c.admit("d", 1, 1, None, NOW, Stats())
    assert isinstance(glob, Rejection) and glob.status == 503 and glob.code == "overloaded"
    assert glob.retry_after_s is not None and glob.retry_after_s >= 1
    pushed = c.pushed_out(newest, Stats(waiting=1, waiting_tokens=1000, prefill_tokens_per_s=1000.0))
    assert (pushed.status, pushed.code) == (429, "pushed_out") and pushed.retry_after_s is not None


def test_retry_after_tracks_drain_estimate() -> None:
    c = controller(max_queued_requests=1)
    assert isinstance(c.admit("a", 1, 1, None, NOW, Stats()), Admitted)
    slow = Stats(waiting=1, waiting_tokens=10_000, prefill_tokens_per_s=1000.0)
    out = c.admit("b", 1, 1, None, NOW, slow)
    assert isinstance(out, Rejection)
    assert out.retry_after_s == 10  # one request of 10k tokens at 1k tokens/s, no jitter


def test_shed_only_when_global_request_bound_reached() -> None:
    c = controller(max_queued_requests=2)
    assert c.shed(Stats(), "c") is None
    held = [c.admit(t, 1, 1, None, NOW, Stats()) for t in ("a", "b")]
    assert all(isinstance(h, Admitted) for h in held)
    assert c.shed(Stats(), "a") is not None  # at its share (1 of 1)
    out = c.shed(Stats(waiting=2, waiting_tokens=2000, prefill_tokens_per_s=1000.0), "c")
    assert isinstance(out, Rejection) and out.code == "overloaded" and out.retry_after_s == 1
    assert c.queues.queued() == 2  # shedding takes no slot
