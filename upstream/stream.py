"""Serve one dispatched request: call a replica, pass its chunks on and charge them, retry once, end it.

The request holds one slot of the replica's window from dispatch to its end. A refused connection, a
5xx or a stream that breaks before the first token moves it (once, with the same deadline, its prompt
charged once) to another replica; after the first token a failure ends it with what it has, so nothing
is produced, billed or charged twice. A cancel closes the connection, which is how vLLM, SGLang and TGI
learn to stop the request.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from admission.breaker import BackendUnavailable
from engine.core.errors import InvalidRequestError
from engine.core.outputs import OutputDelta
from engine.core.request import FinishReason
from upstream.call import Chunk, RetryableFailure, read_chunks, request_body
from upstream.errors import UpstreamFailed
from upstream.pending import Pending
from upstream.replica import Replica

if TYPE_CHECKING:
    from upstream.engine import UpstreamEngine

_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "eos": FinishReason.STOP}


async def serve_pending(engine: UpstreamEngine, pending: Pending, replica: Replica) -> None:
    """Run `pending` on `replica` (or, once, another) to its end; always ends it with the engine. Its slot
    in the replica's window was taken at dispatch (`UpstreamEngine._start`), before this task first runs."""
    error: BaseException | None = None
    try:
        while True:
            pending.attempts += 1
            try:
                await _attempt(engine, pending, replica)
                _observe_tpot(replica, pending)
                _finish(engine, pending)
                return
            except (BackendUnavailable, RetryableFailure) as exc:
                if isinstance(exc, RetryableFailure):
                    await replica.failed(str(exc))
                other = (
                    engine.retry_on(replica)
                    if pending.first_token_time is None and pending.attempts == 1
                    else None
                )
                if other is None:
                    raise UpstreamFailed(f"upstream {replica.url}: {exc}") from exc
                replica.window.in_flight -= 1
                replica = other
                replica.window.in_flight += 1
    except asyncio.CancelledError:
        ended_by = FinishReason.DEADLINE if pending.cancel_reason == "deadline" else FinishReason.CANCELLED
        _finish(engine, pending, ended_by)
    except UpstreamFailed as exc:
        if pending.first_token_time is None:
            error = exc  # nothing produced: the retryable 503 (gateway/openai/runs.py)
        else:
            _finish(engine, pending, FinishReason.ERROR)  # ends with what it has, billed once
    except InvalidRequestError as exc:
        error = exc
    finally:
        replica.window.in_flight -= 1
        engine.ended(pending, error)


async def _attempt(engine: UpstreamEngine, pending: Pending, replica: Replica) -> None:
    body = request_body(replica.found.upstream_model, pending.prompt_text, pending.params, replica.traits)
    response = await replica.open(body, pending.request_id)
    async for chunk in read_chunks(response):
        _on_chunk(engine, pending, replica, chunk)


def _on_chunk(engine: UpstreamEngine, pending: Pending, replica: Replica, chunk: Chunk) -> None:
    now = time.monotonic()
    local = len(engine.tokenizer.encode(chunk.text, add_special_tokens=False)) if chunk.text else 0
    new = pending.new_output_tokens(
        chunk, max(local, 1) if chunk.text else 0, replica.traits.continuous_usage
    )
    if chunk.finish_reason is not None:
        pending.finish_reason = chunk.finish_reason
    if pending.cancelled:
        pending.tokens_after_cancel += new
    engine.charge_output(pending, new)
    if not chunk.text and not new:
        return
    window = replica.window
    if pending.first_token_time is None:
        pending.first_token_time = time.time()
        assert pending.dispatched_at is not None
        if replica.reading(now).engine_queue is None and window.queued_in_engine(now - pending.dispatched_at):
            window.engine_queued()
        pending.first_token_at = now
    pending.last_token_at = now
    pending.text += chunk.text
    ids = engine.tokenizer.encode(chunk.text, add_special_tokens=False) if chunk.text else []
    engine.deliver(
        pending,
        OutputDelta(
            pending.request_id, ids, chunk.text, False, None, pending.metrics(pending.counted, False)
        ),
    )


def _observe_tpot(replica: Replica, pending: Pending) -> None:
    """The request's time per output token, first token to last, for the window: a whole request's average,
    as chunks read back to back off one socket buffer are microseconds apart and say nothing alone."""
    first, last = pending.first_token_at, pending.last_token_at
    if first is not None and last is not None and pending.counted > 1 and last > first:
        replica.window.observe_tpot((last - first) / (pending.counted - 1))


def _finish(engine: UpstreamEngine, pending: Pending, reason: FinishReason | None = None) -> None:
    """The request's last output: reconciled with the engine's final usage (charging what it counted
    beyond the charges so far), or the gateway's count where the engine sent none."""
    local_total = len(engine.tokenizer.encode(pending.text, add_special_tokens=False)) if pending.text else 0
    prompt, completion, by_gateway = pending.final_counts(local_total)
    engine.charge_prompt(pending, prompt - pending.charged_prompt)
    engine.charge_output(pending, completion - pending.charged_output)
    pending.counted_by_gateway = by_gateway
    if reason is None:
        reason = _REASONS.get(pending.finish_reason or "stop", FinishReason.STOP)
    metrics = pending.metrics(completion, finished=True)
    engine.deliver(pending, OutputDelta(pending.request_id, [], "", True, reason, metrics))
