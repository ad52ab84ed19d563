"""Metric labels stay bounded (configured tenants by name, everyone else as "other"), and the request path's
own counters expose what prometheus_client's would have, matching what the requests did."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine import EngineStats, RequestMetrics
from gateway.ops.metrics import GatewayMetrics, TenantLabels
from gateway.ops.request_metrics import LATENCY_BUCKETS
from tests.gateway.conftest import Server, wait_for


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


def _samples(text: str, prefix: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the families named `prefix...` in an exposition, as prometheus_client's parser reads it."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith(prefix)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_exposition_matches_prometheus_clients_own_histogram_and_counter() -> None:
    """The request path's own counters expose what prometheus_client's Histogram and Counter would have,
    observations on a bucket's bound included (`le`: counted in that bucket)."""
    labels = TenantLabels(limit=1)
    labels.configure([("t1", "acme")])
    metrics = GatewayMetrics(labels)
    ref = CollectorRegistry()
    e2e = Histogram(
        "fairserve_e2e_seconds", "Arrival to last token", ["tenant"], registry=ref, buckets=LATENCY_BUCKETS
    )
    requests = Counter("fairserve_requests", "Finished requests", ["tenant", "status"], registry=ref)
    tokens = Counter("fairserve_tokens", "Tokens by kind", ["tenant", "kind"], registry=ref)
    for i, seconds in enumerate((0.0, 0.005, 0.0050001, 0.3, 1.0, 119.9, 120.0, 500.0, 0.01)):
        tenant, status = ("t1", "completed") if i % 3 else ("stranger", "cancelled")
        m = RequestMetrics(3, 1, 1 + i, 1.0, 0, 0, 0, None, 0.0, None, None, seconds)
        metrics.observe_finished(tenant, status, m)
        label = labels.label(tenant)
        e2e.labels(label).observe(seconds)
        requests.labels(label, status).inc()
        for kind, n in (("prompt", 3), ("cached", 1), ("completion", 1 + i)):
            tokens.labels(label, kind).inc(n)
    ours = generate_latest(metrics.registry).decode()
    theirs = generate_latest(ref).decode()
    for prefix in ("fairserve_e2e_seconds", "fairserve_requests", "fairserve_tokens"):
        assert _samples(ours, prefix) == _samples(theirs, prefix), prefix
        assert _help_and_type(ours, prefix) == _help_and_type(theirs, prefix)
    assert (
        _samples(ours, "fairserve_e2e_seconds")[
            ("fairserve_e2e_seconds_bucket", frozenset({("tenant", "acme"), ("le", "0.005")}))
        ]
        == 1.0
    )


def _help_and_type(text: str, prefix: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith("# ") and prefix in line and "_created" not in line
    ]


def _within(values: list[float], bound: float) -> tuple[int, int]:
    """How many values lie at or below `bound`: (surely, at most); the two differ only for a value within a
    nanosecond of the bound, where the ledger's milliseconds may round it across."""
    return sum(v <= bound - 1e-9 for v in values), sum(v <= bound + 1e-9 for v in values)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _five_requests(srv: Server, prefix: str) -> tuple[Samples, list[Any]]:
    """Four non-streaming requests and a stream as alice; the scrape once all five are counted, their rows."""
    scrape = {"Authorization": f"Bearer {srv.state.metrics_token}"}
    with httpx.Client(base_url=srv.url, timeout=60.0) as c:
        for i, max_tokens in enumerate((1, 2, 5, 9)):
            body = {"model": srv.model, "prompt": f"count {i}", "max_tokens": max_tokens, "ignore_eos": True}
            headers = srv.headers("alice", **{"X-Request-Id": f"{prefix}{i}"})
            assert c.post("/v1/completions", json=body, headers=headers).status_code == 200
        body = {"model": srv.model, "prompt": "count s", "max_tokens": 6, "ignore_eos": True, "stream": True}
        headers = srv.headers("alice", **{"X-Request-Id": prefix + "s"})
        with c.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
            assert resp.status_code == 200 and "data: [DONE]" in list(resp.iter_lines())
        tenant = srv.state.metrics.labels.label(srv.tenants["alice"].id)
        done = ("fairserve_requests_total", frozenset({("tenant", tenant), ("status", "completed")}))
        # A run is counted just after its reply's last byte: wait for the fifth.
        got: Samples = wait_for(
            lambda: (
                (s := _samples(c.get("/metrics", headers=scrape).text, "fairserve_")).get(done) == 5 and s
            ),
            10,
            "five requests counted",
        )
    rows = srv.usage_rows("request_id LIKE :p", p=prefix + "%")
    assert len(rows) == 5 and {r["status"] for r in rows} == {"completed"}
    return got, rows


def test_a_scrape_shows_what_the_requests_did(gateway: Callable[..., Server]) -> None:
    """Over HTTP on a gateway of its own: the counters and histograms (buckets, sum, count) a scrape shows are
    the sums of the ledger's rows of the requests it served, and prometheus_client's parser reads them."""
    srv = gateway()
    got, rows = _five_requests(srv, f"scraped-{uuid.uuid4().hex[:8]}-")
    tenant = srv.state.metrics.labels.label(srv.tenants["alice"].id)

    def counter(name: str, **labels: str) -> float:
        return got[(name, frozenset({"tenant": tenant, **labels}.items()))]

    for kind in ("prompt", "cached", "completion"):
        assert counter("fairserve_tokens_total", kind=kind) == sum(r[f"{kind}_tokens"] for r in rows)
    assert counter("fairserve_charged_service_total") == pytest.approx(
        sum(r["charged_service"] for r in rows)
    )
    assert got[("fairserve_cancel_lag_tokens_total", frozenset())] == 0.0
    seconds = {
        "ttft": [r["ttft_ms"] / 1000 for r in rows],
        "e2e": [r["e2e_ms"] / 1000 for r in rows],
        "queue": [r["queue_ms"] / 1000 for r in rows],
        "tpot": [
            (r["e2e_ms"] - r["ttft_ms"]) / 1000 / (r["completion_tokens"] - 1)
            for r in rows
            if r["completion_tokens"] > 1
        ],
    }
    assert len(seconds["tpot"]) == 4
    for name, values in seconds.items():
        family = f"fairserve_{name}_seconds"
        assert counter(family + "_count") == len(values)
        assert counter(family + "_sum") == pytest.approx(sum(values), rel=1e-6, abs=1e-9)
        buckets = {
            float(dict(labels)["le"]): value
            for (sample, labels), value in got.items()
            if sample == family + "_bucket" and ("tenant", tenant) in labels
        }
        assert sorted(buckets) == [*LATENCY_BUCKETS, math.inf]
        for bound, value in buckets.items():
            low, high = _within(values, bound)
            assert low <= value <= high, (name, bound)
