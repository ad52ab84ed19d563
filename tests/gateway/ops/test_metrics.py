"""Metric labels stay bounded: configured tenants by name, everyone else as "other"."""

from __future__ import annotations

from prometheus_client import generate_latest

from engine import EngineStats, RequestMetrics
from gateway.ops.metrics import GatewayMetrics, TenantLabels


def test_labels_bounded_by_limit() -> None:
    labels = TenantLabels(limit=2)
    labels.configure([("id1", "alpha"), ("id2", "beta"), ("id3", "gamma")])
    assert [labels.label(i) for i in ("id1", "id2", "id3", "nobody")] == ["alpha", "beta", "other", "other"]
    labels.learn("id4", "delta")  # full: stays "other"
    assert labels.label("id4") == "other"


def test_finished_request_and_engine_gauges_are_exported() -> None:
    labels = TenantLabels(limit=10)
    labels.configure([("t1", "acme")])
    stats = EngineStats(kv_blocks_used=7, kv_blocks_total=64, waiting_by_tenant={"t1": 2, "x": 1, "y": 4})
    metrics = GatewayMetrics(labels, lambda: stats)
    m = RequestMetrics(
        prompt_tokens=10,
        cached_tokens=4,
        completion_tokens=5,
        charged_service=20.0,
        preemptions=0,
        recomputed_tokens=0,
        tokens_after_cancel=2,
        cancel_state=None,
        arrival_time=100.0,
        first_scheduled_time=100.5,
        first_token_time=101.0,
        finished_time=102.0,
    )
    metrics.observe_finished("t1", "completed", m)
    metrics.observe_finished("stranger", "cancelled", m)
    text = generate_latest(metrics.registry).decode()
    assert 'fairserve_requests_total{status="completed",tenant="acme"} 1.0' in text
    assert 'fairserve_requests_total{status="cancelled",tenant="other"} 1.0' in text
    assert 'fairserve_tokens_total{kind="cached",tenant="acme"} 4.0' in text
    assert 'fairserve_waiting_requests{tenant="other"} 5.0' in text
    assert "fairserve_kv_blocks_used 7.0" in text
    assert "fairserve_cancel_lag_tokens_total 4.0" in text
    assert 'fairserve_tpot_seconds_sum{tenant="acme"} 0.25' in text
