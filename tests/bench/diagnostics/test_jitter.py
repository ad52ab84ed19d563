"""The machine-jitter probe measures real time: calibrated busy slices and real sleeps."""

from __future__ import annotations

from bench.diagnostics.jitter import busy_slices, oversleeps, pct


def test_busy_slices_are_calibrated_and_sleeps_never_return_early() -> None:
    slices = busy_slices(0.3, slice_ms=2.0)
    durations = [d for _, d in slices]
    assert len(slices) >= 10 and all(d > 0 for d in durations)
    assert 0.001 <= pct(durations, 0.5) < 0.2  # about the asked-for 2 ms: doubling overshoots by < 2x
    starts = [at for at, _ in slices]
    assert starts == sorted(starts) and starts[-1] < 0.3
    late = oversleeps(0.05)
    assert len(late) >= 5 and min(late) > -1e-4  # time.sleep never returns before the asked-for 1 ms
