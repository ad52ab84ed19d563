"""`fairserve serve`: start the gateway and engine on embedded defaults, printing where and how to call it."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

import uvicorn
from pydantic import ValidationError

from billing import BillingStore, Database
from engine import EngineStartError
from gateway.app import create_app
from gateway.cli.workers import WORKER_FLAG, Supervisor, refusal, reuse_port_socket
from gateway.edge.auth import ensure_admin_token, ensure_demo_key, ensure_metrics_token
from gateway.edge.connections import server_config
from gateway.settings import GatewaySettings
from gateway.settings_base import settings_error_text
from gateway.settings_flags import add_knob_flags, settings_from_args
from gateway.state import start_gateway_engine

STARTUP_FAILURE = (
    3  # the exit status uvicorn gives a failed startup too, so every refusal to start reads alike
)


def register(subparsers: Any) -> None:
    """Add the `serve` subcommand: one flag per knob of the settings tree (gateway/settings_flags.py)."""
    p = subparsers.add_parser(
        "serve",
        help="run the OpenAI-compatible gateway and the engine",
        description="Every setting below can also come from its FAIRSERVE_* environment "
        "variable or the --config TOML file; `fairserve config show` prints the "
        "effective values and their sources.",
    )
    add_knob_flags(p)
    p.add_argument(WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)  # set by gateway/cli/workers.py
    p.set_defaults(func=serve)


class _Server(uvicorn.Server):
    """uvicorn with two fairserve duties: print the banner once listening, and drain on SIGTERM."""

    def __init__(self, config: uvicorn.Config, banner: dict[str, str]) -> None:
        super().__init__(config)
        self.banner = banner  # a worker's is empty: it prints only where it listens, the supervisor the rest

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started and self.servers:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            lines = [f"url: http://{host}:{port}", f"admin: http://{host}:{port}/admin"]
            lines += [f"{k}: {v}" for k, v in self.banner.items()]
            print("\n".join(lines), flush=True)

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Refuse new work with 503 before uvicorn stops listening; the lifespan drain finishes the rest.
        gateway = getattr(getattr(self.config.app, "state", None), "gateway", None)
        if gateway is not None and hasattr(gateway, "draining"):
            gateway.draining = True
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:
            # uvicorn re-raises captured signals after shutdown; a completed drain should exit 0.
            self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]


def prepare_deployment(settings: GatewaySettings) -> dict[str, str]:
    """Migrate the database and mint the demo key and the tokens, once per deployment (`serve`, `ray up`).

    Returns the banner's secrets in print order: api_key, metrics_token, admin_token (last: scripts such
    as tests/gateway/serve_process.py take it as the end of the banner).
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.database_url())
    db.upgrade()
    api_key = ensure_demo_key(BillingStore(db), settings.data_dir, settings.demo_tenant) or (
        f"none (tenant {settings.demo_tenant!r} already exists; `fairserve keys create --tenant "
        f"{settings.demo_tenant}` issues a key)"
    )
    db.dispose()
    return {
        "api_key": api_key,
        "metrics_token": ensure_metrics_token(settings.data_dir),
        "admin_token": ensure_admin_token(settings.data_dir),
    }


def serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # migration chatter drowns the banner
    try:
        settings = settings_from_args(args)
    except (ValidationError, ValueError) as exc:
        print(f"fairserve serve: invalid settings:\n{settings_error_text(exc)}", file=sys.stderr)
        return 2
    refused = refusal(settings)
    if refused is not None:
        print(f"fairserve serve: {refused}", file=sys.stderr)
        return 2
    worker = bool(getattr(args, "worker", False))
    if settings.workers > 1:
        supervisor = Supervisor(args.argv, settings.host, settings.port, settings.workers)
        banner = prepare_deployment(settings)  # once, before the workers: they must not race to migrate
        return supervisor.run(banner, startup_timeout_s=120.0, grace_s=settings.grace_period_s)
    banner = {} if worker else prepare_deployment(settings)
    try:  # before the HTTP server: an engine that is not there is one line and exit 3, not a traceback
        engine = start_gateway_engine(settings)
    except EngineStartError as exc:
        print(f"fairserve serve: {exc}", file=sys.stderr)
        return STARTUP_FAILURE
    app = create_app(settings, engine, owns_engine=True)
    config = server_config(
        app,
        settings,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=int(settings.grace_period_s) + 1,
        lifespan="on",
    )
    server = _Server(config, banner)
    sys.setswitchinterval(settings.switch_interval_ms / 1e3)  # process-wide, so set here at the entry point
    server.run(sockets=[reuse_port_socket(settings.host, settings.port)] if worker else None)
    return 0 if server.started else 3  # uvicorn returns after "Application startup failed. Exiting."
