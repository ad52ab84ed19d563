"""What an infeasible deadline gets: reject (503), or a degraded answer the request (or its tenant) asked for.

The request's deadline is checked against its model's own estimate (admission/model_feasibility.py: the
model's live queue and learned rates). When it cannot be met, the policy decides (X-On-Infeasible, else the
tenant's `on_infeasible`, else the server's `--on-infeasible`, `reject` by default):

- `fallback`: the first model of `--fallback-model` chain that can meet it serves the request;
- `partial`: admitted when its prefill and one token fit; the engine ends it at its deadline with the
  tokens so far, finish_reason `length`;
- `truncate`: the oldest prompt tokens are dropped so that the prefill fits (chat: the system messages
  and the latest turns are kept, whole turns dropped oldest first);
- nothing fits: `reject`'s 503 `deadline_infeasible` with Retry-After, or 400 `deadline_unmeetable`
  without one when the request's own run exceeds its deadline on an idle engine (waiting cannot help).

Admission proper (queue bounds, quota) then runs on the serving model's engines with the deadline
already decided. The policy is the caller's alone: a tenant's default reaches only its own requests.
"""

from __future__ import annotations

import time
from dataclasses import replace

from admission.controller import Rejection
from admission.edge import Admission
from admission.feasibility import Estimate
from admission.model_feasibility import prefill_budget
from engine import EngineClient
from gateway.edge.errors import APIError
from gateway.openai import parsing as rp
from gateway.openai.context import RequestContext
from gateway.openai.schemas import ChatCompletionRequest
from gateway.openai.served import DEGRADED_HEADER
from gateway.state import GatewayState
from routing import model_client


def policy(state: GatewayState, ctx: RequestContext) -> str:
    """The request's policy: its header, else its tenant's default, else the server's."""
    return ctx.served.policy or ctx.caller.tenant.on_infeasible or state.settings.models.on_infeasible


def _estimate(
    state: GatewayState, model: str, engine: EngineClient, ctx: RequestContext, prompt: int, max_tokens: int
) -> Estimate:
    fair = state.admission.settings.fair_policy
    return state.model_rates.estimate(model, engine.stats(), ctx.tenant_id, prompt, max_tokens, fair)


async def admit(state: GatewayState, ctx: RequestContext) -> tuple[RequestContext, Admission | Rejection]:
    """The request as it will be served (perhaps degraded) and admission's verdict on it."""
    engine = ctx.served.engine
    now = time.time() if ctx.deadline is not None else 0.0
    if ctx.deadline is None or ctx.deadline <= now:  # none to meet, or already passed (408 below)
        stats = engine.stats()
        state.model_rates.observe(ctx.served.model, stats)  # every admission teaches the model's rates
        return ctx, await state.edge.admit(ctx.admission_ask(), stats)
    left = ctx.deadline - now
    prompt, max_tokens = len(ctx.inputs.prompt_token_ids), ctx.inputs.params.max_tokens
    est = _estimate(state, ctx.served.model, engine, ctx, prompt, max_tokens)
    chosen = policy(state, ctx)
    planned = replace(ctx, served=replace(ctx.served, partial_at_deadline=chosen == "partial"))
    if est.finish_s > left:
        found = await _degrade(state, planned, chosen, est, left)
        if found is None:
            refusal = _infeasible(state, est, left)
            return ctx, replace(refusal, quota=await state.edge.peek(ctx.tenant_id, ctx.limits))
        planned = found
    # The deadline is decided: admission proper (queue bounds, quota) on the serving model's engines.
    ask = replace(planned.admission_ask(), deadline=None, prompt_tokens=len(planned.inputs.prompt_token_ids))
    verdict = await state.edge.admit(ask, planned.served.engine.stats())
    kind = planned.served.degradation
    if kind is not None and not isinstance(verdict, Rejection):
        state.metrics.labels.learn(ctx.tenant_id, ctx.caller.tenant.name)
        state.metrics.degradations.labels(state.metrics.labels.label(ctx.tenant_id), kind).inc()
    return planned, verdict


async def _degrade(
    state: GatewayState, ctx: RequestContext, chosen: str, est: Estimate, left: float
) -> RequestContext | None:
    """The request degraded by `chosen` so that it meets its deadline, None when that cannot be done."""
    if chosen == "fallback":
        return _fallback(state, ctx, left)
    if chosen == "partial":
        engine = ctx.served.engine
        first = _estimate(state, ctx.served.model, engine, ctx, len(ctx.inputs.prompt_token_ids), 1)
        return (
            replace(ctx, served=replace(ctx.served, degradation="partial"))
            if first.finish_s <= left
            else None
        )
    if chosen == "truncate":
        rate = state.model_rates.effective(ctx.served.model, ctx.served.engine.stats())
        budget = prefill_budget(est, rate, ctx.inputs.params.max_tokens, left)
        return await _truncated(state, ctx, budget)
    return None


def _fallback(state: GatewayState, ctx: RequestContext, left: float) -> RequestContext | None:
    """The request on the first model of its fallback chain that can meet the deadline."""
    for name in state.settings.models.fallback_chain(ctx.served.model)[1:]:
        engine = model_client(state.engine, name)
        if engine is None or not state.engine_health.serves(engine):  # its engines down: not a place to go
            continue
        body = ctx.body.model_copy(update={"model": name})
        try:
            inputs = rp.engine_input(body, engine)
        except APIError:  # does not fit that model (its context, its caps): not a place to go
            continue
        est = _estimate(state, name, engine, ctx, len(inputs.prompt_token_ids), inputs.params.max_tokens)
        if est.finish_s <= left:  # charged at the fallback's `--model-cost`
            factor = state.settings.models.cost_factor(name)
            served = replace(  # the fallback model runs without the adapter
                ctx.served,
                model=name,
                engine=engine,
                degradation="fallback",
                cost_factor=factor,
                lora=None,
                lora_path=None,
                lora_registered=None,
            )
            return replace(ctx, inputs=inputs, served=served)
    return None


async def _truncated(state: GatewayState, ctx: RequestContext, budget: int) -> RequestContext | None:
    """The request with its oldest prompt tokens dropped to at most `budget`, None when that leaves nothing
    (a chat re-encoded through the preprocessing gate, its CPU the tenant's: gateway/openai/preprocess.py)."""
    ids = ctx.inputs.prompt_token_ids
    if budget < 1:
        return None
    engine = ctx.served.engine
    if isinstance(ctx.body, ChatCompletionRequest):
        body = ctx.body
        weight = ctx.caller.tenant.weight
        timed = await state.preprocess.run(
            ctx.tenant_id, weight, lambda: _chat_kept(body, engine, budget), ctx.deadline
        )
        ctx = replace(ctx, preprocess_cpu_s=ctx.preprocess_cpu_s + timed.cpu_s)
        if timed.value is None:
            return None
        new_ids = timed.value
    else:
        bos = engine.tokenizer.bos_token_id
        lead = [ids[0]] if bos is not None and ids and ids[0] == bos else []
        if budget <= len(lead):
            return None
        new_ids = lead + ids[len(ids) - (budget - len(lead)) :]
    dropped = len(ids) - len(new_ids)
    inputs = rp.EngineInput(new_ids, ctx.inputs.params)
    return replace(ctx, inputs=inputs, served=replace(ctx.served, degradation="truncated", dropped=dropped))


def _chat_kept(body: ChatCompletionRequest, engine: EngineClient, budget: int) -> list[int] | None:
    """Token ids of the chat with its oldest non-system turns dropped, whole, until it fits `budget`;
    None when even the system messages and the last turn do not fit.

    The fewest turns to drop is found by bisection (dropping a turn never lengthens the rendered chat), so
    a chat of n turns is encoded about log2(n) times on the event loop, not up to n times."""
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    system = [m for m in messages if m["role"] in ("system", "developer")]
    turns = [m for m in messages if m["role"] not in ("system", "developer")]
    if not turns:
        return None
    low, high = 0, len(turns) - 1  # the answer, if any, is the fewest dropped in [low, high]
    found: list[int] | None = None
    while low <= high:
        dropped = (low + high) // 2
        ids = engine.tokenizer.encode_chat(system + turns[dropped:])
        if len(ids) <= budget:
            found, high = ids, dropped - 1
        else:
            low = dropped + 1
    return found


def _infeasible(state: GatewayState, est: Estimate, left: float) -> Rejection:
    """`reject`: 400 `deadline_unmeetable` when even an idle engine could not meet it, else 503
    `deadline_infeasible`, retry once the queue ahead has drained by the overshoot (AdmissionController)."""
    return state.admission.infeasible(est, left)


def headers(ctx: RequestContext) -> dict[str, str]:
    """X-Degraded for a degraded request (sent with the response's headers: up front for a stream)."""
    value = ctx.served.header()
    return {DEGRADED_HEADER: value} if value is not None else {}
