"""/metrics needs the metrics or admin token, or a private --metrics-port; health routes carry no tenant data."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from gateway.settings import GatewaySettings
from tests.gateway.conftest import Server
from tests.gateway.serve_process import ServeProcess


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_metrics_needs_the_metrics_or_admin_token(server: Server, client: httpx.Client) -> None:
    client.post(
        "/v1/completions",
        json={"model": server.model, "prompt": "m", "max_tokens": 1},
        headers=server.headers("alice"),
    )
    anonymous = client.get("/metrics")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_metrics_token"
    assert "fairserve_" not in anonymous.text
    tenant = client.get("/metrics", headers=server.headers("alice"))
    assert tenant.status_code == 403 and "fairserve_" not in tenant.text
    wrong = client.get("/metrics", headers=_bearer(server.state.metrics_token + "x"))
    assert wrong.status_code == 403
    for token in (server.state.metrics_token, server.state.admin_token):
        ok = client.get("/metrics", headers=_bearer(token))
        assert (
            ok.status_code == 200 and 'fairserve_requests_total{status="completed",tenant="alice"}' in ok.text
        )
    assert server.state.metrics_token != server.state.admin_token


def test_health_routes_are_open_and_carry_no_tenant_data(server: Server, client: httpx.Client) -> None:
    for path in ("/healthz", "/readyz"):
        resp = client.get(path)
        assert resp.status_code == 200
        for name, tenant in server.tenants.items():
            assert name not in resp.text and tenant.id not in resp.text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_port_serves_without_credential_on_loopback(tmp_path: Path) -> None:
    assert GatewaySettings().metrics_host == "127.0.0.1"
    port = _free_port()
    serve = ServeProcess(tmp_path, "--metrics-port", str(port))
    try:
        assert serve.banner["metrics_token"].startswith("fsm-")
        assert (tmp_path / "metrics_token").stat().st_mode & 0o077 == 0
        private = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert private.status_code == 200 and "fairserve_engine_alive" in private.text
        assert httpx.get(serve.url + "/metrics", timeout=10).status_code == 401  # the public port still asks
        scraped = httpx.get(
            serve.url + "/metrics", headers=_bearer(serve.banner["metrics_token"]), timeout=10
        )
        assert scraped.status_code == 200
    finally:
        serve.stop()
