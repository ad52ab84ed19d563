"""Prometheus metrics (listed in docs/gateway.md, "Metrics") on a per-app registry, with bounded tenant labels.

The per-request ones are plain numbers written out at scrape time (gateway/ops/request_metrics.py says why);
the rarer ones (refusals, auth failures, restarts, degradations, tasks) stay prometheus_client's own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.ops.request_metrics import RequestCollector, RequestCounts
from gateway.ops.task_metrics import TaskMetrics

OTHER = "other"


class TenantLabels:
    """Maps tenant ids to metric labels: configured tenants by name, everyone else as "other".

    Unbounded label values would let any caller grow the registry without limit.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._names: dict[str, str] = {}
        self._lock = threading.Lock()

    def configure(self, tenants: Iterable[tuple[str, str]]) -> None:
        """Replace the labelled set with (tenant_id, name) pairs, up to the limit."""
        names = dict(list(tenants)[: self.limit])
        with self._lock:
            self._names = names

    def learn(self, tenant_id: str, name: str) -> None:
        """Label a configured tenant seen on a request, while the limit allows."""
        if tenant_id in self._names:
            return
        with self._lock:
            if len(self._names) < self.limit:
                self._names = {**self._names, tenant_id: name}

    def label(self, tenant_id: str) -> str:
        """The label for one tenant id."""
        return self._names.get(tenant_id, OTHER)


class _EngineCollector(Collector):
    """Reads engine statistics at scrape time, so gauges are never stale between requests."""

    def __init__(self, stats: Callable[[], Any], labels: TenantLabels) -> None:
        self._stats = stats
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:
            return
        for name, doc, value in (
            ("fairserve_batch_size", "Sequences in the last iteration", stats.batch_size),
            ("fairserve_kv_blocks_used", "KV blocks in use", stats.kv_blocks_used),
            ("fairserve_kv_blocks_total", "KV blocks in the pool", stats.kv_blocks_total),
            ("fairserve_iteration_seconds", "Engine iteration time (EWMA)", stats.iteration_seconds),
            ("fairserve_engine_alive", "1 while the engine loop runs", 1.0 if stats.alive else 0.0),
        ):
            yield GaugeMetricFamily(name, doc, value=float(value))
        waiting = GaugeMetricFamily(
            "fairserve_waiting_requests", "Requests queued in the engine", labels=["tenant"]
        )
        by_label: dict[str, int] = {}
        for tenant_id, count in stats.waiting_by_tenant.items():
            key = self._labels.label(tenant_id)
            by_label[key] = by_label.get(key, 0) + count
        for key, count in sorted(by_label.items()):
            waiting.add_metric([key], float(count))
        yield waiting
        for name, doc, value in (
            ("fairserve_kv_alloc_failures", "KV block allocation failures", stats.kv_alloc_failures),
            (
                "fairserve_recomputed_tokens",
                "Tokens recomputed after preemption",
                stats.recomputed_tokens_total,
            ),
            ("fairserve_swapped_bytes", "Bytes swapped out by preemption", stats.swapped_bytes_total),
            (
                "fairserve_deadline_misses",
                "Requests that missed their deadline in the engine",
                stats.deadline_misses,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=float(value))
        # The engine reports one total; reason and mode labels keep the documented shape.
        preempt = CounterMetricFamily("fairserve_preemptions", "Preemptions", labels=["reason", "mode"])
        for kind, count in sorted(stats.preemptions_by_kind.items()):
            reason, _, mode = kind.partition("/")
            preempt.add_metric([reason, mode], float(count))
        yield preempt


class _EnginesCollector(Collector):
    """Per-engine health, load and routed requests (label `engine`: the router's key, or "local" for a
    gateway's only engine), read at scrape time. Engines are few and named by the operator, so the label
    is bounded."""

    def __init__(self, loads: Callable[[], Iterable[Any]]) -> None:
        self._loads = loads

    def collect(self) -> Iterator[Metric]:
        loads = list(self._loads())
        gauges: list[tuple[GaugeMetricFamily, Callable[[Any], float]]] = [
            (
                GaugeMetricFamily("fairserve_engine_up", "1 while the engine answers", labels=["engine"]),
                lambda e: 1.0 if e.alive else 0.0,
            ),
            (
                GaugeMetricFamily(
                    "fairserve_engine_waiting", "Requests queued in the engine", labels=["engine"]
                ),
                lambda e: e.waiting,
            ),
            (
                GaugeMetricFamily(
                    "fairserve_engine_running", "Requests running in the engine", labels=["engine"]
                ),
                lambda e: e.running,
            ),
            (
                GaugeMetricFamily(
                    "fairserve_engine_kv_use", "Share of the engine's KV blocks in use", labels=["engine"]
                ),
                lambda e: e.kv_use,
            ),
        ]
        for family, value in gauges:
            for e in loads:
                family.add_metric([e.key], float(value(e)))
            yield family
        in_flight = GaugeMetricFamily(
            "fairserve_engine_in_flight", "This gateway's requests live on the engine", labels=["engine"]
        )
        routed = CounterMetricFamily(
            "fairserve_engine_routed", "Requests this gateway routed to the engine", labels=["engine"]
        )
        for e in loads:
            if e.routed is not None:  # a lone engine is not routed to: it has no count of its own
                in_flight.add_metric([e.key], float(e.in_flight or 0))
                routed.add_metric([e.key], float(e.routed))
        yield in_flight
        yield routed


class GatewayMetrics:
    """Every fairserve metric of one app, registered on its own registry."""

    def __init__(
        self,
        labels: TenantLabels,
        stats: Callable[[], Any] | None = None,
        loads: Callable[[], Iterable[Any]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.labels = labels
        r = self.registry
        # Latency histograms, requests, tokens and charged service: updated per request, so plain numbers.
        self.counts = RequestCounts()
        r.register(RequestCollector(self.counts))
        self.rejections = Counter(
            "fairserve_admission_rejections", "Requests refused at the edge", ["reason"], registry=r
        )
        self.auth_failures = Counter(
            "fairserve_auth_failures",
            "Refused authentications: missing, invalid "
            "(malformed, unknown, revoked, disabled) or limited (address over budget)",
            ["outcome"],
            registry=r,
        )
        r.register(RequestCollector(self.counts, cancel_lag_only=True))  # its place in the text, as before
        self.engine_restarts = Counter(
            "fairserve_engine_restarts",
            "Engine workers started to replace a dead one",
            ["result"],
            registry=r,
        )
        self.orphan_records = Counter(  # gateway/ops/produced.py: billed interrupted, or a foreign peer's
            "fairserve_orphan_records",
            "Engine records of gone peers' requests: billed (a dead gateway's) or foreign (never billed)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("billed", "foreign"):
            self.orphan_records.labels(outcome)
        self.tasks = TaskMetrics(r, labels.label)  # per-tenant task outcomes and waste (#28)
        self.degradations = Counter(  # gateway/openai/degrade.py: kind = fallback | partial | truncated
            "fairserve_degradations",
            "Requests served degraded to meet their deadline",
            ["tenant", "kind"],
            registry=r,
        )
        if stats is not None:
            r.register(_EngineCollector(stats, labels))
        if loads is not None:  # routing.EngineLoad rows, one per engine
            r.register(_EnginesCollector(loads))

    def observe_finished(self, tenant_id: str, status: str, m: Any) -> None:
        """Record one finished engine request from its RequestMetrics: on the event loop's thread only (no
        lock: gateway/ops/request_metrics.py)."""
        counts = self.counts
        label = self.labels.label(tenant_id)
        row = counts.rows.get(label) or counts.row(label)
        by_status = row.requests
        if status in by_status:
            by_status[status] += 1.0
        else:
            counts.first(label, by_status, status)
        row.prompt += m.prompt_tokens
        row.cached += m.cached_tokens
        row.completion += m.completion_tokens
        row.charged += max(m.charged_service, 0.0)
        counts.cancel_lag += m.tokens_after_cancel
        arrival, first = m.arrival_time, m.first_token_time
        if m.first_scheduled_time is not None:
            row.queue.observe(max(m.first_scheduled_time - arrival, 0.0))
        if first is not None:
            row.ttft.observe(max(first - arrival, 0.0))
            if m.finished_time is not None and m.completion_tokens > 1:
                row.tpot.observe(max(m.finished_time - first, 0.0) / (m.completion_tokens - 1))
        if m.finished_time is not None:
            row.e2e.observe(max(m.finished_time - arrival, 0.0))

    def count_request(self, tenant_id: str, status: str) -> None:
        """Count one ended request that has no engine metrics (refused by the engine, or failed before): on
        the event loop's thread only, as `observe_finished`."""
        label = self.labels.label(tenant_id)
        by_status = self.counts.by_status(label)
        if status in by_status:
            by_status[status] += 1.0
        else:
            self.counts.first(label, by_status, status)
