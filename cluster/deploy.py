"""The driver's side of `fairserve ray`: join or start a cluster, and create, scale, list and stop actors.

Every actor is named and detached in the deployment's namespace, so a later `fairserve ray status` or
`scale` (another process, another driver) finds them by name: `fairserve-engine-<i>`, `fairserve-gateway-<i>`
and the registry. Ray restarts a dead actor by itself (`max_restarts`); nothing here supervises.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray._private.authentication import authentication_token_setup as token_setup

from cluster.config import ClusterConfig
from cluster.engine_actor import EngineActor
from cluster.fit import MIN_SHARE, Capacity, check_gpus, size
from cluster.gateway_actor import GatewayActor
from cluster.placement import release_ranks, reserve_ranks
from cluster.registry import REGISTRY_NAME, Registry
from engine.config import EngineConfig
from engine.serving.remote.curve import ClusterKey
from gateway.settings import GatewaySettings

ENGINE_PREFIX = "fairserve-engine-"
GATEWAY_PREFIX = "fairserve-gateway-"
STOP_TIMEOUT_S = 30.0
PENDING_REPORT_S = 10.0  # `ray up` says what it is still waiting for this often


def connect(cfg: ClusterConfig) -> bool:
    """Join `cfg.address`, or start a local cluster; True when this process started it (and so ends it)."""
    if ray.is_initialized():
        return False
    quiet: dict[str, Any] = {"log_to_driver": False, "namespace": cfg.namespace}
    if cfg.address:
        # A local cluster Ray starts requires its token (~/.ray/auth_token) by default, but a driver joining
        # one presents it only in token mode: turn that on when the token is there and no mode is set.
        token_setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        ray.init(address=cfg.address, **quiet)
        return False
    ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, **quiet)
    return True


def registry(cfg: ClusterConfig) -> Any:
    """The deployment's registry actor, created on first use (it also keeps the settings `ray up` used)."""
    actor = ray.remote(Registry).options(
        name=REGISTRY_NAME, lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=-1
    )
    return actor.remote(cfg.poll_interval_s, cfg.ping_timeout_s)


def _named(prefix: str) -> list[str]:
    """Names of this namespace's live actors with `prefix`, in index order."""
    names = [n for n in ray.util.list_named_actors(all_namespaces=False) if n.startswith(prefix)]
    return sorted(names, key=lambda n: int(n.removeprefix(prefix)))


def engine_names() -> list[str]:
    """The deployment's engine actors."""
    return _named(ENGINE_PREFIX)


def gateway_names() -> list[str]:
    """The deployment's gateway actors."""
    return _named(GATEWAY_PREFIX)


def _free_names(prefix: str, taken: list[str], n: int) -> list[str]:
    used = {int(name.removeprefix(prefix)) for name in taken}
    free = (i for i in range(len(used) + n + 1) if i not in used)
    return [f"{prefix}{next(free)}" for _ in range(n)]


def capacity() -> Capacity:
    """The connected cluster's CPUs and GPUs, free and in all."""
    free, total = ray.available_resources(), ray.cluster_resources()
    return Capacity(float(free.get("CPU", 0.0)), float(total.get("CPU", 0.0)), float(free.get("GPU", 0.0)))


def local_capacity(cfg: ClusterConfig) -> Capacity:
    """What the local cluster `connect` would start has, known before it starts (`--num-cpus`, else the CPUs
    Ray would count: this process's affinity and cgroup limit)."""
    cpus = float(cfg.num_cpus or ray._private.utils.get_num_cpus())
    return Capacity(cpus, cpus, gpus_free=float("inf"))  # GPUs are checked once the cluster is up


def fit(
    settings: GatewaySettings,
    cfg: ClusterConfig,
    engines: int,
    gateways: int,
    free: Capacity | None = None,
) -> ClusterConfig:
    """`cfg` with the reservations of `engines` and `gateways` more actors sized to the cluster (`free`,
    default: the connected one's; cluster/fit.py); DoesNotFit, naming the numbers, when they cannot all be
    placed."""
    free = free or capacity()
    if engines and settings.engine.device.startswith("cuda"):
        check_gpus(engines, free, settings.engine.tensor_parallel_size)
    sized = size(cfg, engines, gateways, free)
    return cfg.model_copy(update={"engine_cpus": sized.engine_cpus, "gateway_cpus": sized.gateway_cpus})


def engine_resources(config: EngineConfig, cfg: ClusterConfig) -> dict[str, float]:
    """One GPU per engine on CUDA (Ray then sets CUDA_VISIBLE_DEVICES, so the engine sees it as cuda:0),
    and `engine_cpus` (sized by `fit`).

    With tensor parallelism one actor holds every rank's GPU (cuda:0..N-1 in it), in its placement group's
    one bundle (cluster/placement.py): the ranks are the actor's child processes (engine/worker/parallel/), so Ray's
    restart of the actor restarts them as a unit, into the same reserved GPUs."""
    cpus = MIN_SHARE if cfg.engine_cpus is None else cfg.engine_cpus
    if config.device.startswith("cuda"):
        return {"num_gpus": config.tensor_parallel_size, "num_cpus": cpus}
    return {"num_cpus": cpus}


def start_engines(
    settings: GatewaySettings, cfg: ClusterConfig, n: int, key: ClusterKey | None = None
) -> list[Any]:
    """Create `n` more engine actors (they register themselves once serving; with `key`, only to gateways
    holding it)."""
    config = settings.engine
    if config.device.startswith("cuda"):
        config = config.model_copy(update={"device": "cuda"})  # the one GPU Ray gave the actor
    actors = []
    for name in _free_names(ENGINE_PREFIX, engine_names(), n):
        resources = engine_resources(settings.engine, cfg)
        options = ray.remote(EngineActor).options(
            name=name,
            lifetime="detached",
            max_restarts=cfg.max_restarts,
            max_task_retries=0,
            scheduling_strategy=reserve_ranks(
                name, resources
            ),  # all ranks as one unit (cluster/placement.py)
            **resources,
        )
        actors.append(options.remote(name, config, cfg.engine_host, key))
    return actors


def start_gateways(
    settings: GatewaySettings, cfg: ClusterConfig, secrets: dict[str, str], n: int
) -> list[Any]:
    """Create `n` more gateway actors; replica i listens on `port + i` (or a free port when port is 0)."""
    actors = []
    for name in _free_names(GATEWAY_PREFIX, gateway_names(), n):
        index = int(name.removeprefix(GATEWAY_PREFIX))
        own = settings.model_copy(update={"port": settings.port + index if settings.port else 0})
        options = ray.remote(GatewayActor).options(
            name=name,
            lifetime="detached",
            max_restarts=cfg.max_restarts,
            max_task_retries=0,
            num_cpus=MIN_SHARE if cfg.gateway_cpus is None else cfg.gateway_cpus,
        )
        actors.append(options.remote(name, own, secrets, cfg.poll_interval_s))
    return actors


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.1) -> None:
    """Poll `condition` until true; TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)  # polling a condition, bounded by the deadline


def first_url(
    gateway: Any, timeout_s: float, say: Callable[[str], None], every_s: float = PENDING_REPORT_S
) -> str:
    """The first gateway's URL once it listens; every `every_s` meanwhile, `say` which actors Ray has not
    started yet and the cluster's free CPUs (a placement that never comes is visible, not silent)."""
    ref = gateway.url.remote()
    began = time.monotonic()
    while True:
        waited = time.monotonic() - began
        if waited >= timeout_s:
            raise TimeoutError(f"the first gateway did not start within {timeout_s:.0f}s")
        ready, _ = ray.wait([ref], timeout=min(every_s, timeout_s - waited))
        if ready:
            return str(ray.get(ref))
        waited = time.monotonic() - began
        pending = ", ".join(f"{name} ({state})" for name, state in pending_actors()) or "none"
        free = capacity()
        say(
            f"waiting {waited:.0f}s for the first gateway; actors Ray has not started: {pending}; "
            f"CPUs free {free.cpus_free:g} of {free.cpus_total:g}"
        )


def pending_actors(prefix: str = "fairserve-") -> list[tuple[str, str]]:
    """(name, Ray state) of this namespace's named actors with `prefix` that are not alive yet (or again).

    Ray's actor table (`ray._private.state`, read from the GCS): the public state API needs the dashboard,
    which a local cluster here runs without."""
    ours = {n for n in ray.util.list_named_actors(all_namespaces=False) if n.startswith(prefix)}
    table = ray._private.state.actors()  # actor id -> info
    return sorted(
        (info["Name"], info["State"])
        for info in table.values()
        if info["Name"] in ours and info["State"] not in ("ALIVE", "DEAD")
    )


def drain_engines(names: list[str], cfg: ClusterConfig) -> int:
    """Scale-down: take engines out of every gateway's rotation, wait until no gateway has a request live
    on them (or `drain_timeout_s` passed), then stop and kill them for good. Returns how many requests
    were live on them when the drain began (each one finished there rather than being cut off)."""
    reg = registry(cfg)
    ray.get([reg.drain_engine.remote(name) for name in names])
    gateways = [ray.get_actor(g) for g in gateway_names()]
    seen: list[list[dict[str, Any]]] = ray.get([g.engine_loads.remote() for g in gateways])
    live = sum(
        int(load["in_flight"] or 0)
        for loads in seen
        for load in loads
        if load["key"].partition("@")[0] in names
    )

    def drained() -> bool:
        return not any(_holds(g, name) for g in gateways for name in names)

    # Past the grace, what is left ends as the engine stops: cancelled, each with its own ledger row.
    with contextlib.suppress(TimeoutError):
        wait_until(drained, cfg.drain_timeout_s, f"engines {names} to drain", every_s=cfg.poll_interval_s / 2)
    for name in names:
        kill_actor(name, "stop")
        release_ranks(name)
        ray.get(reg.forget_engine.remote(name))
    return live


def _holds(gateway: Any, engine_name: str) -> bool:
    """Whether a gateway still routes to, or has requests live on, an engine. A dead gateway holds nothing
    (its requests died with it; restarted, it reads the registry and skips draining ones), but a slow one
    does: on a loaded machine a live gateway can take longer than the call's timeout to answer, and taking
    that for "nothing" killed engines with requests still in flight. `drain_timeout_s` bounds the wait."""
    try:
        return bool(ray.get(gateway.holds.remote(engine_name), timeout=10))
    except ray.exceptions.GetTimeoutError:
        return True
    except Exception:
        return False


def kill_actor(name: str, stop_method: str) -> None:
    """Ask an actor to stop cleanly (bounded), then kill it without restart."""
    try:
        actor = ray.get_actor(name)
    except ValueError:
        return
    with contextlib.suppress(Exception):  # dead, restarting or stuck: the kill below ends it either way
        ray.get(getattr(actor, stop_method).remote(), timeout=STOP_TIMEOUT_S)
    ray.kill(actor, no_restart=True)


def scale_engines(
    settings: GatewaySettings, cfg: ClusterConfig, target: int, key: ClusterKey | None = None
) -> int:
    """Add engines (returns once they serve), or drain and remove the newest ones; requests drained."""
    names = engine_names()
    if target > len(names):
        ray.get([a.engine_id.remote() for a in start_engines(settings, cfg, target - len(names), key)])
    elif target < len(names):
        return drain_engines(names[target:], cfg)
    return 0


def scale_gateways(
    settings: GatewaySettings, cfg: ClusterConfig, secrets: dict[str, str], target: int
) -> None:
    """Add gateways (returns once they listen), or stop the newest ones (each drains its own requests)."""
    names = gateway_names()
    if target > len(names):
        ray.get([a.url.remote() for a in start_gateways(settings, cfg, secrets, target - len(names))])
    reg = registry(cfg)
    for name in names[target:]:
        kill_actor(name, "stop")
        ray.get(reg.forget_gateway.remote(name))


def down(cfg: ClusterConfig) -> None:
    """Stop the gateways (draining), then the engines, then the registry."""
    reg = registry(cfg)
    for name in gateway_names():
        kill_actor(name, "stop")
    for name in engine_names():
        kill_actor(name, "stop")
        release_ranks(name)
    ray.kill(reg, no_restart=True)


@dataclass(frozen=True)
class Deployment:
    """What `ray status` prints."""

    engines: list[dict[str, Any]]
    gateways: list[dict[str, Any]]


def status(cfg: ClusterConfig) -> Deployment:
    """Every engine (registered or not yet) with its load per gateway, and every gateway with its URL."""
    reg = registry(cfg)
    registered = {e.name: e for e in ray.get(reg.engines.remote())}
    gateways = {g.name: g for g in ray.get(reg.gateways.remote())}
    loads: dict[str, list[dict[str, Any]]] = {}
    gw_rows = []
    for name in gateway_names():
        row: dict[str, Any] = {"name": name, "url": gateways[name].url if name in gateways else None}
        seen: list[dict[str, Any]] = []
        try:
            seen = ray.get(ray.get_actor(name).engine_loads.remote(), timeout=5)
            row["health"] = "up"
        except Exception as exc:
            row["health"] = f"down ({type(exc).__name__})"
        for load in seen:
            loads.setdefault(load["key"].partition("@")[0], []).append(load)
        gw_rows.append(row)
    engines = []
    for name in engine_names():
        entry = registered.get(name)
        seen = loads.get(name, [])
        engines.append(
            {
                "name": name,
                "address": entry.address if entry else None,
                "engine_id": entry.engine_id if entry else None,
                "node": entry.node_ip if entry else None,
                "health": ("draining" if entry.draining else "up") if entry else "starting",
                "alive_at_gateways": sum(1 for s in seen if s["alive"]),
                "running": max((s["running"] for s in seen), default=0),
                "waiting": max((s["waiting"] for s in seen), default=0),
                "in_flight": sum(s["in_flight"] or 0 for s in seen),
            }
        )
    return Deployment(engines, gw_rows)
