"""Revocation and disabling reach every replica within 1 s over Redis pub/sub (two real `fairserve serve`
processes on one database and one Redis; the key cache TTL is 5 s, so the TTL alone could not do it)."""

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


def test_revoke_and_disable_on_one_replica_refused_by_the_other_within_1s(
    tmp_path: Path, redis_url: str
) -> None:
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    a = ServeProcess(tmp_path / "a", "--db", db, "--redis", redis_url)
    try:
        b = ServeProcess(tmp_path / "b", "--db", db, "--redis", redis_url)
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
            for k in keys:  # B has both keys cached now (for its 5 s TTL)
                assert (
                    on_b.get("/v1/models", headers={"Authorization": f"Bearer {k['secret']}"}).status_code
                    == 200
                )
            revoked = on_a.post(f"/admin/api/keys/{keys[0]['key']['id']}/revoke")
            assert revoked.status_code == 200
            took = _refused_within(on_b, keys[0]["secret"], 1.0)
            assert took is not None, "B still accepted the revoked key 1 s after the revocation on A"
            assert (
                on_b.get("/v1/models", headers={"Authorization": f"Bearer {keys[1]['secret']}"}).status_code
                == 200
            )
            assert on_a.post(f"/admin/api/tenants/{name}/disable").status_code == 200
            took = _refused_within(on_b, keys[1]["secret"], 1.0)
            assert took is not None, "B still accepted a disabled tenant's key 1 s after disabling it on A"
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
            took = _refused_within(on_b, third["secret"], 1.0)
            assert took is not None, "B still accepted a key revoked by the CLI 1 s later"
    finally:
        b.stop()
        a.stop()
