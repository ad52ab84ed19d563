"""`fairserve engine`: one engine served over TCP, for gateways started with `fairserve serve --engine`.

It prints `engine: tcp://HOST:PORT` and `engine_id: ...` once gateways can connect (scripts read these,
as they read `serve`'s banner). SIGTERM or Ctrl-C drains: new requests are refused (the gateway answers
them with a retryable 503), live ones get `--grace-period` to finish, then the engine stops; a second
signal stops at once.

With `--cluster-key FILE` (created 0600 when missing) the port speaks CurveZMQ and admits only gateways
started with the same file (engine/serving/remote/curve.py). Without it, anyone who reaches the port can submit work
as any tenant: so it is refused on a non-loopback address unless `--insecure-no-cluster-key` is given, and
warned about on loopback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

import zmq
from pydantic import ValidationError

from engine.serving.remote.curve import ClusterKey, ClusterKeyError, create_key_file

if TYPE_CHECKING:
    from engine.serving.remote.server import EngineServer
from gateway.engine_server_settings import EngineServerSettings
from gateway.ops.logs import configure
from gateway.settings_base import settings_error_text
from gateway.settings_flags import add_knob_flags, load_from_args

log = logging.getLogger(__name__)

# An engine's Redis (the shared fair-share counters) is `--redis` here, as the gateway's is in `serve`.
# Its model is `--model`, which in `serve` repeats (one local engine per model).
_ALIASES = {"redis_url": "--redis", "model": "--model"}


def _server(settings: EngineServerSettings, key: ClusterKey | None) -> EngineServer:
    """The engine server of this role: today's for `both`, a RoleServer for prefill or decode."""
    from engine.serving.remote.roles import RoleServer  # the engine and torch: only when one is run
    from engine.serving.remote.server import EngineServer

    produced = settings.data_dir / "produced.log"  # the engine's own billing record (accounting.py)
    if settings.role == "both":
        return EngineServer(
            settings.engine,
            settings.listen,
            settings.gateway_timeout_s,
            settings.grace_period_s,
            cluster_key=key,
            produced_path=produced,
        )
    return RoleServer(
        settings.engine,
        settings.listen,
        settings.gateway_timeout_s,
        settings.grace_period_s,
        settings.role,
        settings.kv_hold_timeout_s,
        settings.kv_pull_timeout_s,
        cluster_key=key,
        produced_path=produced,
    )


def register(subparsers: Any) -> None:
    """Add the `engine` subcommand: one flag per EngineConfig knob, plus where to listen."""
    p = subparsers.add_parser(
        "engine",
        usage="%(prog)s [--model DIR] [--listen tcp://HOST:PORT] [--device DEVICE] [OPTION ...]",
        help="run one engine server that gateways attach to (serve --engine)",
        description="Every setting below can also come from its FAIRSERVE_* environment "
        "variable or the --config TOML file ([engine] table), as for `serve`.",
    )
    add_knob_flags(p, EngineServerSettings, _ALIASES)
    p.set_defaults(func=run_engine)


def run_engine(args: argparse.Namespace) -> int:
    """Build the engine, bind, print the banner, and serve until a signal."""
    configure("info", "text")  # until the settings say otherwise
    try:
        settings = load_from_args(args, EngineServerSettings)
    except (ValidationError, ValueError) as exc:
        print(f"fairserve engine: invalid settings:\n{settings_error_text(exc)}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.cluster_key_file is None:
        log.warning(
            "no --cluster-key: any process that reaches %s can submit work as any tenant%s",
            settings.listen,
            " (--insecure-no-cluster-key)" if settings.insecure_no_cluster_key else " on this host",
        )
    key = None
    if settings.cluster_key_file is not None:
        if create_key_file(settings.cluster_key_file):
            print(
                f"cluster_key: created {settings.cluster_key_file} (give it to every gateway: "
                "serve --cluster-key)",
                flush=True,
            )
        try:
            key = ClusterKey.load(settings.cluster_key_file)
        except ClusterKeyError as exc:
            print(f"fairserve engine: invalid settings:\ncluster_key_file: {exc}", file=sys.stderr)
            return 2
    server = _server(settings, key)
    try:
        server.start()
    except zmq.ZMQError as exc:  # the address is taken, or not this host's
        print(f"fairserve engine: cannot listen on {settings.listen}: {exc}", file=sys.stderr)
        return 1
    print(f"engine: {server.address}\nengine_id: {server.engine_id}", flush=True)
    sys.setswitchinterval(settings.switch_interval_ms / 1e3)  # process-wide, so set here at the entry point
    server.run()
    return 0
