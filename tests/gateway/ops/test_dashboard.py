"""docs/ops/grafana-dashboard.json queries only metrics a real `fairserve serve` exports on /metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.serve_process import ServeProcess

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "ops" / "grafana-dashboard.json"
METRIC = re.compile(r"\b(fairserve_[a-z0-9_]+)\b")
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_every_panel_has_a_query_and_covers_what_operators_watch() -> None:
    queries = " ".join(dashboard_queries())
    for metric in (
        "fairserve_charged_service_total",  # fair share per tenant
        "fairserve_waiting_requests",  # queue
        "fairserve_admission_rejections_total",  # admission outcomes
        "fairserve_ttft_seconds_bucket",
        "fairserve_tpot_seconds_bucket",
        "fairserve_kv_blocks_used",
        "fairserve_preemptions_total",
        "fairserve_backend_circuit_open",  # degradations
    ):
        assert metric in queries, metric


def test_every_metric_the_dashboard_queries_is_on_metrics(tmp_path: Path, redis_url: str) -> None:
    """A real server with Redis (the degradation metrics belong to its backends), after one request."""
    serve = ServeProcess(tmp_path, "--redis", redis_url)
    try:
        with httpx.Client(base_url=serve.url, timeout=60) as client:
            key = serve.headers(serve.banner["api_key"])
            model = client.get("/v1/models", headers=key).json()["data"][0]["id"]
            done = client.post(
                "/v1/completions", headers=key, json={"model": model, "prompt": "hi", "max_tokens": 2}
            )
            assert done.status_code == 200, done.text
            scrape = client.get("/metrics", headers=serve.headers(serve.banner["metrics_token"]))
            assert scrape.status_code == 200, scrape.text
    finally:
        serve.stop()
    families = list(text_string_to_metric_families(scrape.text))
    exported = {f.name for f in families} | {s.name for f in families for s in f.samples}
    queried = {name for expr in dashboard_queries() for name in METRIC.findall(expr)}
    assert len(queried) >= 20, queried

    def exists(name: str) -> bool:
        return name in exported or any(
            name.endswith(s) and name.removesuffix(s) in exported for s in SUFFIXES
        )

    missing = sorted(name for name in queried if not exists(name))
    assert missing == [], f"the dashboard queries metrics /metrics does not export: {missing}"
