"""`fairserve bench --url --admin-token`: each bench tenant gets its own tenant, weight and key on the running
deployment, through its admin API (bench/provision.py). A real `fairserve serve` over real HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx

from bench.cli import BenchOptions
from bench.provision import provision_tenants
from bench.run import _remote
from tests.gateway.serve_process import ServeProcess


def test_each_bench_tenant_gets_its_own_key_and_weight(tmp_path: Path) -> None:
    proc = ServeProcess(tmp_path)
    try:
        url, token = proc.url, proc.banner["admin_token"]
        admin = {"Authorization": f"Bearer {token}"}
        keys = provision_tenants(url, token, [("alice", 1.0), ("bob", 3.0)])
        assert set(keys) == {"alice", "bob"} and keys["alice"] != keys["bob"]
        with httpx.Client(base_url=url, timeout=60) as c:
            tenants = {t["name"]: t for t in c.get("/admin/api/tenants", headers=admin).json()["tenants"]}
            assert (tenants["bench-alice"]["weight"], tenants["bench-bob"]["weight"]) == (1.0, 3.0)
            for name, key in keys.items():  # each key is its own tenant's
                listed = c.get("/admin/api/keys", params={"tenant": f"bench-{name}"}, headers=admin).json()
                assert [k["prefix"] for k in listed["keys"] if key.startswith(k["prefix"])], name
                assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        # A second run finds the tenants and sets this run's weights.
        again = provision_tenants(url, token, [("bob", 2.0)])
        assert again["bob"] != keys["bob"]
        bob = httpx.get(f"{url}/admin/api/tenants/bench-bob", headers=admin, timeout=30).json()
        assert bob["weight"] == 2.0
        # The bench's remote target carries a key per workload tenant, with no --api-key needed.
        target = _remote(BenchOptions(url=url, admin_token=token, workloads=["chat"]))
        assert target.keys and all(target.key(name) == key for name, key in target.keys.items())
        assert target.default_key in target.keys.values()
    finally:
        proc.stop()
