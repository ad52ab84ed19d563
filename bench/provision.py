"""Bench tenants on a running deployment (`fairserve bench --url ... --admin-token ...`): each workload tenant
gets its own tenant, weight and key through the admin API, so the report's per-tenant charged service is
measured against the weights the workload declares, as with the self-started server."""

from __future__ import annotations

from collections.abc import Iterable

import httpx

PREFIX = "bench-"  # the deployment's tenants are named bench-<workload tenant>, apart from real ones


def provision_tenants(url: str, admin_token: str, tenants: Iterable[tuple[str, float]]) -> dict[str, str]:
    """A new API key for each (name, weight), creating the tenant or setting its weight; name → secret.

    Raises httpx.HTTPStatusError (with the server's message) when the admin API refuses.
    """
    keys: dict[str, str] = {}
    headers = {"Authorization": f"Bearer {admin_token}", "X-Admin-Actor": "bench"}
    with httpx.Client(base_url=f"{url.rstrip('/')}/admin/api", headers=headers, timeout=30.0) as admin:
        for name, weight in sorted(set(tenants)):
            tenant_name = PREFIX + name
            created = admin.post("/tenants", json={"name": tenant_name, "weight": weight})
            if created.status_code == 409:  # from an earlier run: same tenant, this run's weight
                admin.patch(f"/tenants/{tenant_name}", json={"weight": weight}).raise_for_status()
            else:
                created.raise_for_status()
            key = admin.post(f"/tenants/{tenant_name}/keys", json={"name": "bench"})
            key.raise_for_status()
            keys[name] = str(key.json()["secret"])
    return keys
