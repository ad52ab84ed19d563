"""Server-side numbers from `GET /metrics`: counter deltas over a run and gauges sampled over time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Gauges plotted over time (the essay: iteration duration and active sequences over time, KV occupancy).
SERIES = (
    "fairserve_batch_size",
    "fairserve_iteration_seconds",
    "fairserve_kv_blocks_used",
    "fairserve_kv_blocks_total",
)


def parse_metrics(text: str) -> Sample:
    """Every sample of a Prometheus text page, keyed by (name, sorted labels)."""
    out: Sample = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def total(sample: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """Sum of `name` over every label set that includes `labels`."""
    want = set(labels.items())
    return sum(v for (n, lbl), v in sample.items() if n == name and want <= set(lbl))


def by_label(sample: Sample, name: str, label: str) -> dict[str, float]:
    """`name` summed per value of one label."""
    out: dict[str, float] = {}
    for (n, lbl), v in sample.items():
        if n == name:
            key = dict(lbl).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def delta(before: Sample, after: Sample) -> Sample:
    """after - before for every sample in `after` (counters; gauges are meaningless here)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


async def scrape(client: httpx.AsyncClient) -> Sample:
    """One scrape of /metrics."""
    resp = await client.get("/metrics")
    resp.raise_for_status()
    return parse_metrics(resp.text)


@dataclass
class Timeline:
    """Gauges sampled at a fixed interval while a run is in flight."""

    t: list[float] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in SERIES})
    # Per sample: requests waiting in the engine queue, by tenant label (a tenant with any is backlogged).
    waiting: list[dict[str, float]] = field(default_factory=list)

    def backlogged_fraction(self, tenant: str) -> float | None:
        """The share of samples in which `tenant` had requests waiting; None without samples."""
        if not self.waiting:
            return None
        return sum(1 for w in self.waiting if w.get(tenant, 0.0) > 0) / len(self.waiting)


async def sample(
    client: httpx.AsyncClient, timeline: Timeline, stop: asyncio.Event, interval_s: float = 0.25
) -> None:
    """Scrape /metrics into `timeline` every `interval_s` until `stop` is set (a failed scrape is skipped)."""
    t0 = time.perf_counter()
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError, ValueError):
            now = await scrape(client)
            timeline.t.append(time.perf_counter() - t0)
            for name in SERIES:
                timeline.values[name].append(total(now, name))
            timeline.waiting.append(by_label(now, "fairserve_waiting_requests", "tenant"))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


async def settled(
    client: httpx.AsyncClient, before: Sample, expected_finished: int, timeout_s: float = 15.0
) -> Sample:
    """Scrape until the server has recorded `expected_finished` more finished requests (or time runs out):
    the gateway records a request just after its stream ends."""
    deadline = time.monotonic() + timeout_s
    after = await scrape(client)
    while time.monotonic() < deadline:
        done = total(after, "fairserve_requests_total") - total(before, "fairserve_requests_total")
        if done >= expected_finished:
            break
        await asyncio.sleep(0.05)
        after = await scrape(client)
    return after
