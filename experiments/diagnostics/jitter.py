"""How much the machine itself delays work: stalls of a busy thread and oversleep of a waking one.

    .venv/bin/python -m experiments.diagnostics.jitter --seconds 10

No fairserve code runs here. A fixed slice of CPU work is timed over and over, and a thread asks
to sleep 1 ms over and over; on a quiet machine both stay near their median. Whatever this
reports as p99/max is a floor under any p99 latency measured on the same machine (the gateway
overhead benchmark cites it), because a request in flight during such a stall waits it out.
"""

from __future__ import annotations

import argparse
import json
import time


def busy_slices(seconds: float, slice_ms: float) -> list[tuple[float, float]]:
    """(start, duration) of repeated fixed CPU slices, calibrated to about `slice_ms` each."""

    def work(n: int) -> int:
        acc = 0
        for i in range(n):
            acc ^= i * 2654435761 & 0xFFFFFFFF
        return acc

    def timed(n: int) -> float:
        t = time.perf_counter()
        work(n)
        return time.perf_counter() - t

    n = 1000
    while (
        min(timed(n) for _ in range(3)) * 1e3 < slice_ms
    ):  # the fastest of three: a stall must not calibrate
        n *= 2
    out = []
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        work(n)
        out.append((now - start, time.perf_counter() - now))
    return out


def oversleeps(seconds: float, sleep_s: float = 0.001) -> list[float]:
    """How much later than asked a 1 ms sleep returns, repeatedly."""
    out = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        time.sleep(sleep_s)
        out.append(time.perf_counter() - t - sleep_s)
    return out


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    """Measure both, print JSON (milliseconds)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="for each of the two measurements")
    p.add_argument("--slice-ms", type=float, default=2.0, help="CPU work per timed slice")
    args = p.parse_args()
    slices = busy_slices(args.seconds, args.slice_ms)
    durations = [d for _, d in slices]
    median = pct(durations, 0.5)
    stalls = [(round(at, 2), round((d - median) * 1e3, 1)) for at, d in slices if d > median + 0.005]
    late = oversleeps(args.seconds)
    print(
        json.dumps(
            {
                "busy_slice_ms": {
                    "p50": round(median * 1e3, 3),
                    "p99": round(pct(durations, 0.99) * 1e3, 3),
                    "max": round(max(durations) * 1e3, 3),
                },
                "stalls_over_5ms": {
                    "count": len(stalls),
                    "per_s": round(len(stalls) / args.seconds, 2),
                    "worst_ms": max((s for _, s in stalls), default=0.0),
                    "first": stalls[:12],
                },
                "oversleep_1ms_ms": {
                    "p50": round(pct(late, 0.5) * 1e3, 3),
                    "p99": round(pct(late, 0.99) * 1e3, 3),
                    "max": round(max(late) * 1e3, 3),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
