"""`fairserve ray up|status|scale|down`: fairserve's engines and gateways as actors on a Ray cluster.

Plugged into `fairserve` through the `fairserve.commands` entry-point group (pyproject.toml), so the
gateway never imports Ray. `up` takes every `serve` flag too (model, budgets, --db, --redis, ...): the
engine part goes to the engine actors, the whole tree to the gateway actors.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any

import httpx
import ray
from pydantic import ValidationError

from billing import BillingStore, Database
from cluster import deploy
from cluster.config import ClusterConfig
from gateway.edge.auth import (
    ADMIN_TOKEN_FILE,
    METRICS_TOKEN_FILE,
    ensure_admin_token,
    ensure_demo_key,
    ensure_metrics_token,
)
from gateway.settings import GatewaySettings, settings_error_text
from gateway.settings_flags import add_knob_flags, flags_from_args

_CONNECT = ("address", "namespace")


def register(subparsers: Any) -> None:
    """Add `ray` and its four subcommands."""
    ray_parser = subparsers.add_parser("ray", help="run engines and gateways on a Ray cluster")
    sub = ray_parser.add_subparsers(dest="ray_command", required=True)
    # `resolve`: the cluster's --engines (a count) replaces serve's --engines (addresses, meaningless here).
    up = sub.add_parser("up", help="start engines and gateways (and a local cluster unless --address)",
                        conflict_handler="resolve")
    add_knob_flags(up)
    _cluster_flags(up, ("address", "namespace", "engines", "gateways", "engine_cpus", "gateway_cpus",
                        "max_restarts", "engine_host", "num_cpus", "poll_interval_s", "ping_timeout_s",
                        "drain_timeout_s", "ready_timeout_s"))
    up.set_defaults(func=cmd_up)
    status = sub.add_parser("status", help="list engines and gateways with their health and load")
    _cluster_flags(status, _CONNECT)
    status.set_defaults(func=cmd_status)
    scale = sub.add_parser("scale", help="change the number of engines (scale-down drains first) or gateways")
    _cluster_flags(scale, (*_CONNECT, "engines", "gateways", "drain_timeout_s"))
    scale.set_defaults(func=cmd_scale)
    down = sub.add_parser("down", help="stop the gateways (draining), the engines and the registry")
    _cluster_flags(down, _CONNECT)
    down.set_defaults(func=cmd_down)


def _cluster_flags(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """One flag per ClusterConfig field named (unset flags fall back to FAIRSERVE_RAY__* and the default)."""
    group = parser.add_argument_group("cluster (each also FAIRSERVE_RAY__<NAME> in the environment)")
    for name in names:
        field = ClusterConfig.model_fields[name]
        kind = next((t for t in (int, float) if t in _types(field.annotation)), str)
        group.add_argument("--" + name.replace("_", "-"), dest="ray__" + name, type=kind, default=argparse.SUPPRESS,
                           help=f"{field.description} [default {field.default}]")


def _types(annotation: Any) -> tuple[Any, ...]:
    return getattr(annotation, "__args__", (annotation,))


def _cluster_config(args: argparse.Namespace, **overrides: Any) -> ClusterConfig:
    given = {k.removeprefix("ray__"): v for k, v in vars(args).items() if k.startswith("ray__")}
    return ClusterConfig(**{**given, **overrides})


def _gateway_settings(args: argparse.Namespace) -> GatewaySettings:
    flags = flags_from_args(args)
    flags.pop("engines", None)
    return GatewaySettings.load(flags, args.config)


def _secrets(settings: GatewaySettings) -> tuple[dict[str, str], dict[str, str]]:
    """Migrate the database, mint the demo key and tokens here, once; (tokens for replicas, banner)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.database_url())
    db.upgrade()
    api_key = ensure_demo_key(BillingStore(db), settings.data_dir, settings.demo_tenant) or (
        f"none (tenant {settings.demo_tenant!r} already exists; `fairserve keys create --tenant "
        f"{settings.demo_tenant}` issues a key)")
    db.dispose()
    admin, metrics = ensure_admin_token(settings.data_dir), ensure_metrics_token(settings.data_dir)
    return ({ADMIN_TOKEN_FILE: admin, METRICS_TOKEN_FILE: metrics},
            {"api_key": api_key, "metrics_token": metrics, "admin_token": admin})


def _wait_answering(url: str, timeout_s: float) -> None:
    """Until the gateway's /healthz answers 200 (bounded)."""
    def answers() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False
    deploy.wait_until(answers, timeout_s, f"the gateway at {url} to answer")


def cmd_up(args: argparse.Namespace) -> int:
    """Start the deployment, print the banner once the first gateway answers; stay up if the cluster is ours."""
    try:
        settings = _gateway_settings(args)
        cfg = _cluster_config(args)
    except (ValidationError, ValueError) as exc:
        print(f"fairserve ray up: invalid settings:\n{settings_error_text(exc)}", file=sys.stderr)
        return 2
    secrets, banner = _secrets(settings)
    started = deploy.connect(cfg)
    if started and cfg.engine_host is None:
        cfg = cfg.model_copy(update={"engine_host": "127.0.0.1"})  # one machine: engines stay on loopback
    if deploy.engine_names() or deploy.gateway_names():
        print(f"fairserve ray up: namespace {cfg.namespace!r} already has a deployment; "
              "`fairserve ray down` it first or pick another --namespace", file=sys.stderr)
        return 1
    reg = deploy.registry(cfg)
    ray.get(reg.keep_deployment.remote(settings, secrets, cfg))
    deploy.start_engines(settings, cfg, cfg.engines)
    gateways = deploy.start_gateways(settings, cfg, secrets, cfg.gateways)
    url = ray.get(gateways[0].url.remote(), timeout=cfg.ready_timeout_s)
    _wait_answering(url, cfg.ready_timeout_s)
    lines = [f"url: {url}", f"admin: {url}/admin", *(f"{k}: {v}" for k, v in banner.items())]
    print("\n".join(lines), flush=True)
    if started:
        _serve_until_signal(cfg)
    return 0


def _serve_until_signal(cfg: ClusterConfig) -> None:
    """The local cluster lives in this process: hold it until SIGINT/SIGTERM, then take it down."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    deploy.down(cfg)
    ray.shutdown()


def cmd_status(args: argparse.Namespace) -> int:
    """Print each engine and gateway with its health and load."""
    cfg = _cluster_config(args, address=getattr(args, "ray__address", None) or "auto")
    deploy.connect(cfg)
    found = deploy.status(cfg)
    print(f"engines: {len(found.engines)}")
    for e in found.engines:
        print(f"  {e['name']}  {e['health']}  {e['address']}  node={e['node']}  "
              f"running={e['running']} waiting={e['waiting']} in_flight={e['in_flight']}  "
              f"alive_at_gateways={e['alive_at_gateways']}/{len(found.gateways)}")
    print(f"gateways: {len(found.gateways)}")
    for g in found.gateways:
        print(f"  {g['name']}  {g['health']}  {g['url']}")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    """Change the engine and/or gateway count to the one given."""
    cfg = _cluster_config(args, address=getattr(args, "ray__address", None) or "auto")
    deploy.connect(cfg)
    kept = ray.get(deploy.registry(cfg).deployment.remote())
    if kept is None:
        print("fairserve ray scale: no deployment in this namespace (run `fairserve ray up`)", file=sys.stderr)
        return 1
    settings, secrets, kept_cfg = kept
    cfg = kept_cfg.model_copy(update={"drain_timeout_s": cfg.drain_timeout_s})
    started = time.monotonic()
    drained = 0
    if hasattr(args, "ray__engines"):
        drained = deploy.scale_engines(settings, cfg, args.ray__engines)
    if hasattr(args, "ray__gateways"):
        deploy.scale_gateways(settings, cfg, secrets, args.ray__gateways)
    print(f"engines: {len(deploy.engine_names())}")
    print(f"gateways: {len(deploy.gateway_names())}")
    print(f"drained: {drained} requests finished on removed engines ({time.monotonic() - started:.1f}s)")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the deployment (the cluster itself stays, unless `ray up` started it: then stop that process)."""
    cfg = _cluster_config(args, address=getattr(args, "ray__address", None) or "auto")
    deploy.connect(cfg)
    deploy.down(cfg)
    print("down")
    return 0
