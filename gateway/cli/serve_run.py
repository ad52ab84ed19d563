"""What `fairserve serve` runs once its flags are parsed: the uvicorn server that prints the banner and
drains on SIGTERM, and the once-per-deployment preparation (migrations, demo key, tokens). Apart from
gateway/cli/serve.py so that parsing `serve`'s flags (and `--help`) imports no web server or engine."""

from __future__ import annotations

import logging
import signal
from typing import Any

import uvicorn

from billing import BillingStore, Database
from gateway.edge.auth import (
    ADMIN_TOKEN_FILE,
    API_KEY_FILE,
    METRICS_TOKEN_FILE,
    ensure_admin_token,
    ensure_demo_key,
    ensure_metrics_token,
)
from gateway.ops.summary import log_summary
from gateway.settings import GatewaySettings
from gateway.state import GatewayState

log = logging.getLogger("fairserve.gateway")


class Server(uvicorn.Server):
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
            gateway = getattr(getattr(self.config.app, "state", None), "gateway", None)
            if isinstance(gateway, GatewayState):
                await log_summary(gateway)

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Refuse new work with 503 before uvicorn stops listening; the lifespan drain finishes the rest.
        gateway = getattr(getattr(self.config.app, "state", None), "gateway", None)
        if gateway is not None and hasattr(gateway, "draining"):
            if not gateway.draining:
                log.info("%s: refusing new requests and draining", signal.Signals(sig).name)
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


def shown_banner(secrets: dict[str, str], settings: GatewaySettings, tty: bool) -> dict[str, str]:
    """The banner's credentials as printed: the secrets themselves on a terminal (`make serve`), else the
    files that hold them (`api_key_file: ...`), so that a journal or a log collector reading stdout never
    stores a key. A demo key that was not minted here (the tenant exists) has no file: its line says so."""
    if tty:
        return secrets
    files = {"api_key": API_KEY_FILE, "metrics_token": METRICS_TOKEN_FILE, "admin_token": ADMIN_TOKEN_FILE}
    shown: dict[str, str] = {}
    for name, secret in secrets.items():
        path = settings.data_dir / files[name]
        if secret.startswith("none (") or not path.is_file():
            shown[name] = secret if secret.startswith("none (") else "(not printed: stdout is not a terminal)"
        else:
            shown[f"{name}_file"] = str(path.resolve())
    return shown
