"""`fairserve serve`: start the gateway and engine on embedded defaults, printing where and how to call it.

The web server, the engine and the database are imported when `serve` runs, not when its parser is built:
`fairserve tenants list` and `serve --help` must not pay for them (gateway/cli/__init__.py)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from pydantic import ValidationError

from gateway.cli.workers import WORKER_FLAG
from gateway.settings_base import settings_error_text
from gateway.settings_flags import add_knob_flags, settings_from_args

log = logging.getLogger("fairserve.gateway")
STARTUP_FAILURE = (
    3  # the exit status uvicorn gives a failed startup too, so every refusal to start reads alike
)


def register(subparsers: Any) -> None:
    """Add the `serve` subcommand: one flag per knob of the settings tree (gateway/settings_flags.py)."""
    p = subparsers.add_parser(
        "serve",
        usage="%(prog)s [--model DIR] [--host HOST] [--port PORT] [--device DEVICE] [OPTION ...]",
        help="run the OpenAI-compatible gateway and the engine",
        description="Every setting below can also come from its FAIRSERVE_* environment "
        "variable or the --config TOML file; `fairserve config show` prints the "
        "effective values and their sources.",
    )
    add_knob_flags(p)
    p.add_argument(WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)  # set by gateway/cli/workers.py
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM."""
    from engine import EngineStartError
    from gateway.app import create_app
    from gateway.cli.serve_run import Server, prepare_deployment, shown_banner
    from gateway.cli.workers import Supervisor, refusal, reuse_port_socket
    from gateway.edge.connections import server_config
    from gateway.ops.logs import configure
    from gateway.state import start_gateway_engine

    configure("info", "text")  # until the settings say otherwise
    try:
        settings = settings_from_args(args)
    except (ValidationError, ValueError) as exc:
        print(f"fairserve serve: invalid settings:\n{settings_error_text(exc)}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format)
    refused = refusal(settings)
    if refused is not None:
        print(f"fairserve serve: {refused}", file=sys.stderr)
        return 2
    worker = bool(getattr(args, "worker", False))
    if settings.workers > 1:
        supervisor = Supervisor(args.argv, settings.host, settings.port, settings.workers)
        banner = prepare_deployment(settings)  # once, before the workers: they must not race to migrate
        shown = shown_banner(banner, settings, settings.print_secrets or sys.stdout.isatty())
        return supervisor.run(shown, startup_timeout_s=120.0, grace_s=settings.grace_period_s)
    banner = (
        {}
        if worker
        else shown_banner(
            prepare_deployment(settings), settings, settings.print_secrets or sys.stdout.isatty()
        )
    )
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
        log_config=None,  # uvicorn's records go through the root handler: one format (--log-format) for all
        timeout_graceful_shutdown=int(settings.grace_period_s) + 1,
        lifespan="on",
    )
    server = Server(config, banner)
    sys.setswitchinterval(settings.switch_interval_ms / 1e3)  # process-wide, so set here at the entry point
    server.run(sockets=[reuse_port_socket(settings.host, settings.port)] if worker else None)
    if not server.started:
        return 3  # uvicorn returns after "Application startup failed. Exiting."
    log.info("stopped")
    return 0
