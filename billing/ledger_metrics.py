"""Prometheus metrics of the usage ledger (`fairserve_ledger_*`), one set per registry."""

from __future__ import annotations

import threading
import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


class LedgerMetrics:
    """Buffer depth, spill backlog, flush latency, retries, spilled/replayed/written/duplicate/rejected rows."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.buffer_depth = Gauge(
            "fairserve_ledger_buffer_depth",
            "Usage rows waiting in the write-behind buffer.",
            registry=registry,
        )
        self.spill_pending = Gauge(
            "fairserve_ledger_spill_pending_rows",
            "Usage rows in the spill file waiting for replay.",
            registry=registry,
        )
        self.quarantined = Gauge(
            "fairserve_ledger_quarantined_rows",
            "Usage rows the database refused, kept in the quarantine directory (readyz: ledger degraded).",
            registry=registry,
        )
        self.flush_seconds = Histogram(
            "fairserve_ledger_flush_seconds",
            "Time to write one batch of usage rows (successful or not).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        self.retries = Counter(
            "fairserve_ledger_retries_total", "Failed batch writes that will be retried.", registry=registry
        )
        self.spilled_rows = Counter(
            "fairserve_ledger_spilled_rows_total", "Usage rows written to the spill file.", registry=registry
        )
        self.replayed_rows = Counter(
            "fairserve_ledger_replayed_rows_total",
            "Spilled usage rows replayed into the database.",
            registry=registry,
        )
        self.written_rows = Counter(
            "fairserve_ledger_written_rows_total", "Usage rows inserted into the database.", registry=registry
        )
        self.duplicate_rows = Counter(
            "fairserve_ledger_duplicate_rows_total",
            "Usage rows skipped because their (tenant_id, request_id) was already stored.",
            registry=registry,
        )
        self.rejected_rows = Counter(
            "fairserve_ledger_rejected_rows_total",
            "Usage rows the database refused as invalid (or lines that did not decode), quarantined.",
            registry=registry,
        )
        self.journal_errors = Counter(
            "fairserve_ledger_journal_errors",
            "Usage rows whose journal write failed (still buffered for SQL, but not safe from a kill -9).",
            registry=registry,
        )


_lock = threading.Lock()
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, LedgerMetrics] = weakref.WeakKeyDictionary()


def ledger_metrics(registry: CollectorRegistry | None = None) -> LedgerMetrics:
    """The ledger metrics on `registry` (default: the global one), created once per registry."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        metrics = _by_registry.get(registry)
        if metrics is None:
            metrics = _by_registry[registry] = LedgerMetrics(registry)
        return metrics
