"""Engine supervision: a dead engine worker is replaced, so a crash costs the requests in flight, not the replica.

When the worker dies, the front fails every stream in flight (503 `engine_unavailable`, rows recorded)
and its engine is marked down (gateway/engine_health.py): its model's requests are refused, and readiness
drops when no other model is served. This task then starts a new worker and marks the engine up once it
is read. The gateway runs one such task per worker process it started (`serve --model A --model B`: one
per model), each with its own back-off.

How long it waits first depends on what died. A worker that had served requests is replaced at once,
every time: it was a working engine, so a crash loop driven by requests (one tenant repeating a request
that kills the worker) must not grow a back-off that keeps every other tenant out; the replacement is
ready as fast as the machine allows (docs/engine.md, "Kill to ready"). A worker that died before it
served anything (a broken model, no memory) waits an exponential back-off that grows with each such
death in a row, and so does a failed start: those repeat whatever anyone sends. tenacity runs the start
attempts and their back-off.

Only the process engine can be replaced: a thread engine that died took its state with it, and its
gateway stays unready until restarted.
"""

from __future__ import annotations

import asyncio
import logging

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from engine import ProcessEngine
from gateway.state import GatewayState

log = logging.getLogger(__name__)
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
POLL_S = 0.05  # how often a running worker is checked; a death is noticed within this
START_BACKOFF = wait_exponential(multiplier=FIRST_BACKOFF_S, max=MAX_BACKOFF_S)


def restart_delay(served: bool, young_deaths: int) -> float:
    """Seconds to wait before replacing a dead worker: none if it had served requests, else a back-off that
    doubles with each worker in a row that died before serving anything."""
    if served:
        return 0.0
    return min(FIRST_BACKOFF_S * 2.0 ** max(young_deaths - 1, 0), MAX_BACKOFF_S)


async def keep_engine_alive(state: GatewayState, engine: ProcessEngine) -> None:
    """Run until cancelled or the gateway drains: replace `engine`'s worker whenever it is found dead."""
    young_deaths = 0
    while not state.draining:
        if engine.is_alive:
            await asyncio.sleep(POLL_S)  # a poll: cheap, and it bounds how late a death is noticed
            continue
        state.engine_health.mark_down(engine)  # its model's requests are refused until it is replaced
        served = engine.stats().iterations > 0
        young_deaths = 0 if served else young_deaths + 1
        delay = restart_delay(served, young_deaths)
        log.warning("engine worker is down; starting a new one in %.0f s", delay)
        await asyncio.sleep(delay)
        if state.draining or not await _start_worker(state, engine):
            return
        if not engine.is_alive:  # nothing was replaced (its death not yet handled): look again later
            continue
        state.engine_health.mark_up(engine)
        state.metrics.engine_restarts.labels("ok").inc()
        took = engine.last_start
        log.warning(
            "engine worker replaced (start %.2f s: spawn and imports %.2f s, engine build %.2f s); "
            "admitting again",
            took.get("total_s", 0.0),
            took.get("spawn_and_imports_s", 0.0),
            took.get("build_s", 0.0),
        )


async def _start_worker(state: GatewayState, engine: ProcessEngine) -> bool:
    """Start a new worker, retrying failed starts with a growing back-off; False if the gateway drained first."""
    loop = asyncio.get_running_loop()

    def failed(retry: RetryCallState) -> None:
        log.error(
            "could not start a new engine worker (attempt %d): %s",
            retry.attempt_number,
            retry.outcome.exception() if retry.outcome else None,
        )
        state.metrics.engine_restarts.labels("failed").inc()

    def draining(retry: RetryCallState) -> bool:
        return state.draining

    try:
        async for attempt in AsyncRetrying(
            wait=START_BACKOFF,
            retry=retry_if_exception_type(Exception),
            stop=draining,
            before_sleep=failed,
            reraise=True,
        ):
            with attempt:
                await asyncio.to_thread(engine.restart, loop)
    except Exception:
        log.exception("gave up starting a new engine worker: the gateway is draining")
        return False
    return not state.draining
