"""The per-replica dispatch window (upstream/window.py): the engine's queue shrinks it, stale metrics count
as saturation, a full window over an empty engine queue grows, and it never leaves its bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from upstream import UpstreamSettings
from upstream.probe import ProbeResult
from upstream.replica import Replica
from upstream.window import BEST_HORIZON, QUEUE_TPOT_FACTOR, AdaptiveWindow, WindowReading


def full(window: AdaptiveWindow) -> AdaptiveWindow:
    window.in_flight = window.limit
    return window


def test_an_engine_queue_that_lasts_two_readings_shrinks_the_window_by_its_length() -> None:
    window = full(AdaptiveWindow(1, 64, 16))
    window.adapt(WindowReading(engine_queue=5, stale=False))
    assert window.limit == 16  # one reading: maybe only arrivals waiting for the engine's next step
    window.adapt(WindowReading(engine_queue=4, stale=False))
    assert window.limit == 12  # it lasted: the smaller of the two


def test_stale_metrics_count_as_a_saturated_engine() -> None:
    window = full(AdaptiveWindow(1, 64, 8))
    for _ in range(3):
        window.adapt(WindowReading(engine_queue=0, stale=True))
    assert window.limit == 5


def test_a_full_window_over_an_empty_engine_queue_grows_by_one_per_reading() -> None:
    window = full(AdaptiveWindow(1, 64, 8))
    window.adapt(WindowReading(engine_queue=0, stale=False))
    assert window.limit == 9


def test_a_window_with_room_does_not_grow() -> None:
    window = AdaptiveWindow(1, 64, 8)
    window.in_flight = 3
    window.adapt(WindowReading(engine_queue=0, stale=False))
    assert window.limit == 8


def test_without_metrics_a_slow_token_rate_shrinks_and_a_late_first_token_is_read_as_queueing() -> None:
    window = full(AdaptiveWindow(1, 64, 8))
    for _ in range(20):
        window.observe_tpot(0.01)
    for _ in range(20):
        window.observe_tpot(0.05)  # five times the best average: the engine is overloaded
    window.adapt(WindowReading(engine_queue=None, stale=False))
    assert window.limit == 7
    assert window.queued_in_engine(QUEUE_TPOT_FACTOR * 0.01 * 2)
    assert not window.queued_in_engine(0.01)
    window.engine_queued()
    assert window.limit == 6


def test_a_best_pace_from_a_quiet_moment_is_forgotten_so_a_busier_host_does_not_pin_the_floor() -> None:
    window = full(AdaptiveWindow(1, 8, 1))
    for _ in range(20):
        window.observe_tpot(0.004)  # warm-up on a quiet host
    for _ in range(2 * BEST_HORIZON):  # the same engine once the host is busy: over twice that, long
        window.observe_tpot(0.009)  # enough for the average's climb to it to leave the horizon too
    steps = []
    for _ in range(10):  # each ended request at the busy pace, now the best: a full window grows
        full(window).observe_tpot(0.009)
        window.adapt(WindowReading(engine_queue=None, stale=False))
        steps.append(window.limit)
    assert steps == [2, 3, 4, 5, 6, 7, 8, 8, 8, 8]
    for _ in range(3):  # and a pace twice the recent best still shrinks it
        full(window).observe_tpot(0.03)
        window.adapt(WindowReading(engine_queue=None, stale=False))
    assert window.limit < 8


@given(
    st.integers(1, 8),
    st.integers(8, 32),
    st.lists(st.tuples(st.none() | st.floats(0, 100), st.booleans(), st.booleans()), max_size=60),
)
def test_the_window_stays_within_its_bounds(
    low: int, high: int, readings: list[tuple[float | None, bool, bool]]
) -> None:
    window = AdaptiveWindow(low, high, low)
    for queue, stale, busy in readings:
        window.in_flight = window.limit if busy else 0
        window.adapt(WindowReading(queue, stale))
        assert low <= window.limit <= high


def test_an_engine_without_a_queue_gauge_starts_at_the_floor_and_stays_under_its_own_ceiling() -> None:
    settings = UpstreamSettings(window_min=2, window_start=16, window_max=64, window_max_unmetered=6)
    unmetered = Replica(ProbeResult("http://127.0.0.1:9", "openai", "m", 4096, None, False), settings)
    assert (unmetered.window.limit, unmetered.window.high) == (2, 6)
    for _ in range(40):  # tokens as fast as ever: a full window grows, one step per ended request ...
        full(unmetered.window).observe_tpot(0.01)
        unmetered.window.adapt(unmetered.reading(0.0))
    assert unmetered.window.limit == 6  # ... to the ceiling, not to window_max
    metered = Replica(ProbeResult("http://127.0.0.1:9", "vllm", "m", 4096, None, True), settings)
    assert (metered.window.limit, metered.window.high) == (16, 64)


def test_a_floor_above_the_unmetered_ceiling_is_refused() -> None:
    with pytest.raises(ValidationError, match="window_max_unmetered"):
        UpstreamSettings(window_min=9, window_start=9, window_max=64, window_max_unmetered=8)
