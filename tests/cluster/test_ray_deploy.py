"""fairserve on a local Ray cluster: `fairserve ray up` serves OpenAI requests from 2 engines behind 1 gateway;
an engine actor killed with SIGKILL fails only its own in-flight requests (retryable), is restarted by Ray and
serves again; scaling 2 -> 3 -> 1 engines under load loses no accepted request; a tensor-parallel engine added
to it sits in its placement group, and killing its rank 1 restarts the engine, ranks and all, into that group;
every answered request has its ledger row (PostgreSQL, shared by URL). The tests run in file order on one
deployment."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import psutil
import pytest
import ray
from sqlalchemy import text

from billing import Database
from cluster import deploy
from cluster.commands import CLUSTER_KEY_FILE
from cluster.config import ClusterConfig
from cluster.placement import group_state, ranks_group
from cluster.registry import EngineEntry
from engine.serving.remote.curve import ClusterKey
from gateway.settings import GatewaySettings
from tests.cluster.conftest import Cluster, RayUp
from tests.cluster.load import Load
from tests.gateway.conftest import wait_for

ENGINES = 2


@dataclass
class Deployment:
    """What `fairserve ray up` printed, and the model it serves."""

    cluster: Cluster
    url: str
    api_key: str
    db_url: str
    model: str
    up_to_first_answer_s: float

    def gateway(self) -> Any:
        return ray.get_actor("fairserve-gateway-0")

    def registered(self) -> dict[str, Any]:
        """The registry's engines by actor name."""
        registry = ray.get_actor("fairserve-registry")
        entries: list[EngineEntry] = ray.get(registry.engines.remote())
        return {e.name: e for e in entries}

    def loads(self) -> dict[str, dict[str, Any]]:
        """The gateway's view of each engine (router key -> load)."""
        return {load["key"]: load for load in ray.get(self.gateway().engine_loads.remote())}

    def billed(self, ids: set[str]) -> set[str]:
        db = Database(self.db_url)
        try:
            with db.engine.connect() as conn:
                rows = conn.execute(text("SELECT request_id FROM usage WHERE request_id LIKE 'ray-%'"))
                return {r[0] for r in rows} & ids
        finally:
            db.dispose()

    def assert_ledger_complete(self, answered: set[str]) -> None:
        """Every answered request has its row (the ledger writes behind: wait, bounded, for the flush)."""
        wait_for(lambda: self.billed(answered) == answered, 60, "every answered request in the ledger")


@pytest.fixture(scope="module")
def deployment(ray_up: RayUp, ray_cluster: Cluster) -> Iterator[Deployment]:
    """The package's deployment (`fairserve ray up --engines 2`, tests/cluster/conftest.py), once it answers."""
    banner = ray_up.banner
    for key in ("ray", "url", "admin", "api_key", "admin_token"):
        assert key in banner, banner
    client = openai.OpenAI(base_url=banner["url"] + "/v1", api_key=banner["api_key"], max_retries=0)
    model = client.models.list().data[0].id
    client.completions.create(model=model, prompt="hello", max_tokens=2)
    up_s = time.monotonic() - ray_up.launched_at
    print(f"fairserve ray up --engines 2 (as typed, 2-core machine) -> first answered request: {up_s:.1f}s")
    yield Deployment(ray_cluster, banner["url"], banner["api_key"], ray_up.db_url, model, up_s)


def test_two_engines_one_gateway_serve_openai(deployment: Deployment) -> None:
    client = openai.OpenAI(base_url=deployment.url + "/v1", api_key=deployment.api_key, max_retries=0)
    chat = client.chat.completions.create(
        model=deployment.model, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.choices[0].message.content is not None and chat.usage is not None
    streamed = client.completions.create(model=deployment.model, prompt="count", max_tokens=4, stream=True)
    assert any(chunk.choices and chunk.choices[0].text for chunk in streamed)
    assert set(deployment.registered()) == {f"fairserve-engine-{i}" for i in range(ENGINES)}
    load = Load(deployment.url, deployment.api_key, deployment.model)
    try:
        # Concurrent load spreads: both engines get requests routed to them.
        wait_for(
            lambda: sum(1 for v in deployment.loads().values() if v["routed"]) == ENGINES,
            120,
            "both engines serving",
        )
    finally:
        tally = load.finish()
    assert set(tally) == {"answered"}, tally
    deployment.assert_ledger_complete(load.ids("answered"))
    status = deployment.cluster.fairserve("status")
    assert status["engines"] == str(ENGINES) and status["gateways"] == "1", status


def test_reservations_fit_the_cluster_with_room_to_scale(deployment: Deployment) -> None:
    """`ray up` without --num-cpus or --engine-cpus sized each actor to the local cluster: fractions that
    take at most half of its CPUs (cluster/fit.py), so 2 engines and a gateway fit on 2 cores."""
    kept: ClusterConfig = ray.get(ray.get_actor("fairserve-registry").deployment.remote())[2]
    total = ray.cluster_resources()["CPU"]
    assert 0 < kept.engine_cpus < 1 and 0 < kept.gateway_cpus < 1, kept
    assert ENGINES * kept.engine_cpus + kept.gateway_cpus <= total / 2, (kept, total)


class _Probe:
    def url(self) -> str:
        return "never"


def test_an_actor_ray_cannot_place_is_reported_while_up_waits(deployment: Deployment) -> None:
    """What `ray up` says while it waits: the actors Ray has not started, in Ray's own words."""
    probe = ray.remote(_Probe).options(name="fairserve-probe", num_cpus=0, resources={"fairserve-absent": 1})
    handle: Any = probe.remote()
    said: list[str] = []
    try:
        wait_for(
            lambda: ("fairserve-probe", "PENDING_CREATION") in deploy.pending_actors(),
            30,
            "the probe pending in Ray's actor table",
        )
        with pytest.raises(TimeoutError, match="did not start"):
            deploy.first_url(handle, timeout_s=1.0, say=said.append, every_s=0.3)
    finally:
        ray.kill(handle, no_restart=True)
    assert said and all("fairserve-probe (PENDING_CREATION)" in line for line in said), said
    assert all("CPUs free" in line for line in said), said


def test_killed_engine_fails_its_requests_retryably_and_serves_again(deployment: Deployment) -> None:
    victim = deployment.registered()["fairserve-engine-0"]
    key = f"{victim.name}@{victim.engine_id}"
    load = Load(deployment.url, deployment.api_key, deployment.model, long_share=0.6)
    try:
        wait_for(
            lambda: (deployment.loads().get(key) or {}).get("in_flight", 0) > 0, 60, "requests on the victim"
        )
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        # The gateway sees the killed engine's connection drop and takes it out of the rotation, before Ray
        # or the registry notice anything; each look is one call to the gateway actor, a few ms.
        wait_for(
            lambda: not (deployment.loads().get(key) or {"alive": False})["alive"],
            10,
            "the gateway to count the killed engine down",
        )
        dropped_s = time.monotonic() - killed_at
        wait_for(
            lambda: load.count("retryable") > 0, 30, "a retryable failure of a request on the killed engine"
        )
        back = wait_for(lambda: _restarted(deployment, victim), 120, "Ray to restart the engine actor")
        registered_s = time.monotonic() - killed_at
        new_key = f"{back.name}@{back.engine_id}"
        wait_for(
            lambda: (deployment.loads().get(new_key) or {}).get("routed", 0) > 0,
            60,
            "requests routed to the restarted engine",
        )
        seen = load.count("answered")
        wait_for(lambda: load.count("answered") > seen + 5, 60, "answers after the restart")
        serving_s = time.monotonic() - killed_at
    finally:
        tally = load.finish()
    print(
        f"engine actor SIGKILL -> dropped by the gateway {dropped_s:.2f}s, re-registered {registered_s:.1f}s, "
        f"routed to again {serving_s:.1f}s; {tally}"
    )
    assert back.pid != victim.pid and back.address != victim.address
    assert set(tally) <= {"answered", "retryable"}, tally
    assert key not in deployment.loads(), "the dead incarnation is still a member"
    deployment.assert_ledger_complete(load.ids("answered"))


def _restarted(deployment: Deployment, victim: Any) -> Any:
    entry = deployment.registered().get(victim.name)
    return entry if entry is not None and entry.engine_id != victim.engine_id else None


def test_scale_2_3_1_loses_no_accepted_request(deployment: Deployment) -> None:
    load = Load(deployment.url, deployment.api_key, deployment.model, long_share=0.5)
    try:
        wait_for(lambda: load.count("answered") > 5, 60, "answers before scaling")
        assert deployment.cluster.fairserve("scale", "--engines", "3")["engines"] == "3"
        wait_for(
            lambda: any(
                k.startswith("fairserve-engine-2@") and v["routed"] > 0 for k, v in deployment.loads().items()
            ),
            60,
            "requests routed to the third engine",
        )
        wait_for(
            lambda: all(v["in_flight"] for v in deployment.loads().values()),
            60,
            "requests in flight on every engine before scaling down",
        )
        down = deployment.cluster.fairserve("scale", "--engines", "1")
        assert down["engines"] == "1"
        drained = int(down["drained"].split()[0])
        assert drained > 0, "no request was in flight on the removed engines: the drain was not exercised"
        assert set(deployment.registered()) == {"fairserve-engine-0"}
        seen = load.count("answered")
        wait_for(lambda: load.count("answered") > seen + 5, 120, "answers from the one engine left")
    finally:
        tally = load.finish()
    print(f"scale 2 -> 3 -> 1: {drained} requests drained from the removed engines; {tally}")
    assert set(tally) == {"answered"}, tally
    assert [k.partition("@")[0] for k in deployment.loads()] == ["fairserve-engine-0"]
    deployment.assert_ledger_complete(load.ids("answered"))
    with httpx.Client(base_url=deployment.url, timeout=10) as client:
        assert client.get("/readyz").status_code == 200


def test_tensor_parallel_engine_restarts_as_one_unit_in_its_placement_group(deployment: Deployment) -> None:
    """A TP=2 engine joins the deployment (the kept settings, tensor_parallel_size 2) in a placement group of
    its own; rank 1 (a child process of the engine actor) is killed mid-stream: the engine's in-flight
    requests fail retryably, Ray restarts the actor and its ranks into the same group, it serves again, and
    every answered request has its ledger row. Scale-down removes the group with the engine."""
    kept: Any = ray.get(ray.get_actor("fairserve-registry").deployment.remote())
    settings: GatewaySettings = kept[0]
    secrets: dict[str, str] = kept[1]
    cfg: ClusterConfig = kept[2]
    tp = settings.model_copy(
        update={"engine": settings.engine.model_copy(update={"tensor_parallel_size": 2})}
    )
    before = set(deploy.engine_names())
    deploy.start_engines(tp, cfg, 1, ClusterKey.from_secret(secrets[CLUSTER_KEY_FILE]))
    (name,) = set(deploy.engine_names()) - before
    first = wait_for(lambda: deployment.registered().get(name), 180, "the TP=2 engine to register")
    group = ranks_group(name)
    assert group is not None and group_state(group) == "CREATED"
    assert _actor_group(name) == group.id.hex()
    key = f"{name}@{first.engine_id}"
    load = Load(deployment.url, deployment.api_key, deployment.model, long_share=0.6)
    try:
        wait_for(lambda: (deployment.loads().get(key) or {}).get("in_flight", 0) > 0, 120, "requests on it")
        (rank1,) = psutil.Process(first.pid).children()  # engine/worker/rank_steps.py starts one per rank > 0
        rank1.kill()
        wait_for(lambda: load.count("retryable") > 0, 60, "a retryable failure of a request on the engine")
        back = wait_for(lambda: _restarted(deployment, first), 180, "Ray to restart the engine and its ranks")
        new_key = f"{back.name}@{back.engine_id}"
        wait_for(lambda: (deployment.loads().get(new_key) or {}).get("routed", 0) > 0, 60, "routed to again")
        seen = load.count("answered")
        wait_for(lambda: load.count("answered") > seen + 5, 60, "answers after the restart")
    finally:
        tally = load.finish()
    print(f"TP=2 engine, rank 1 SIGKILL mid-stream: {tally}")
    assert back.pid != first.pid and not psutil.pid_exists(rank1.pid)
    assert len(psutil.Process(back.pid).children()) == 1, "the restarted engine has its rank 1 again"
    assert _actor_group(name) == group.id.hex(), "restarted into the same placement group"
    assert set(tally) <= {"answered", "retryable"}, tally
    deployment.assert_ledger_complete(load.ids("answered"))
    deploy.drain_engines([name], cfg)
    assert ranks_group(name) is None or group_state(group) == "REMOVED"


def _actor_group(name: str) -> str | None:
    """The placement group id (hex) the named actor runs in, as it reports it."""
    described: Any = ray.get(ray.get_actor(name).describe.remote(), timeout=30)
    group = described["placement_group"]
    return None if group is None else str(group)
