"""`fairserve serve`: start the gateway and engine on embedded defaults, printing where and how to call it."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import uvicorn
from pydantic import ValidationError

from billing import BillingStore, Database, default_db_url
from engine import EngineConfig
from gateway.app import create_app
from gateway.auth import ensure_admin_token, ensure_demo_key, ensure_metrics_token
from gateway.settings import GatewaySettings


def register(subparsers: Any) -> None:
    """Add the `serve` subcommand."""
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible gateway and the engine")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--data-dir", default="./fairserve-data", help="database, secrets and ledger spill")
    p.add_argument("--db", default=None, help="SQLAlchemy URL (default: SQLite in the data dir)")
    p.add_argument("--redis", default=None, help="redis:// URL for shared idempotency and quotas")
    p.add_argument("--redis-timeout", type=float, default=0.25,
                   help="seconds each Redis call may take before the circuit breaker opens")
    p.add_argument("--quota-on-redis-failure", choices=["open", "closed"], default="open",
                   help="while Redis is unavailable: admit without quotas (open) or answer 503 (closed)")
    p.add_argument("--model", default=None, help="Hugging Face model directory (default: embedded model)")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--policy", choices=["fcfs", "vtc"], default=None, help="fairness policy")
    p.add_argument("--grace-period", type=float, default=10.0, help="seconds to finish work on SIGTERM")
    p.add_argument("--max-queued-requests", type=int, default=256, help="global admission queue bound")
    p.add_argument("--max-queued-tokens", type=int, default=131072, help="global bound on queued prompt tokens")
    p.add_argument("--idempotency-ttl", type=float, default=86400.0, help="seconds records are kept")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address of the --metrics-port listener (it needs no credential: keep it private)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="also serve /metrics here without a credential (the main port's /metrics needs the "
                        "metrics or admin token)")
    p.add_argument("--auth-failure-burst", type=int, default=20,
                   help="failed authentications a client address may make at once before 429")
    p.add_argument("--auth-failure-rate", type=float, default=2.0,
                   help="failed authentications per second a client address may sustain")
    p.add_argument("--idempotent-orphan-grace", type=float, default=10.0,
                   help="seconds a run sent with an Idempotency-Key outlives its last reader, for a retry to attach")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None,
                   help="run the engine loop in its own process instead of a thread of the gateway")
    p.set_defaults(func=serve)


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """Validated settings from the parsed flags."""
    engine = EngineConfig(model=args.model, cache_dir=str(Path(args.data_dir) / "models"))
    if args.max_num_seqs is not None:
        engine.max_num_seqs = args.max_num_seqs
    if args.num_kv_blocks is not None:
        engine.num_kv_blocks = args.num_kv_blocks
    if args.policy is not None:
        engine.fairness.policy = args.policy
    extra = {} if args.engine_process is None else {"engine_process": args.engine_process}
    return GatewaySettings(
        host=args.host, port=args.port, data_dir=Path(args.data_dir), db_url=args.db, redis_url=args.redis,
        model=args.model, grace_period_s=args.grace_period, max_queued_requests=args.max_queued_requests,
        max_queued_tokens=args.max_queued_tokens, idempotency_ttl_s=args.idempotency_ttl, engine=engine,
        metrics_host=args.metrics_host, metrics_port=args.metrics_port, auth_failure_burst=args.auth_failure_burst,
        auth_failure_rate_per_s=args.auth_failure_rate,
        redis_timeout_s=args.redis_timeout, quota_on_redis_failure=args.quota_on_redis_failure,
        idempotent_orphan_grace_s=args.idempotent_orphan_grace, **extra,
    )


class _Server(uvicorn.Server):
    """uvicorn with two fairserve duties: print the banner once listening, and drain on SIGTERM."""

    def __init__(self, config: uvicorn.Config, banner: dict[str, str]) -> None:
        super().__init__(config)
        self.banner = banner

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


def serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # migration chatter drowns the banner
    try:
        settings = settings_from_args(args)
    except (ValidationError, ValueError) as exc:
        print(f"fairserve serve: invalid settings: {exc}", file=sys.stderr)
        return 2
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_url or default_db_url(settings.data_dir))
    db.upgrade()
    api_key = ensure_demo_key(BillingStore(db), settings.data_dir, settings.demo_tenant)
    db.dispose()
    admin_token = ensure_admin_token(settings.data_dir)
    metrics_token = ensure_metrics_token(settings.data_dir)
    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                            timeout_graceful_shutdown=int(settings.grace_period_s) + 1, lifespan="on")
    # admin_token stays last: scripts (tests/gateway/serve_process.py) take it as the end of the banner.
    server = _Server(config, {"api_key": api_key, "metrics_token": metrics_token, "admin_token": admin_token})
    sys.setswitchinterval(settings.switch_interval_ms / 1e3)  # process-wide, so set here at the entry point
    server.run()
    return 0
