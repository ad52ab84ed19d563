"""`python -m experiments.ray_serve_ab`: the gateway as a Ray Serve deployment against the gateway actor
(cluster/gateway_actor.py), both in front of the same engine actor, as a ratio of median latencies of
one-token completions in alternating rounds. Measures Serve's proxy hop for docs/deploy.md; not used in
production, so it lives here and not in the `cluster` package (needs the `ray` extra).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve
from starlette.types import ASGIApp

from billing import BillingStore, Database
from cluster import deploy
from cluster.config import ClusterConfig
from cluster.membership import join, member_key
from cluster.registry import EngineEntry
from experiments.ray_measure import _round
from gateway.app import create_app
from gateway.edge.auth import ensure_demo_key
from gateway.settings import GatewaySettings
from routing.router import EngineRouter


def _serve_app(settings: GatewaySettings) -> Any:
    def build() -> ASGIApp:
        registry = ray.get_actor("fairserve-registry")
        first: EngineEntry = ray.get(registry.engines.remote())[0]
        router = EngineRouter({member_key(first): join(first, settings.engine_silence())}, settings.routing)
        return create_app(settings, engine=router)

    deployment: Any = serve.deployment(serve.ingress(build)(), name="fairserve-serve-gateway")
    return deployment.bind()


def main() -> None:
    data = Path(tempfile.mkdtemp(prefix="fairserve-serve-ab-"))
    settings = GatewaySettings.load(
        {"port": 0, "data_dir": str(data), "engine": {"max_num_seqs": 8, "num_kv_blocks": 256}}
    )
    db = Database(settings.database_url())
    db.upgrade()
    key = ensure_demo_key(BillingStore(db), data, settings.demo_tenant)
    db.dispose()
    cfg = ClusterConfig(engine_host="127.0.0.1", num_cpus=6)
    deploy.connect(cfg)
    deploy.registry(cfg)
    ray.get([a.engine_id.remote() for a in deploy.start_engines(settings, cfg, 1)])
    actor_url = ray.get(deploy.start_gateways(settings, cfg, {}, 1)[0].url.remote())
    serve.start(http_options={"host": "127.0.0.1", "port": 8123})
    serve.run(_serve_app(settings), route_prefix="/")
    headers = {"Authorization": f"Bearer {key}"}
    clients = {
        "actor": httpx.Client(base_url=actor_url, timeout=60, headers=headers),
        "serve": httpx.Client(base_url="http://127.0.0.1:8123", timeout=60, headers=headers),
    }
    model = clients["actor"].get("/v1/models").json()["data"][0]["id"]
    for c in clients.values():
        _round(c, model, 5)
    ratios = []
    for i in range(6):
        order = ["actor", "serve"][:: 1 if i % 2 == 0 else -1]
        medians = {name: _round(clients[name], model, 40) for name in order}
        ratios.append(medians["serve"] / medians["actor"])
        print(
            f"round {i}: serve {medians['serve'] * 1e3:.1f} ms, actor {medians['actor'] * 1e3:.1f} ms, "
            f"ratio {ratios[-1]:.2f}",
            flush=True,
        )
    print(
        f"Serve deployment / gateway actor, median latency of 1-token requests: {statistics.median(ratios):.2f} "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f})",
        flush=True,
    )
    serve.shutdown()
    deploy.down(cfg)
    ray.shutdown()


if __name__ == "__main__":
    main()
