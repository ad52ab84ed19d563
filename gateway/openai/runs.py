"""A Run drives one engine request and fans its output out to every HTTP reader.

The owner's request and any idempotent retries that attach while it runs read the same Run, so
exactly one engine request serves them all. When the last reader disconnects before the end,
the engine request is aborted; a run with an idempotency key first waits `orphan_grace_s` for a
retry to attach, because a client that sent a key announced it would retry (its read timeout fired,
its connection dropped), and generating the answer twice is what the key is there to prevent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from engine import (
    DuplicateRequestError,
    EngineDeadError,
    FinishReason,
    InvalidRequestError,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
)
from engine.core.outputs import Fault
from gateway.edge.errors import APIError, error_body
from gateway.idempotency.records import StoredResponse
from gateway.openai.choices import Choices
from gateway.openai.format import DONE, Shape
from gateway.openai.logprobs import LogprobsView
from upstream.errors import QueuedPastDeadline

log = logging.getLogger(__name__)


@dataclass
class RunSpec:
    """Everything a Run needs to know about the response it produces.

    `request_id` is the caller's (its `X-Request-Id`, unique within its tenant only); `engine_id` is the
    gateway's own unique id for the engine request, so no caller-chosen string ever names engine work.
    """

    request_id: str
    tenant_id: str
    task_id: str | None
    shape: Shape
    stream: bool
    include_usage: bool
    idempotency_key: str | None = None
    engine_id: str = ""
    continuous_usage: bool = False  # usage in every stream event (stream_options.continuous_usage_stats)
    logprobs: LogprobsView | None = None  # the caller asked for logprobs (gateway/openai/logprobs.py)
    n: int = 1  # choices: outputs carry their index, the reply one choice each (RunFeed)

    @property
    def key(self) -> tuple[str, str]:
        """(tenant_id, request_id): how runs, 409s, cancels and the ledger know a request."""
        return self.tenant_id, self.request_id


@dataclass
class Outcome:
    """How a Run ended, for the ledger and metrics."""

    status: str  # completed | cancelled | deadline | rejected | error
    finish_reason: FinishReason | None
    metrics: RequestMetrics | None
    cancelled_by: str | None


_STATUS = {
    FinishReason.STOP: "completed",
    FinishReason.LENGTH: "completed",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.DEADLINE: "deadline",
    FinishReason.REJECTED: "rejected",
    FinishReason.ERROR: "error",
}


@dataclass
class Run:
    """One engine request in flight and what its readers have been sent so far."""

    spec: RunSpec
    chunks: list[str] = field(default_factory=list)  # SSE payloads, stream only
    final: StoredResponse | None = None
    error: APIError | None = None
    readers: int = 0
    started: bool = False  # first output arrived
    cancelled_by: str | None = None
    abort: Callable[[str], object] = lambda reason: None
    # Readers' futures, each with the number of chunks it waits for (0: any change).
    _waiters: list[tuple[asyncio.Future[None], int]] = field(default_factory=list)
    # perf_counter when the engine request was submitted, its first output and its last arrived here.
    submitted_at: float | None = None
    first_output_at: float | None = None
    finished_at: float | None = None
    task: asyncio.Task[None] | None = None
    orphan_grace_s: float = 0.0  # how long a keyed run outlives its last reader (GatewaySettings)
    events_per_write: int = 1  # a stream's middle events held for one write (GatewaySettings)
    chunk_tokens: list[int] = field(default_factory=list)  # completion tokens so far at each chunk
    delivered_chunks: int = 0  # chunks a reader has handed to its connection

    def delivered_tokens(self, completion_tokens: int) -> int:
        """Completion tokens handed to a client: all of them unless the client left before the end (then
        those of the chunks sent before it left; none for a whole-JSON reply)."""
        if self.cancelled_by != "disconnect":
            return completion_tokens  # every reader is sent the rest of the reply
        if not self.spec.stream or not self.delivered_chunks:
            return 0
        return min(completion_tokens, self.chunk_tokens[self.delivered_chunks - 1])

    def server_timing(self) -> str | None:
        """`Server-Timing` for the reply: the engine's share of it, as this gateway saw it, in ms.

        `engine` runs from submit to the last output (sent with a whole response), `engine-first`
        from submit to the first output (sent with a stream's headers). What a client measures beyond
        these is the gateway and the network.
        """
        if self.submitted_at is None:
            return None
        if not self.spec.stream and self.finished_at is not None:
            return f"engine;dur={(self.finished_at - self.submitted_at) * 1e3:.3f}"
        if self.spec.stream and self.first_output_at is not None:
            return f"engine-first;dur={(self.first_output_at - self.submitted_at) * 1e3:.3f}"
        return None

    @property
    def done(self) -> bool:
        """True once the final response or an error is known."""
        return self.final is not None or self.error is not None

    def notify(self) -> None:
        """Wake the readers this change is for: chunks, the final response or the error changed (a reader
        waiting for a number of chunks sleeps on until there are that many or the run is done)."""
        waiters, self._waiters = self._waiters, []
        ready, done = len(self.chunks), self.done
        for fut, chunks in waiters:
            if fut.done():
                continue
            if done or ready >= chunks:
                fut.set_result(None)
            else:
                self._waiters.append((fut, chunks))

    def next_change(self, chunks: int = 0) -> asyncio.Future[None]:
        """A future resolved at the next change of chunks, final response or error; with `chunks`, at the
        first change after which the run has that many chunks or is done (no wake-up per held event).

        Callers take it synchronously right after checking the state and then await it; a future taken
        later could miss a change made in between. Resolving a plain future wakes its reader in one
        loop pass, where an Event behind asyncio.wait took three.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((fut, chunks))
        return fut

    def cancel(self, reason: str) -> None:
        """Ask the engine to stop this request at the next iteration."""
        if not self.done and self.cancelled_by is None:
            self.cancelled_by = reason
            self.abort(reason)

    def push_out(self, error: APIError) -> None:
        """A tenant under its share took this queued request's place: abort it in the engine and answer
        its readers `error` (a 429) now, unless output has already started."""
        if self.started or self.done:
            return
        self.cancel("pushed_out")
        self.error = error
        self.notify()

    def reader_left(self) -> None:
        """A reader went away; with none left, nobody wants the tokens (a keyed run: unless a retry comes)."""
        self.readers -= 1
        if self.readers > 0 or self.done:
            return
        if self.spec.idempotency_key is not None and self.orphan_grace_s > 0:
            asyncio.get_running_loop().call_later(self.orphan_grace_s, self._orphan_expired)
            return
        self.cancel("disconnect")

    def _orphan_expired(self) -> None:
        """The grace after the last reader left is over: abort unless a retry attached meanwhile."""
        if self.readers <= 0 and not self.done:
            self.cancel("disconnect")


Publish = Callable[[str], Awaitable[None]]


class RunFeed:
    """Takes one engine request's outputs into its Run as the engine front delivers them (its `sink`).

    It runs inside the front's delivery on the event loop, so a reply task wakes once per output with no
    task in between; `outcome` resolves when the request has ended. It never raises.
    """

    def __init__(
        self, run: Run, on_first: Callable[[], None], on_end: Callable[[Outcome], None] = lambda outcome: None
    ) -> None:
        self.run = run
        self.on_first = on_first
        self.on_end = on_end
        self.last: RequestOutput | None = None
        self.choices = Choices(run.spec.n, run.spec.logprobs) if run.spec.n > 1 else None
        self.outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        if run.submitted_at is None:
            run.submitted_at = time.perf_counter()

    def __call__(self, item: RequestOutput | BaseException) -> None:
        if self.outcome.done():
            return
        try:
            if isinstance(item, BaseException):
                self._end(self._failed(item))
            else:
                self._take(item)
        except Exception:  # a gateway bug must still end the readers and the run
            log.exception("run %s failed", self.run.spec.request_id)
            self.run.error = APIError(500, "internal error while generating", "internal_error")
            self._end(Outcome("error", None, None, self.run.cancelled_by))

    def _take(self, out: RequestOutput) -> None:
        run, spec = self.run, self.run.spec
        if out.finished or not run.started:  # a stream's middle outputs need no clock
            now = time.perf_counter()
            if out.finished:
                run.finished_at = now
            if not run.started:
                run.started = True
                run.first_output_at = now
                self.on_first()
        if self.choices is not None:
            self._take_choice(out, self.choices)
            return
        view = spec.logprobs
        if view is not None and out.new_logprobs:
            view.add(out.new_token_ids, out.new_logprobs)  # a chunk without text carries them to the next
        if out.finished and out.fault is not None and (not spec.stream or not run.chunks):
            self._faulted(out, out.fault)  # its own input failed in the step before any event went out
            return
        if spec.stream and (out.delta_text or out.finished or not run.chunks):
            reason = out.finish_reason if out.finished else None
            so_far = out.metrics if spec.continuous_usage else None
            logprobs = None if view is None else view.take()
            run.chunks.append(
                spec.shape.chunk(
                    out.delta_text, reason, first=not run.chunks, so_far=so_far, logprobs=logprobs
                )
            )
            run.chunk_tokens.append(out.metrics.completion_tokens)
        self.last = out
        if not out.finished:
            if spec.stream:  # a whole-JSON reply waits for the end: a middle output changes nothing it reads
                run.notify()
            return
        if run.error is None:  # else already answered (pushed out): nothing to keep for a replay
            run.final = _final(run, out)
        reason = out.finish_reason or FinishReason.ERROR
        self._end(Outcome(_STATUS[reason], out.finish_reason, out.metrics, run.cancelled_by))

    def _faulted(self, out: RequestOutput, fault: Fault) -> None:
        """A request the engine ended for a fault of its own input (engine/core/errors.py RequestFault: its
        adapter, its grammar) before anything was sent: a 400 naming the field, billed for what it was
        served (its metrics go to the ledger with the `error` row)."""
        run = self.run
        run.error = APIError(400, fault.message, "invalid_value", fault.field_name)
        self.last = out
        self._end(Outcome("error", FinishReason.ERROR, out.metrics, run.cancelled_by))

    def _take_choice(self, out: RequestOutput, choices: Choices) -> None:
        """`_take` for a run of n > 1 choices: each output is its choice's, its events name their index."""
        run, spec = self.run, self.run.spec
        if out.fault is not None and (not spec.stream or not run.chunks):
            self._faulted(out, out.fault)  # (a fault fails every choice of the request)
            return
        first, reason = choices.add(out)
        if spec.stream and (out.delta_text or reason is not None or first):
            so_far = out.metrics if spec.continuous_usage else None
            logprobs = choices.logprobs(out.index)
            run.chunks.append(
                spec.shape.chunk(out.delta_text, reason, first, so_far, logprobs, index=out.index)
            )
            run.chunk_tokens.append(out.metrics.completion_tokens)
        self.last = out
        if not out.finished:
            if spec.stream:
                run.notify()
            return
        ended = choices.reason()
        if run.error is None:
            run.final = _final(run, out, choices)
        self._end(Outcome(_STATUS[ended or FinishReason.ERROR], ended, out.metrics, run.cancelled_by))

    def _failed(self, exc: BaseException) -> Outcome:
        run = self.run
        if isinstance(exc, DuplicateRequestError):
            run.error = APIError(409, str(exc), "duplicate_request_id", "X-Request-Id")
        elif isinstance(exc, PromptTooLongError):
            run.error = APIError(400, str(exc), "context_length_exceeded", exc.field_name)
        elif isinstance(exc, InvalidRequestError):
            run.error = APIError(400, str(exc), "invalid_value", exc.field_name)
        elif isinstance(exc, QueuedPastDeadline):  # an upstream model's queue (upstream/engine.py)
            run.error = APIError(
                503,
                str(exc),
                "deadline_exceeded",
                headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))},
            )
            return Outcome("deadline", FinishReason.DEADLINE, None, run.cancelled_by)
        elif isinstance(exc, EngineDeadError):
            run.error = APIError(
                503,
                "the engine stopped; retry on another replica",
                "engine_unavailable",
                headers={"Retry-After": "1"},
            )
            metrics = self.last.metrics if self.last else None
            return Outcome("error", FinishReason.ERROR, metrics, run.cancelled_by)
        else:  # a bug on this side of the engine, not the engine's death
            log.error("run %s failed", run.spec.request_id, exc_info=exc)
            run.error = APIError(500, "internal error while generating", "internal_error")
            return Outcome("error", None, None, run.cancelled_by)
        return Outcome("rejected", None, None, None)

    def _end(self, outcome: Outcome) -> None:
        # on_end runs before any reader wakes: the ledger journals the row before the reply's last byte.
        try:
            self.on_end(outcome)
        except Exception:
            log.exception("end of run %s: bookkeeping failed", self.run.spec.request_id)
        self.run.notify()
        self.outcome.set_result(outcome)


async def publish_chunks(run: Run, publish: Publish) -> None:
    """Hand a stream's events to `publish` in order as they appear, until the run is done (a reader of
    its own, so a slow idempotency store never holds up the engine's outputs)."""
    sent = 0
    while True:
        change = None if run.done else run.next_change()
        while sent < len(run.chunks):
            sent += 1
            await publish(run.chunks[sent - 1])
        if change is None:
            return
        await change


def _error_of(last: RequestOutput) -> dict[str, object]:
    """The error event of a stream that failed alone: a 400 naming the field for a fault of its own input
    found mid-stream (engine/core/errors.py RequestFault), else the engine's 500."""
    if last.fault is not None:
        return error_body(400, last.fault.message, "invalid_value", last.fault.field_name)
    return error_body(500, "the engine failed while generating this request", "engine_error")


def _final(run: Run, last: RequestOutput, choices: Choices | None = None) -> StoredResponse:
    spec = run.spec
    headers = {"X-Request-Id": spec.request_id}
    reason = last.finish_reason if choices is None else choices.reason()
    if spec.stream:
        tail = [spec.shape.usage_chunk(last.metrics)] if spec.include_usage else []
        if reason is FinishReason.ERROR:  # it failed alone (engine/core/isolation.py): say so on the stream
            tail.append(json.dumps(_error_of(last)))
        return StoredResponse(200, "sse", [*run.chunks, *tail, DONE], headers)
    if reason is FinishReason.DEADLINE:
        body = error_body(504, "the deadline passed before the request finished", "deadline_exceeded")
        return StoredResponse(504, "json", [json.dumps(body)], headers)
    if reason is FinishReason.ERROR:
        body = error_body(500, "the engine failed while generating", "engine_error")
        return StoredResponse(500, "json", [json.dumps(body)], headers)
    if choices is not None:
        return StoredResponse(200, "json", [spec.shape.body_of(choices.listed(), last.metrics)], headers)
    logprobs = None if spec.logprobs is None else spec.logprobs.take()
    return StoredResponse(
        200, "json", [spec.shape.body(last.text, last.finish_reason, last.metrics, logprobs)], headers
    )


class RunRegistry:
    """Live runs of this process, by (tenant, request id) and by (tenant, idempotency key)."""

    def __init__(self) -> None:
        self.by_id: dict[tuple[str, str], Run] = {}
        self.by_key: dict[tuple[str, str], Run] = {}

    def add(self, run: Run) -> None:
        """Register a live run."""
        self.by_id[run.spec.key] = run
        if run.spec.idempotency_key is not None:
            self.by_key[(run.spec.tenant_id, run.spec.idempotency_key)] = run

    def remove(self, run: Run) -> None:
        """Forget a finished run."""
        key = run.spec.key
        if self.by_id.get(key) is run:
            del self.by_id[key]
        if run.spec.idempotency_key is not None:
            self.by_key.pop((run.spec.tenant_id, run.spec.idempotency_key), None)

    def owned(self, tenant_id: str, request_id: str) -> Run | None:
        """The tenant's live run with that id; another tenant's run is invisible."""
        return self.by_id.get((tenant_id, request_id))

    def of_task(self, tenant_id: str, task_id: str) -> list[Run]:
        """The tenant's live runs carrying `task_id`."""
        return [r for r in self.by_id.values() if r.spec.tenant_id == tenant_id and r.spec.task_id == task_id]

    async def wait_idle(self, deadline: float) -> bool:
        """Wait (bounded by the monotonic `deadline`) until no run is live; True when idle."""
        while self.by_id and time.monotonic() < deadline:
            waits = [r.next_change() for r in self.by_id.values()]
            await asyncio.wait(waits, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        return not self.by_id
