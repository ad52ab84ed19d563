"""The `fairserve ray` commands (parsed in cluster/cli.py): up, status, scale, down."""

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

from cluster import deploy
from cluster.config import ClusterConfig
from cluster.fit import DoesNotFit
from engine.serving.remote.curve import ClusterKey, create_key_file
from gateway.cli.serve_run import prepare_deployment
from gateway.edge.auth import ADMIN_TOKEN_FILE, METRICS_TOKEN_FILE
from gateway.settings import GatewaySettings
from gateway.settings_base import settings_error_text
from gateway.settings_flags import flags_from_args

CLUSTER_KEY_FILE = "cluster_key"  # in the data dir of the driver and of every gateway replica


def _cluster_config(args: argparse.Namespace, **overrides: Any) -> ClusterConfig:
    given = {k.removeprefix("ray__"): v for k, v in vars(args).items() if k.startswith("ray__")}
    return ClusterConfig(**{**given, **overrides})


def _gateway_settings(args: argparse.Namespace) -> GatewaySettings:
    flags = flags_from_args(args)
    if flags.pop("engines", None):
        raise ValueError(
            "--engine attaches `serve` to running engines; under `ray up` the engines are "
            "actors: give their count with --engines N"
        )
    return GatewaySettings.load(flags, args.config)


def _secrets(settings: GatewaySettings) -> tuple[dict[str, str], dict[str, str]]:
    """Migrate the database, mint the demo key and tokens here, once; (secrets for replicas, banner).

    The secrets include the cluster key (engine/serving/remote/curve.py): `--cluster-key FILE`, or one created in
    the data dir. Engines bind their node's address, so on a cluster their ports are reachable from the
    network; a deployment's engines admit only its own gateways, always.
    """
    banner = prepare_deployment(settings)
    key_file = settings.cluster_key_file or settings.data_dir / CLUSTER_KEY_FILE
    create_key_file(key_file)
    secrets = {
        ADMIN_TOKEN_FILE: banner["admin_token"],
        METRICS_TOKEN_FILE: banner["metrics_token"],
        CLUSTER_KEY_FILE: key_file.read_text(encoding="ascii").strip(),
    }
    return secrets, banner


def _cluster_key(secrets: dict[str, str]) -> ClusterKey:
    return ClusterKey.from_secret(secrets[CLUSTER_KEY_FILE])


def _wait_answering(url: str, timeout_s: float) -> None:
    """Until the gateway's /healthz answers 200 (bounded)."""

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    deploy.wait_until(answers, timeout_s, f"the gateway at {url} to answer")


def cmd_up(args: argparse.Namespace) -> int:
    """Start the deployment, print the banner once the first gateway answers and every engine asked for has
    registered; stay up if the cluster is ours."""
    try:
        settings = _gateway_settings(args)
        cfg = _cluster_config(args)
    except (ValidationError, ValueError) as exc:
        print(f"fairserve ray up: invalid settings:\n{settings_error_text(exc)}", file=sys.stderr)
        return 2
    try:  # a local cluster's CPUs are known before it starts (seconds): a request too big fails first
        if not cfg.address:
            deploy.fit(settings, cfg, cfg.engines, cfg.gateways, deploy.local_capacity(cfg))
    except DoesNotFit as exc:
        print(f"fairserve ray up: {exc}", file=sys.stderr)
        return 1
    started = deploy.connect(cfg)
    if started and cfg.engine_host is None:
        cfg = cfg.model_copy(update={"engine_host": "127.0.0.1"})  # one machine: engines stay on loopback
    if deploy.engine_names() or deploy.gateway_names():
        print(
            f"fairserve ray up: namespace {cfg.namespace!r} already has a deployment; "
            "`fairserve ray down` it first or pick another --namespace",
            file=sys.stderr,
        )
        return 1
    try:  # before anything is created: what cannot be placed is said now, not waited on for ever
        cfg = deploy.fit(settings, cfg, cfg.engines, cfg.gateways)
    except DoesNotFit as exc:
        print(f"fairserve ray up: {exc}", file=sys.stderr)
        if started:
            ray.shutdown()
        return 1
    secrets, banner = _secrets(settings)
    # Each gateway replica finds the key where install_secrets (cluster/gateway_actor.py) writes it.
    settings = settings.model_copy(update={"cluster_key_file": settings.data_dir / CLUSTER_KEY_FILE})
    reg = deploy.registry(cfg)
    ray.get(reg.keep_deployment.remote(settings, secrets, cfg))
    deploy.start_engines(settings, cfg, cfg.engines, _cluster_key(secrets))
    gateways = deploy.start_gateways(settings, cfg, secrets, cfg.gateways)
    url = deploy.first_url(gateways[0], cfg.ready_timeout_s, _say)
    _wait_answering(url, cfg.ready_timeout_s)

    # The banner says the deployment asked for is up: `--engines 2` is two engines taking work, not one
    # answering while the other still loads its model.
    def all_registered() -> bool:
        return len(ray.get(reg.engines.remote())) >= cfg.engines

    deploy.wait_until(all_registered, cfg.ready_timeout_s, f"{cfg.engines} engines to register", every_s=0.5)
    lines = [f"url: {url}", f"admin: {url}/admin", *(f"{k}: {v}" for k, v in banner.items())]
    if started:  # `ray status/scale/down --address` (and drivers of your own) reach this cluster here
        lines.insert(0, f"ray: {ray.get_runtime_context().gcs_address}")
    print("\n".join(lines), flush=True)
    if started:
        _serve_until_signal(cfg)
    return 0


def _say(line: str) -> None:
    print(f"fairserve ray up: {line}", file=sys.stderr, flush=True)


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
        print(
            f"  {e['name']}  {e['health']}  {e['address']}  node={e['node']}  "
            f"running={e['running']} waiting={e['waiting']} in_flight={e['in_flight']}  "
            f"alive_at_gateways={e['alive_at_gateways']}/{len(found.gateways)}"
        )
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
        print(
            "fairserve ray scale: no deployment in this namespace (run `fairserve ray up`)", file=sys.stderr
        )
        return 1
    settings, secrets, kept_cfg = kept
    cfg = kept_cfg.model_copy(update={"drain_timeout_s": cfg.drain_timeout_s})
    more_engines = max(0, getattr(args, "ray__engines", 0) - len(deploy.engine_names()))
    more_gateways = max(0, getattr(args, "ray__gateways", 0) - len(deploy.gateway_names()))
    try:
        deploy.fit(settings, cfg, more_engines, more_gateways)  # the kept reservations, checked
    except DoesNotFit as exc:
        print(f"fairserve ray scale: {exc}", file=sys.stderr)
        return 1
    started = time.monotonic()
    drained = 0
    if hasattr(args, "ray__engines"):
        drained = deploy.scale_engines(settings, cfg, args.ray__engines, _cluster_key(secrets))
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
