"""The pipeline's last stages: submit the admitted request to the engine, and settle the run at its end.

`submit` builds the Run, hands the engine request a RunFeed as its sink and registers the run. When the
feed's outcome resolves, `_ended` releases the queue slot, counts metrics and, only when something is
left to await (a quota reservation in Redis, an idempotency claim to finish, a tracing span), starts a
task for it: the common request (no Idempotency-Key, memory quota or none) ends without a task of its own.
The ledger row is written by the feed itself, before any reader is woken to send the reply's end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from admission.edge import Admission
from engine import OutputStream
from gateway.edge.middleware import USAGE_KEY
from gateway.idempotency.claim import KeyClaim
from gateway.openai.context import RequestContext
from gateway.openai.refusals import rejected
from gateway.openai.runs import Outcome, Run, RunFeed
from gateway.ops.logs import access_usage
from gateway.ops.produced import confirm
from gateway.state import GatewayState

if TYPE_CHECKING:
    from gateway.ops.tracing import RequestTrace

log = logging.getLogger(__name__)
FINISHED_IDS_KEPT = 100_000  # far more than one ledger flush interval's worth of requests


def submit(
    state: GatewayState,
    ctx: RequestContext,
    admission: Admission,
    claim: KeyClaim | None,
    trace: RequestTrace | None,
) -> Run:
    """Submit the engine request; its end is settled by `_ended` when the feed's outcome resolves.
    `claim` is None for a request without Idempotency-Key (it claimed nothing)."""
    spec = ctx.run_spec()
    engine = ctx.served.engine  # the serving model's engines
    run = Run(
        spec,
        abort=lambda reason: engine.abort(spec.engine_id, reason),
        orphan_grace_s=state.settings.idempotent_orphan_grace_s,
        events_per_write=state.settings.stream_events_per_write,
    )
    run.submitted_at = time.perf_counter()
    feed = RunFeed(run, admission.slot.start, lambda outcome: _record(state, ctx, outcome, run))
    admission.slot.on_push_out = lambda slot: run.push_out(
        rejected(state, ctx.tenant_id, state.admission.pushed_out(slot, state.engine.stats()))
    )
    stream: OutputStream | None = None
    meta = ctx.meta()
    meta.public_prefix_tokens = state.prefixes.match(ctx.served.model, ctx.inputs.prompt_token_ids)
    if trace is not None:  # the engine's spans descend from this one (engine/serving/tracing.py)
        meta.traceparent = trace.traceparent()
    try:  # submitted now: the engine sees it in this loop pass
        stream = engine.submit(
            ctx.inputs.prompt_token_ids, ctx.inputs.params, meta, spec.engine_id, sink=feed
        )
    except Exception as exc:  # a race the edge checks missed, or a dead engine: the feed reports it as usual
        feed(exc)
    state.runs.add(run)
    if claim is not None:
        claim.hand_over(run)

    def ended(done: asyncio.Future[Outcome]) -> None:
        if not done.cancelled():  # never cancelled by the feed; only a closing loop cancels it
            _ended(state, ctx, run, done.result(), stream, admission, claim, trace)

    feed.outcome.add_done_callback(ended)
    return run


def _ended(
    state: GatewayState,
    ctx: RequestContext,
    run: Run,
    outcome: Outcome,
    stream: OutputStream | None,
    admission: Admission,
    claim: KeyClaim | None,
    trace: RequestTrace | None,
) -> None:
    """The run ended (its readers were woken first: this is a later callback on the loop): release what it
    held, count it, and await what needs awaiting in a task of its own, only when there is any."""
    if stream is not None:
        stream.close()  # ended already: a no-op that forgets the route
    admission.slot.release()
    state.runs.remove(run)
    if run.error is not None and run.error.code == "engine_unavailable":
        state.engine_health.mark_dead(state.engine)  # its own dead workers only (gateway/engine_health.py)
    m = outcome.metrics
    used = (m.prompt_tokens + m.completion_tokens) if m is not None else 0
    try:
        settled = state.edge.settle_now(ctx.tenant_id, admission, used)
    except Exception:
        log.warning("quota settle failed for %s", ctx.request_id, exc_info=True)
        settled = True
    _observe(state, ctx, outcome)
    if settled and (claim is None or claim.settled_by_nothing) and trace is None:
        return
    run.task = asyncio.create_task(_settle(state, ctx, run, outcome, admission, claim, trace, settled))


async def _settle(
    state: GatewayState,
    ctx: RequestContext,
    run: Run,
    outcome: Outcome,
    admission: Admission,
    claim: KeyClaim | None,
    trace: RequestTrace | None,
    quota_settled: bool,
) -> None:
    """The awaited part of a run's end: a quota store's settle, the trace's end, the idempotency claim."""
    if not quota_settled:
        m = outcome.metrics
        try:
            used = (m.prompt_tokens + m.completion_tokens) if m is not None else 0
            await state.edge.settle(ctx.tenant_id, admission, used, ctx.limits)
        except Exception:
            log.warning("quota settle failed for %s", ctx.request_id, exc_info=True)
    if trace is not None:
        trace.finish(outcome)
    if claim is not None:
        await claim.settle(run, outcome)


def _observe(state: GatewayState, ctx: RequestContext, outcome: Outcome) -> None:
    """Metrics of one ended run (after the reply: nothing here is needed before the last byte)."""
    if outcome.status == "rejected" and outcome.metrics is None:
        return
    state.metrics.labels.learn(ctx.tenant_id, ctx.caller.tenant.name)
    if ctx.ident.task_id or ctx.ident.workflow_run_id:
        state.metrics.tasks.finished(
            ctx.tenant_id, ctx.ident.task_id, ctx.ident.attempt, outcome.status, outcome.metrics
        )
    if outcome.metrics is not None:
        state.metrics.observe_finished(ctx.tenant_id, outcome.status, outcome.metrics)
    else:
        state.metrics.count_request(ctx.tenant_id, outcome.status)


def _record(state: GatewayState, ctx: RequestContext, outcome: Outcome, run: Run) -> None:
    """The run's ledger row, called by its RunFeed as it ends and before any reader is woken to send the
    reply's end: `Ledger.record` journals the row (one write()) first, so an answered request survives a
    kill -9 of this process (docs/billing.md, "Journal")."""
    if outcome.status == "rejected" and outcome.metrics is None:
        return  # refused by the engine before any work: nothing to bill, and the reply is an error
    completion = outcome.metrics.completion_tokens if outcome.metrics is not None else 0
    if state.settings.access_log and outcome.metrics is not None:  # before the reply ends: its line reads it
        ctx.edge_state[USAGE_KEY] = access_usage(outcome.metrics)
    row = ctx.usage_record(outcome, time.time(), run.delivered_tokens(completion))
    try:
        state.ledger.record(row)
    except Exception:  # the ledger spills on its own; a full buffer must not fail the response
        log.warning("ledger refused row %s", row.request_id, exc_info=True)
    else:
        if state.billed_ids is not None:  # attached engines forget their record (gateway/ops/produced.py)
            state.billed_ids.append((ctx.engine_id, row.completion_tokens))
            confirm(state)  # before the reply ends: an answered request is never billed `interrupted`
    state.finished_ids[(row.tenant_id, row.request_id)] = None
    if len(state.finished_ids) > FINISHED_IDS_KEPT:
        state.finished_ids.popitem(last=False)
