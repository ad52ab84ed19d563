"""Prometheus metrics (listed in docs/gateway.md, "Metrics") on a per-app registry, with bounded tenant labels."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.ops.task_metrics import TaskMetrics

OTHER = "other"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


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

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, ["tenant"], registry=r, buckets=_LATENCY_BUCKETS)

        self.ttft = hist("fairserve_ttft_seconds", "Time to first token")
        self.tpot = hist("fairserve_tpot_seconds", "Time per output token after the first")
        self.e2e = hist("fairserve_e2e_seconds", "Arrival to last token")
        self.queue = hist("fairserve_queue_seconds", "Arrival to first scheduled")
        self.requests = Counter("fairserve_requests", "Finished requests", ["tenant", "status"], registry=r)
        self.tokens = Counter("fairserve_tokens", "Tokens by kind", ["tenant", "kind"], registry=r)
        self.charged = Counter(
            "fairserve_charged_service", "Charged fairness service", ["tenant"], registry=r
        )
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
        self.cancel_lag = Counter(
            "fairserve_cancel_lag_tokens", "Tokens computed after a cancel signal", registry=r
        )
        self.engine_restarts = Counter(
            "fairserve_engine_restarts",
            "Engine workers started to replace a dead one",
            ["result"],
            registry=r,
        )
        self.tasks = TaskMetrics(r, labels.label)  # per-tenant task outcomes and waste (#28)
        self.degradations = Counter(  # gateway/openai/degrade.py: kind = fallback | partial | truncated
            "fairserve_degradations",
            "Requests served degraded to meet their deadline",
            ["tenant", "kind"],
            registry=r,
        )
        self._bound: dict[str, _TenantChildren] = {}
        self._by_status: dict[tuple[str, str], Any] = {}
        if stats is not None:
            r.register(_EngineCollector(stats, labels))
        if loads is not None:  # routing.EngineLoad rows, one per engine
            r.register(_EnginesCollector(loads))

    def observe_finished(self, tenant_id: str, status: str, m: Any) -> None:
        """Record one finished engine request from its RequestMetrics."""
        c = self._children(self.labels.label(tenant_id))
        self._status_child(c.label, status).inc()
        c.prompt.inc(m.prompt_tokens)
        c.cached.inc(m.cached_tokens)
        c.completion.inc(m.completion_tokens)
        c.charged.inc(max(m.charged_service, 0.0))
        self.cancel_lag.inc(m.tokens_after_cancel)
        if m.first_scheduled_time is not None:
            c.queue.observe(max(m.first_scheduled_time - m.arrival_time, 0.0))
        if m.first_token_time is not None:
            c.ttft.observe(max(m.first_token_time - m.arrival_time, 0.0))
            if m.finished_time is not None and m.completion_tokens > 1:
                c.tpot.observe(max(m.finished_time - m.first_token_time, 0.0) / (m.completion_tokens - 1))
        if m.finished_time is not None:
            c.e2e.observe(max(m.finished_time - m.arrival_time, 0.0))

    def count_request(self, tenant_id: str, status: str) -> None:
        """Count one ended request that has no engine metrics (refused by the engine, or failed before)."""
        self._status_child(self.labels.label(tenant_id), status).inc()

    def _children(self, label: str) -> _TenantChildren:
        """The label's metric children, bound once (labels() costs a lock and a dict walk per call); the
        labels are bounded (TenantLabels), so this map is too."""
        found = self._bound.get(label)
        if found is None:
            found = _TenantChildren(
                label,
                self.tokens.labels(label, "prompt"),
                self.tokens.labels(label, "cached"),
                self.tokens.labels(label, "completion"),
                self.charged.labels(label),
                self.queue.labels(label),
                self.ttft.labels(label),
                self.tpot.labels(label),
                self.e2e.labels(label),
            )
            self._bound[label] = found
        return found

    def _status_child(self, label: str, status: str) -> Any:
        found = self._by_status.get((label, status))
        if found is None:  # statuses are a fixed handful (gateway/openai/runs.py)
            found = self._by_status[(label, status)] = self.requests.labels(label, status)
        return found


@dataclass(frozen=True)
class _TenantChildren:
    """One tenant label's children of the per-request metrics."""

    label: str
    prompt: Any
    cached: Any
    completion: Any
    charged: Any
    queue: Any
    ttft: Any
    tpot: Any
    e2e: Any
