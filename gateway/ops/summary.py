"""The start-up summary: what this gateway serves with, in one log record once it listens.

Model, device, dtype, KV blocks and the tokens they hold, seats, fairness policy, database, Redis, engines
and whether the ledger is healthy: what an operator checks first after a restart, in one place instead of
scattered over flags and endpoints. Credentials in the database and Redis URLs are masked.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url

from gateway.ops.logs import log_fields
from gateway.state import GatewayState
from routing import served_models

log = logging.getLogger("fairserve.gateway")


def masked_url(url: str) -> str:
    """`url` with any password replaced by ***."""
    if "://" not in url:
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an SQLAlchemy URL (redis://): mask the userinfo's password by hand
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))


def summary(state: GatewayState, ledger_ok: bool) -> dict[str, Any]:
    """The fields of the start-up record."""
    settings = state.settings
    stats = state.engine.stats()
    block = settings.engine.block_size
    remote = bool(settings.engines)
    if remote:
        engines = ", ".join(settings.engines)
    else:
        engines = "embedded, own process" if settings.engine_process else "embedded, in this process"
    quarantined = state.ledger.quarantine.count
    return {
        "model": ", ".join(c.model_name for c in served_models(state.engine)),
        "device": "remote" if remote else settings.engine.device,
        "dtype": "remote" if remote else settings.engine.dtype,
        "kv_blocks": stats.kv_blocks_total,
        "kv_tokens": stats.kv_blocks_total * block,
        "seats": stats.max_num_seqs,
        "policy": settings.engine.fairness.policy,
        "database": masked_url(settings.database_url()),
        "redis": masked_url(settings.redis_url) if settings.redis_url else "none (this process only)",
        "engines": engines,
        "ledger": _ledger_health(ledger_ok, quarantined),
    }


def _ledger_health(database_ok: bool, quarantined: int) -> str:
    if not database_ok:
        return "database unreachable (rows are journalled until it answers)"
    return f"degraded ({quarantined} rows quarantined)" if quarantined else "ok"


async def log_summary(state: GatewayState) -> None:
    """Log the summary at INFO (the database ping runs on a thread)."""
    _ready, checks = await asyncio.to_thread(state.ready)
    log_fields(log, logging.INFO, "serving", summary(state, checks["database"]))
