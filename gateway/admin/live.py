"""Live engine state for the dashboard: one snapshot, a share-of-service history, and an SSE stream.

The history is sampled by the server (`keep_share_history`, once a second from the app's start), whether
or not a dashboard watches: a page opened after a burst of work shows that work. It is bounded
(HISTORY_SAMPLES samples, 15 minutes), and each snapshot says which span its samples cover, so the chart
says "no service" only where samples show none.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from billing import Tenant
from gateway.admin.http import NO_STORE, jsonable, query_int, reply
from gateway.state import GatewayState
from routing import engine_loads, model_client

log = logging.getLogger(__name__)

HISTORY_SAMPLES = 900  # at one sample a second: the last 15 minutes
SAMPLE_INTERVAL_S = 1.0  # the server's own sampling of engine service (keep_share_history)
MIN_SAMPLE_INTERVAL_S = 0.5
SAMPLER_TENANTS_MAX_AGE_S = 10.0  # the sampler re-reads the tenant list (a SQL query) at most this often
SHARE_WINDOW_S = 30.0  # each share point is the split of service charged over the trailing window
TENANTS_MAX_AGE_S = 1.0
RECENT_ITERATIONS = 20
OTHER_KEYS_SHOWN = 50  # fairness keys that are not tenants (users, API keys) listed by service
# A tenant that had work queued for less than this share of a window asked for less than a fair share
# would give it: its share under its weight share is its demand, not the scheduler ("demand-limited").
DEMAND_LIMITED_BELOW = 0.5


@dataclass(frozen=True)
class ServiceSample:
    """Cumulative charged service, configured weights and cumulative seconds with queued work (the engine's
    `backlogged_s`) by fairness key at one instant."""

    t: float
    service: dict[str, float]
    weights: dict[str, float]
    backlogged: dict[str, float] = field(default_factory=dict)


class ServiceHistory:
    """A ring of service samples, from which the dashboard's share-vs-weight series is computed."""

    def __init__(
        self, capacity: int = HISTORY_SAMPLES, min_interval_s: float = MIN_SAMPLE_INTERVAL_S
    ) -> None:
        self._samples: deque[ServiceSample] = deque(maxlen=capacity)
        self._min_interval_s = min_interval_s
        self._lock = threading.Lock()

    def observe(
        self,
        t: float,
        service: Mapping[str, float],
        weights: Mapping[str, float],
        backlogged: Mapping[str, float] | None = None,
    ) -> None:
        """Record a sample unless the previous one is younger than the minimum interval."""
        with self._lock:
            if self._samples and t - self._samples[-1].t < self._min_interval_s:
                return
            self._samples.append(ServiceSample(t, dict(service), dict(weights), dict(backlogged or {})))

    def backlog_share(self, window_s: float = SHARE_WINDOW_S) -> dict[str, float]:
        """Each key's share of the trailing window with work queued (empty before two samples)."""
        with self._lock:
            if len(self._samples) < 2:
                return {}
            now = self._samples[-1]
            before = next((s for s in reversed(self._samples) if s.t <= now.t - window_s), self._samples[0])
        return backlog_shares(before, now)

    def share_points(self, window_s: float = SHARE_WINDOW_S, last: int | None = None) -> list[dict[str, Any]]:
        """Per sample: each key's share of the service charged over the trailing window, and its weight share.

        The weight share is taken among the keys that received service in that window, which is the
        split a fair scheduler aims for while exactly those keys are backlogged.
        """
        with self._lock:
            samples = list(self._samples)
        start = 1 if last is None else max(1, len(samples) - last)
        points: list[dict[str, Any]] = []
        base = 0
        for i in range(start, len(samples)):
            now = samples[i]
            # The latest earlier sample at least a window old (or the oldest kept, early on).
            while base + 1 < i and samples[base + 1].t <= now.t - window_s:
                base += 1
            point = share_point(samples[base], now)
            if point is not None:
                changed = weight_changes(samples[i - 1], now)
                if changed:
                    point["weight_changes"] = changed
                points.append(point)
        return points

    def __len__(self) -> int:
        with self._lock:
            return len(self._samples)

    def coverage(self) -> dict[str, Any]:
        """The samples kept: how many, and the times of the oldest and newest (None when empty)."""
        with self._lock:
            first = self._samples[0].t if self._samples else None
            last = self._samples[-1].t if self._samples else None
            return {"samples": len(self._samples), "sampled_since": first, "sampled_until": last}


def share_point(before: ServiceSample, now: ServiceSample) -> dict[str, Any] | None:
    """Shares of the service charged between two samples; None when nothing was charged."""
    # Service is cumulative; a key missing earlier started at zero, and an engine restart must not go negative.
    delta = {k: max(v - before.service.get(k, 0.0), 0.0) for k, v in now.service.items()}
    delta = {k: v for k, v in delta.items() if v > 0}
    total = sum(delta.values())
    if total <= 0:
        return None
    weights = {k: now.weights.get(k, 1.0) for k in delta}
    weight_total = sum(weights.values())
    return {
        "t": round(now.t, 3),
        "window_s": round(now.t - before.t, 3),
        "share": {k: v / total for k, v in delta.items()},
        "weight_share": {k: w / weight_total for k, w in weights.items()},
        "backlogged": backlog_shares(before, now),
    }


def backlog_shares(before: ServiceSample, now: ServiceSample) -> dict[str, float]:
    """Each key's share of the time between two samples that it had work queued (0 to 1)."""
    span = now.t - before.t
    if span <= 0:
        return {}
    keys = set(now.backlogged) | set(now.service)
    # Cumulative per engine worker: a restart starts again at zero, which must not read as negative.
    return {
        k: min(max(now.backlogged.get(k, 0.0) - before.backlogged.get(k, 0.0), 0.0) / span, 1.0) for k in keys
    }


def weight_changes(before: ServiceSample, now: ServiceSample) -> dict[str, list[float]]:
    """Keys whose configured weight changed between two consecutive samples: [old, new]."""
    return {
        k: [before.weights[k], w]
        for k, w in now.weights.items()
        if k in before.weights and before.weights[k] != w
    }


class LiveRuntime:
    """Per-app state of the live view: the service history and a short-lived cache of the tenant list."""

    def __init__(self) -> None:
        self.history = ServiceHistory()
        self._tenants: list[Tenant] = []
        self._tenants_at = -1e9
        self._lock = threading.Lock()

    def tenants(self, state: GatewayState, max_age_s: float = TENANTS_MAX_AGE_S) -> list[Tenant]:
        """The configured tenants, re-read from the store at most every `max_age_s` (blocking; call off-loop)."""
        now = time.monotonic()
        with self._lock:
            if now - self._tenants_at < max_age_s:
                return self._tenants
        tenants = state.store.list_tenants()
        with self._lock:
            self._tenants, self._tenants_at = tenants, now
        return tenants

    def forget_tenants(self) -> None:
        """Drop the cached tenant list (after an admin change) so the next snapshot shows it."""
        with self._lock:
            self._tenants_at = -1e9


def runtime(request: Request) -> LiveRuntime:
    """The app's LiveRuntime, created on first use."""
    return runtime_of(request.app.state)


def runtime_of(app_state: Any) -> LiveRuntime:
    """The LiveRuntime kept on an app's state, created on first use."""
    found = getattr(app_state, "admin_live", None)
    if found is None:
        found = app_state.admin_live = LiveRuntime()
    return found


def sample_service(state: GatewayState, live: LiveRuntime) -> None:
    """One history sample: the engine's cumulative service by tenant (and the most served other keys),
    with the tenants' weights. Blocking (the tenant list may be re-read from SQL); call off the loop."""
    stats = state.engine.stats()
    tenants = live.tenants(state, SAMPLER_TENANTS_MAX_AGE_S)
    by_id = {t.id: t for t in tenants}
    service = {k: v for k, v in stats.service.items() if k in by_id} | _other_service(stats.service, by_id)
    backlogged = {k: v for k, v in stats.backlogged_s.items() if k in by_id or k in service}
    live.history.observe(time.time(), service, {t.id: t.weight for t in tenants}, backlogged)


async def keep_share_history(app_state: Any, state: GatewayState) -> None:
    """Sample the service history every SAMPLE_INTERVAL_S for as long as the app runs, watched or not."""
    live_rt = runtime_of(app_state)
    while True:
        try:
            await run_in_threadpool(sample_service, state, live_rt)
        except Exception:  # a store or engine hiccup costs one sample, never the sampler
            log.debug("share history sample failed", exc_info=True)
        await asyncio.sleep(SAMPLE_INTERVAL_S)  # the sampling period, not a wait for a condition


def rejections_by_reason(state: GatewayState) -> dict[str, int]:
    """Admission rejections since start, by reason, read from the Prometheus counter."""
    counts: dict[str, int] = {}
    for metric in state.metrics.rejections.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                counts[sample.labels["reason"]] = int(sample.value)
    return counts


def engine_rows(state: GatewayState) -> list[dict[str, Any]]:
    """One row per engine behind the gateway (routing.engine_loads), with its KV share, for the API and the page."""
    rows = []
    for load in engine_loads(state.engine):
        model = load.model or state.engine.model_name
        serving = model_client(state.engine, model) or state.engine
        # The rates admission estimates this engine's model by now (admission/model_feasibility.py).
        feasibility = asdict(state.model_rates.effective(model, serving.stats()))
        rows.append({**asdict(load), "kv_use": load.kv_use, "feasibility": feasibility})
    return rows


def _other_service(service: Mapping[str, float], tenants: Mapping[str, Tenant]) -> dict[str, float]:
    """Fairness keys that are not tenant ids (api_key or user domains, or a deleted tenant): the most served
    OTHER_KEYS_SHOWN of them, so the view and its history stay bounded however many keys the engine holds."""
    others = ((k, v) for k, v in service.items() if k not in tenants)
    return dict(heapq.nlargest(OTHER_KEYS_SHOWN, others, key=lambda kv: kv[1]))


def live_snapshot(state: GatewayState, live: LiveRuntime, history_points: int) -> dict[str, Any]:
    """Engine gauges, per-tenant queues and service, rejections, recent iterations and share history."""
    stats = state.engine.stats()
    tenants = live.tenants(state)
    now = time.time()
    by_id = {t.id: t for t in tenants}
    other = _other_service(stats.service, by_id)
    enabled_weight = sum(t.weight for t in tenants if not t.disabled) or 1.0
    backlog = live.history.backlog_share()
    rows = [
        {
            "id": t.id,
            "name": t.name,
            "weight": t.weight,
            "priority_class": t.priority_class,
            "disabled": t.disabled,
            "weight_share": 0.0 if t.disabled else t.weight / enabled_weight,
            "waiting": stats.waiting_by_tenant.get(t.id, 0),
            "running": stats.running_by_tenant.get(t.id, 0),
            "service": stats.service.get(t.id, 0.0),
            # Its share of the last SHARE_WINDOW_S with work queued; None before the history has two samples.
            "backlogged": backlog.get(t.id, 0.0) if backlog else None,
            "demand_limited": bool(backlog) and backlog.get(t.id, 0.0) < DEMAND_LIMITED_BELOW,
        }
        for t in tenants
    ]
    return {
        "time": now,
        "model": state.engine.model_name,
        "alive": stats.alive and state.engine_health.serves_any(state.engine),
        "draining": state.draining,
        "live_requests": len(state.runs.by_id),
        "engine": {
            "waiting": stats.waiting,
            "running": stats.running,
            "waiting_tokens": stats.waiting_tokens,
            "batch_size": stats.batch_size,
            "max_num_seqs": stats.max_num_seqs,
            "max_num_batched_tokens": stats.max_num_batched_tokens,
            "kv_blocks_used": stats.kv_blocks_used,
            "kv_blocks_total": stats.kv_blocks_total,
            "kv_blocks_free": max(stats.kv_blocks_total - stats.kv_blocks_used, 0),
            "preemptions_total": stats.preemptions_total,
            "recomputed_tokens_total": stats.recomputed_tokens_total,
            "kv_alloc_failures": stats.kv_alloc_failures,
            "deadline_misses": stats.deadline_misses,
            "iteration_seconds": stats.iteration_seconds,
            "prefill_tokens_per_s": stats.prefill_tokens_per_s,
            "decode_tokens_per_s": stats.decode_tokens_per_s,
            "iterations": stats.iterations,
        },
        "engines": engine_rows(state),
        "tenants": rows,
        "other_service": other,
        "other_keys": sum(1 for k in stats.service if k not in by_id),
        "rejections": {"by_reason": rejections_by_reason(state), "recent": state.rejections.as_json(30)},
        "iterations": [asdict(tr) for tr in reversed(state.engine.recent_traces(RECENT_ITERATIONS))],
        "share": {
            "window_s": SHARE_WINDOW_S,
            "demand_limited_below": DEMAND_LIMITED_BELOW,
            "interval_s": SAMPLE_INTERVAL_S,
            **live.history.coverage(),
            "points": live.history.share_points(SHARE_WINDOW_S, history_points),
        },
    }


async def live(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/live?history=N: one snapshot with up to N share points (default all kept)."""
    points = query_int(request, "history", HISTORY_SAMPLES, 0, HISTORY_SAMPLES)
    snap = await run_in_threadpool(live_snapshot, state, runtime(request), points)
    return reply(snap)


async def live_stream(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/live/stream?interval_ms=1000: SSE, one snapshot (with the latest share point) per tick."""
    interval = query_int(request, "interval_ms", 1000, 200, 10_000) / 1000.0
    live_rt = runtime(request)

    async def events() -> AsyncIterator[str]:
        while not state.draining:
            snap = await run_in_threadpool(live_snapshot, state, live_rt, 1)
            yield f"event: snapshot\ndata: {json.dumps(jsonable(snap))}\n\n"
            await asyncio.sleep(interval)  # pacing the stream, not waiting for a condition

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={**NO_STORE, "X-Accel-Buffering": "no"}
    )
