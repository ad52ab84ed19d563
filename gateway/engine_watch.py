"""Engine supervision: a dead engine worker is replaced, so a crash costs the requests in flight, not the replica.

When the worker dies, the front fails every stream in flight (503 `engine_unavailable`, rows recorded)
and readiness drops. This task then starts a new worker after a back-off, which doubles while workers
keep dying young, and readiness returns once it is up. Only the process engine can be replaced: a
thread engine that died took its state with it, and its gateway stays unready until restarted.
"""

from __future__ import annotations

import asyncio
import logging
import time

from engine import ProcessEngine
from gateway.state import GatewayState

log = logging.getLogger(__name__)
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
LIVED_LONG_S = 60.0  # a worker that ran this long before dying resets the back-off
POLL_S = 0.25


async def keep_engine_alive(state: GatewayState, engine: ProcessEngine) -> None:
    """Run until cancelled or the gateway drains: replace the engine worker whenever it is found dead."""
    loop = asyncio.get_running_loop()
    backoff = FIRST_BACKOFF_S
    started = time.monotonic()
    while not state.draining:
        if engine.is_alive:
            await asyncio.sleep(POLL_S)  # a poll: death is rare, and a restart waits a back-off anyway
            continue
        backoff = FIRST_BACKOFF_S if time.monotonic() - started >= LIVED_LONG_S else backoff
        log.warning("engine worker is down; starting a new one in %.0f s", backoff)
        await asyncio.sleep(backoff)
        if state.draining:
            return
        try:
            await asyncio.to_thread(engine.restart, loop)
        except Exception:
            log.exception("could not start a new engine worker")
            state.metrics.engine_restarts.labels("failed").inc()
            started = time.monotonic()  # a failed start is a worker that died young: the back-off keeps growing
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            continue
        if not engine.is_alive:  # nothing was replaced (its death not yet handled): look again later
            continue
        started = time.monotonic()
        state.engine_failed = False
        state.metrics.engine_restarts.labels("ok").inc()
        log.warning("engine worker replaced; admitting again")
        backoff = min(backoff * 2, MAX_BACKOFF_S)  # the next wait, unless this worker lives LIVED_LONG_S
