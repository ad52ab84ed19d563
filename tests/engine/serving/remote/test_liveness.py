"""A peer's silence counts only over time the checking side itself was running (engine/serving/remote/liveness.py)."""

from __future__ import annotations

import queue
from typing import Any

import zmq

from engine.serving.remote.gateways import GatewayLink, PeerLost
from engine.serving.remote.liveness import StallClock

GATEWAY = b"gateway-1"


def test_a_gap_between_checks_over_the_bound_is_a_stall_and_a_short_one_is_not() -> None:
    clock = StallClock(stall_s=1.0)
    assert clock.stalled(10.0) == 0.0  # the first check has nothing to compare with
    assert clock.stalled(10.5) == 0.0
    assert clock.stalled(14.0) == 3.5
    assert clock.stalled(14.1) == 0.0


def _link(inbox: queue.Queue[Any], timeout_s: float) -> tuple[GatewayLink, zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    link = GatewayLink(ctx, router, f"inproc://outbox-{id(inbox)}", inbox, lambda _: None, timeout_s)  # type: ignore[arg-type,return-value]
    return link, ctx


def _reaped_at(link: GatewayLink, inbox: queue.Queue[Any], times: list[float]) -> float | None:
    """Check the clocks at each of `times` (the socket thread's ticks); when the gateway was reaped."""
    for now in times:
        link._keep_time(now)
        if not inbox.empty():
            lost = inbox.get_nowait()
            assert isinstance(lost, PeerLost) and lost.peer == GATEWAY
            return now
    return None


def test_an_engine_stopped_past_the_gateway_timeout_does_not_reap_a_gateway_on_waking() -> None:
    for stopped in (False, True):
        inbox: queue.Queue[Any] = queue.Queue()
        link, ctx = _link(inbox, timeout_s=3.0)
        try:
            link._heard[GATEWAY] = 100.0  # the gateway's last word, then nothing from it
            ticks = [100.0 + i * 0.05 for i in range(11)]  # running, up to 100.5
            if stopped:
                ticks.append(110.0)  # then stopped (SIGSTOP) for 9.5 s
                ticks += [110.0 + i * 0.05 for i in range(1, 100)]
            else:
                ticks += [100.5 + i * 0.05 for i in range(1, 100)]
            reaped = _reaped_at(link, inbox, ticks)
            if stopped:
                # Silent 0.5 s before the stop, so reaped 2.5 s after waking, not at once.
                assert reaped is not None and 112.5 < reaped <= 112.5 + 0.2
            else:
                assert reaped is not None and 103.0 < reaped <= 103.0 + 0.2
        finally:
            link._pull.close(linger=0)
            ctx.destroy(linger=0)
