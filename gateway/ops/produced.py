"""The gateway's side of the engines' produced-token records (engine/remote/accounting.py).

Two duties, on one task of the event loop, for attached engines (`--engine`): confirm to the engines
the requests whose rows this gateway's ledger has (batched, every CONFIRM_S), and bill the records of
requests whose gateway died (status `interrupted`), then confirm those too. A record is taken only once
it is ORPHAN_AFTER_S old, so the dead gateway's own journal (replayed at its restart, or by a gateway
sharing its data dir within `orphan_scan_s`) gets the first chance; both key the row on
(tenant_id, request_id), so whichever comes second is a duplicate the ledger skips, never a second charge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime

from billing import UsageRecord
from engine import EngineClient
from engine.remote.accounting import ProducedRecord
from engine.remote.client import RemoteEngine
from engine.remote.messages import Produced
from gateway.state import GatewayState
from routing import EngineRouter

log = logging.getLogger(__name__)
CONFIRM_S = 0.2
RECONCILE_S = 2.0
ORPHAN_AFTER_S = 10.0
ASK_TIMEOUT_S = 5.0


def remote_engines(engine: EngineClient) -> list[RemoteEngine]:
    """The attached engines behind a gateway's engine client (none for an engine it runs itself)."""
    if isinstance(engine, RemoteEngine):
        return [engine]
    if isinstance(engine, EngineRouter):
        return [c for c in engine.clients() if isinstance(c, RemoteEngine)]
    return []


def interrupted_row(record: ProducedRecord, model: str) -> UsageRecord:
    """The ledger row of a request whose gateway died: the engine's counts, status `interrupted`."""
    return UsageRecord(
        request_id=record.ledger_request_id or record.engine_request_id,
        tenant_id=record.tenant_id,
        api_key_id=record.api_key_id,
        task_id=record.task_id,
        workflow_run_id=record.workflow_run_id,
        attempt=record.attempt,
        model=model,
        status="interrupted",
        finish_reason=record.finish_reason,
        cancel_state=record.cancel_state,
        prompt_tokens=record.prompt_tokens,
        cached_tokens=record.cached_tokens,
        completion_tokens=record.completion_tokens,
        charged_service=record.charged_service,
        tokens_after_cancel=record.tokens_after_cancel,
        preemptions=record.preemptions,
        recomputed_tokens=record.recomputed_tokens,
        queue_ms=None,
        ttft_ms=None,
        e2e_ms=None,
        created_at=datetime.fromtimestamp(record.arrival_time, UTC),
        finished_at=datetime.fromtimestamp(record.finished_time, UTC),
        delivered_tokens=None,  # the dead gateway alone knew
    )


async def ask(engine: RemoteEngine, since: float, orphans_after_s: float = -1.0) -> Produced:
    """One engine's AskProduced answer, bounded by ASK_TIMEOUT_S."""
    future = engine.ask_produced(since, orphans_after_s)
    return await asyncio.wait_for(asyncio.wrap_future(future), ASK_TIMEOUT_S)


async def bill_orphans(state: GatewayState) -> int:
    """Bill every engine's records of dead gateways' requests as `interrupted`; returns how many."""
    billed = 0
    for engine in remote_engines(state.engine):
        if not engine.is_alive:
            continue
        try:
            answer = await ask(engine, time.time(), ORPHAN_AFTER_S)
        except (TimeoutError, Exception):  # an engine away now is asked again next round
            log.debug("no produced-token answer from %s", engine.address, exc_info=True)
            continue
        for record in answer.orphans:
            state.ledger.record(interrupted_row(record, state.engine.model_name))  # journaled first
        if answer.orphans:
            engine.billed([r.engine_request_id for r in answer.orphans])
            billed += len(answer.orphans)
            log.warning("billed %d requests of a dead gateway as interrupted", len(answer.orphans))
    return billed


def confirm(state: GatewayState) -> None:
    """Tell every attached engine which requests' rows this gateway has journaled since the last call."""
    ids, state.billed_ids = state.billed_ids, []
    if ids:
        for engine in remote_engines(state.engine):
            engine.billed(ids)  # an engine ignores ids it does not hold


async def keep_engines_billed(state: GatewayState) -> None:
    """Confirm billed rows every CONFIRM_S and bill dead gateways' requests every RECONCILE_S."""
    last_reconcile = 0.0
    while True:
        await asyncio.sleep(CONFIRM_S)
        with contextlib.suppress(Exception):
            confirm(state)
        if time.monotonic() - last_reconcile >= RECONCILE_S:
            last_reconcile = time.monotonic()
            try:
                await bill_orphans(state)
            except Exception:
                log.warning("billing dead gateways' requests failed; retrying", exc_info=True)
