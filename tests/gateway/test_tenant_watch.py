"""One path for tenant changes: a weight or quota set with `fairserve tenants set` (SQL only) reaches a running
gateway and its engine, as the admin API's does, even for a tenant the engine has already seen and whose
weight the admin API set before (gateway/tenant_watch.py). Real processes and real HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.cli import main
from tests.gateway.serve_process import ServeProcess


def _until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Repeat `check` (each call does a request and waits for its answer) until it holds."""
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, f"never: {what}"


def test_cli_weight_and_quota_reach_the_running_gateway_and_engine(tmp_path: Path) -> None:
    # A key cache that would hold the old tenant for ten minutes: only the tenant watch can apply the change.
    proc = ServeProcess(tmp_path, "--key-cache-ttl-s", "600", "--max-num-seqs", "4")
    try:
        admin = {"Authorization": f"Bearer {proc.banner['admin_token']}"}
        with httpx.Client(base_url=proc.url, timeout=60) as c:
            tenant = c.post("/admin/api/tenants", json={"name": "team-a"}, headers=admin).json()
            secret = c.post(f"/admin/api/tenants/{tenant['id']}/keys", json={}, headers=admin).json()[
                "secret"
            ]
            model = c.get("/v1/models", headers=proc.headers(secret)).json()["data"][0]["id"]
            body = {"model": model, "prompt": "hi", "max_tokens": 2}

            def complete() -> int:
                return c.post("/v1/completions", json=body, headers=proc.headers(secret)).status_code

            def engine_weight() -> float | None:
                assert complete() == 200  # an iteration, so the engine publishes its stats
                stats = c.get("/admin/api/engine", headers=admin).json()["stats"]
                weight = stats["weights"].get(tenant["id"])
                return None if weight is None else float(weight)

            assert complete() == 200  # the engine has seen the tenant
            patched = c.patch(f"/admin/api/tenants/{tenant['id']}", json={"weight": 2}, headers=admin)
            assert patched.json()["engine_updated"] is True
            _until(lambda: engine_weight() == 2.0, "the admin API's weight in the engine")

            assert main(["tenants", "set", "team-a", "--weight", "5", "--data-dir", str(tmp_path)]) == 0
            _until(lambda: engine_weight() == 5.0, "the CLI's weight in the engine")

            assert (
                main(["tenants", "set", "team-a", "--tokens-per-minute", "1", "--data-dir", str(tmp_path)])
                == 0
            )
            # 1 token a minute can never hold the request (prompt + max_tokens): refused for good, not 429
            _until(lambda: complete() == 400, "the CLI's quota at the gateway")
            listed = c.get(f"/admin/api/tenants/{tenant['id']}", headers=admin).json()
            assert (listed["weight"], listed["tokens_per_minute"]) == (5.0, 1)
    finally:
        proc.stop()
