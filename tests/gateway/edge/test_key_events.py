"""Revocation and disabling reach every replica over Redis pub/sub (two real `fairserve serve` processes on
one database and one Redis; the key cache TTL is an hour, so the TTL alone could not do it)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from tests.gateway.serve_process import ServeProcess


def _refused_within(client: httpx.Client, key: str, deadline_s: float) -> float | None:
    """Poll B with the key until it is refused (401); seconds it took, or None if the deadline passed first."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401:
            return time.monotonic() - start
    return None


# B caches verified keys far longer than any test runs: only the announcement can make it refuse a key, so
# the test needs no clock (how fast the announcement travels is a measurement, not an assert).
CACHE_TTL = ("--key-cache-ttl-s", "3600")
ANNOUNCED_WITHIN_S = 30.0  # a bound for a loaded machine, not a figure


def test_revoke_and_disable_on_one_replica_are_refused_by_the_other_before_its_cache_expires(
    tmp_path: Path, redis_url: str
) -> None:
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    a = ServeProcess(tmp_path / "a", "--db", db, "--redis", redis_url, *CACHE_TTL)
    try:
        b = ServeProcess(tmp_path / "b", "--db", db, "--redis", redis_url, *CACHE_TTL)
    except BaseException:
        a.stop()
        raise
    try:
        admin = {"Authorization": f"Bearer {a.banner['admin_token']}"}
        with (
            httpx.Client(base_url=a.url, headers=admin, timeout=30) as on_a,
            httpx.Client(base_url=b.url, timeout=30) as on_b,
        ):
            name = f"t-{uuid.uuid4().hex[:8]}"
            assert on_a.post("/admin/api/tenants", json={"name": name}).status_code == 201
            keys = [on_a.post(f"/admin/api/tenants/{name}/keys", json={}).json() for _ in range(2)]
            for k in keys:  # B has both keys cached now (for its hour-long TTL)
                assert (
                    on_b.get("/v1/models", headers={"Authorization": f"Bearer {k['secret']}"}).status_code
                    == 200
                )
            revoked = on_a.post(f"/admin/api/keys/{keys[0]['key']['id']}/revoke")
            assert revoked.status_code == 200
            took = _refused_within(on_b, keys[0]["secret"], ANNOUNCED_WITHIN_S)
            assert took is not None, "B still accepted the key revoked on A"
            assert (
                on_b.get("/v1/models", headers={"Authorization": f"Bearer {keys[1]['secret']}"}).status_code
                == 200
            )
            assert on_a.post(f"/admin/api/tenants/{name}/disable").status_code == 200
            took = _refused_within(on_b, keys[1]["secret"], ANNOUNCED_WITHIN_S)
            assert took is not None, "B still accepted a key of the tenant disabled on A"
            # The CLI (another process again) announces its changes too when given --redis.
            assert on_a.post(f"/admin/api/tenants/{name}/enable").status_code == 200
            third = on_a.post(f"/admin/api/tenants/{name}/keys", json={}).json()
            assert (
                on_b.get("/v1/models", headers={"Authorization": f"Bearer {third['secret']}"}).status_code
                == 200
            )
            cli = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "gateway.cli",
                    "keys",
                    "revoke",
                    third["key"]["id"],
                    "--db",
                    db,
                    "--redis",
                    redis_url,
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert cli.returncode == 0, cli.stderr
            took = _refused_within(on_b, third["secret"], ANNOUNCED_WITHIN_S)
            assert took is not None, "B still accepted a key revoked by the CLI"
    finally:
        b.stop()
        a.stop()
