"""The gateway's side of the engines' produced-token records (engine/serving/remote/accounting.py).

Two duties for attached engines (`--engine`): confirm to the engines the requests whose rows this
gateway's ledger has journaled (as each row is journaled, before its reply ends), and, on a task, bill the records of
requests whose gateway died (status `interrupted`), then confirm those too. A record is taken only once
it is ORPHAN_AFTER_S old, so the dead gateway's own journal (replayed at its restart, or by a gateway
sharing its data dir within `orphan_scan_s`) gets the first chance; both key the row on
(tenant_id, request_id), so whichever comes second is a duplicate the ledger skips, never a second charge.

Only a gateway's work is billed: each record names the peer that submitted it, and a record is billed only
when that peer is a gateway of this deployment (registered in the shared database, billing/gateways.py).
On an engine without a cluster key a raw ZeroMQ peer can submit work as any tenant; its records are
logged, counted (`fairserve_orphan_records_total{outcome="foreign"}`) and confirmed, never billed. An
interrupted row is priced as a completed one: the engine's charge times its model's `--model-cost`,
under the model that engine serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from billing import Database, UsageRecord
from billing.gateways import register_gateways, registered_gateways
from billing.reconcile import COUNTS, Totals, differences, hour_start, ledger_totals
from engine import EngineClient
from engine.serving.remote.accounting import ProducedRecord
from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.messages import Produced
from gateway.state import GatewayState
from routing import EngineRouter, ModelRouter

log = logging.getLogger(__name__)
RECONCILE_S = 2.0
ORPHAN_AFTER_S = 10.0
ASK_TIMEOUT_S = 5.0


def remote_engines(engine: EngineClient) -> list[RemoteEngine]:
    """The attached engines behind a gateway's engine client (none for an engine it runs itself)."""
    if isinstance(engine, RemoteEngine):
        return [engine]
    if isinstance(engine, EngineRouter | ModelRouter):
        return [c for c in engine.clients() if isinstance(c, RemoteEngine)]
    return []


def interrupted_row(record: ProducedRecord, model: str, cost_factor: float = 1.0) -> UsageRecord:
    """The ledger row of a request whose gateway died: the engine's counts, status `interrupted`, served by
    `model` (the engine's) and charged at its `--model-cost` factor, as a completed row would be."""
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
        charged_service=record.charged_service * cost_factor,
        tokens_after_cancel=record.tokens_after_cancel,
        preemptions=record.preemptions,
        recomputed_tokens=record.recomputed_tokens,
        queue_ms=None,
        ttft_ms=None,
        e2e_ms=None,
        created_at=datetime.fromtimestamp(record.arrival_time, UTC),
        finished_at=datetime.fromtimestamp(record.finished_time, UTC),
        delivered_tokens=None,  # the dead gateway alone knew
        served_model=model,
    )


async def ask(engine: RemoteEngine, since: float, orphans_after_s: float = -1.0) -> Produced:
    """One engine's AskProduced answer, bounded by ASK_TIMEOUT_S."""
    future = engine.ask_produced(since, orphans_after_s)
    return await asyncio.wait_for(asyncio.wrap_future(future), ASK_TIMEOUT_S)


async def register(state: GatewayState) -> bool:
    """Register this gateway's identities (one per attached engine) as the deployment's; False on failure
    (the billing loop tries again)."""
    ids = {engine.gateway_id for engine in remote_engines(state.engine)}
    try:
        await asyncio.to_thread(register_gateways, state.db, ids)
    except Exception:
        log.warning("could not register this gateway in the ledger database; retrying", exc_info=True)
        return False
    state.deployment_gateways |= ids
    return True


async def _ours(state: GatewayState, records: list[ProducedRecord]) -> set[str]:
    """The submitters among `records` that are gateways of this deployment (known ones from memory)."""
    unknown = {r.submitter for r in records} - state.deployment_gateways
    if unknown:
        state.deployment_gateways |= await asyncio.to_thread(registered_gateways, state.db, unknown)
    return {r.submitter for r in records} & state.deployment_gateways


def _refuse_foreign(state: GatewayState, engine: RemoteEngine, foreign: list[ProducedRecord]) -> None:
    """Log, count and confirm records a peer outside the deployment submitted: never billed."""
    state.metrics.orphan_records.labels("foreign").inc(len(foreign))
    for record in foreign:
        log.warning(
            "engine %s ran request %s for tenant %s (%d prompt + %d completion tokens) submitted by %r, "
            "which is no gateway of this deployment: not billed (give the engine a --cluster-key)",
            engine.address,
            record.engine_request_id,
            record.tenant_id,
            record.prompt_tokens,
            record.completion_tokens,
            record.submitter,
        )
    engine.billed([r.engine_request_id for r in foreign])  # no counts: no supplement is kept


async def bill_orphans(state: GatewayState) -> int:
    """Bill every engine's records of dead gateways' requests as `interrupted`; returns how many."""
    billed = 0
    for engine in remote_engines(state.engine):
        if not engine.is_alive:
            continue
        try:
            answer = await ask(engine, time.time(), ORPHAN_AFTER_S)
        except Exception:  # an engine away now (or too slow to answer) is asked again next round
            log.debug("no produced-token answer from %s", engine.address, exc_info=True)
            continue
        if not answer.orphans:
            continue
        ours = await _ours(state, answer.orphans)
        mine = [r for r in answer.orphans if r.submitter in ours]
        foreign = [r for r in answer.orphans if r.submitter not in ours]
        if foreign:
            _refuse_foreign(state, engine, foreign)
        model = engine.model_name
        factor = state.settings.models.cost_factor(model)
        for record in mine:
            state.ledger.record(interrupted_row(record, model, factor))  # journaled first
        if mine:
            engine.billed([r.engine_request_id for r in mine])
            state.metrics.orphan_records.labels("billed").inc(len(mine))
            billed += len(mine)
            log.warning("billed %d requests of a dead gateway as interrupted", len(mine))
    return billed


def confirm(state: GatewayState) -> None:
    """Tell every attached engine which requests' rows this gateway has journaled since the last call."""
    billed, state.billed_ids = state.billed_ids, []
    if billed:
        ids, counts = [b[0] for b in billed], [b[1] for b in billed]
        for engine in remote_engines(state.engine):
            engine.billed(ids, counts)  # an engine ignores ids it does not hold; a dead one lost them anyway


async def keep_engines_billed(state: GatewayState) -> None:
    """Bill dead gateways' requests every RECONCILE_S, for as long as the gateway serves (registering
    this gateway first, until that succeeds)."""
    registered = await register(state)
    while True:
        await asyncio.sleep(RECONCILE_S)
        if not registered:
            registered = await register(state)
        try:
            await bill_orphans(state)
        except Exception:
            log.warning("billing dead gateways' requests failed; retrying", exc_info=True)


def engine_totals(answers: list[Produced]) -> Totals:
    """The engines' answers summed per tenant, in the ledger's terms (billing/reconcile.py)."""
    totals: Totals = {}
    for answer in answers:
        for t in answer.tenants:
            acc = totals.setdefault(t.tenant_id, dict.fromkeys(COUNTS, 0))
            acc["requests"] += t.requests
            acc["prompt_tokens"] += t.prompt_tokens
            acc["cached_tokens"] += t.cached_tokens
            acc["completion_tokens"] += t.completion_tokens
    return totals


def reconcile_report(db: Database, since: datetime, answers: list[Produced]) -> dict[str, Any]:
    """The ledger against the engines that answered: both sides' totals and every difference."""
    ledger = ledger_totals(db, since)
    engines = engine_totals(answers)
    found = differences(ledger, engines)
    return {
        "since": hour_start(since).isoformat(),
        "engines": [a.engine_id for a in answers],
        "unconfirmed_records": sum(a.unconfirmed for a in answers),
        "ledger": ledger,
        "engine_totals": engines,
        "differences": [
            {
                "tenant_id": d.tenant_id,
                "count": d.count,
                "ledger": d.ledger,
                "engines": d.engines,
                "delta": d.delta,
            }
            for d in found
        ],
    }


async def reconcile(state: GatewayState, since: datetime) -> dict[str, Any]:
    """reconcile_report over every attached engine (an engine that does not answer is named, not counted)."""
    answers: list[Produced] = []
    missing: list[str] = []
    for engine in remote_engines(state.engine):
        try:
            answers.append(await ask(engine, hour_start(since).timestamp()))
        except Exception:
            missing.append(engine.address)
    report = await asyncio.to_thread(reconcile_report, state.db, since, answers)
    report["unanswered"] = missing
    return report
