"""`UpstreamEngine`: an upstream model (one or more replicas of an engine fairserve does not own) as one
more `EngineClient` (engine/serving/boundary/client.py), so the gateway's request pipeline is unchanged.

The gateway's requests for the model wait here, in the fairness policy's queues (`fairness.make_policy`,
the same policies and counters the engine's scheduler uses: peek, pop, charge, finish), and are
dispatched in its order whenever a replica's window has room (upstream/window.py). Each dispatched
request is one streaming call (upstream/stream.py); its chunks come back to the gateway as the engine's
outputs would, through `EngineFront`'s routes and sinks. With a Redis URL the policy's counters are
shared with every other gateway in front of the same model, by the engines' own counter sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from engine.core.errors import DuplicateRequestError
from engine.core.limits import RequestCaps, RequestLimits
from engine.core.outputs import EngineStats, OutputDelta, RequestInfo
from engine.core.request import FinishReason, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.tokenizer import Tokenizer
from engine.serving.boundary.front import EngineFront, OutputRoute, OutputStream, Sink
from engine.serving.boundary.messages import Abort, EngineDeadError, SetWeight
from engine.serving.counter_sync import CounterSync
from fairness import FairnessConfig, make_policy
from fairness.shared import shares_counters
from upstream.config import UpstreamSettings
from upstream.errors import QueuedPastDeadline, UpstreamFailed
from upstream.pending import Pending
from upstream.probe import ProbeResult
from upstream.replica import Replica
from upstream.stream import serve_pending

log = logging.getLogger("fairserve.upstream")

# A KV geometry for RequestLimits that never binds: the upstream engine checks its own memory.
_BLOCK = 16


class UpstreamEngine(EngineFront):
    """An upstream model's replicas behind the fairness policy's queue and the replicas' windows."""

    def __init__(
        self,
        model_name: str,
        found: Sequence[ProbeResult],
        settings: UpstreamSettings,
        tokenizer: Tokenizer,
        fairness: FairnessConfig,
        caps: RequestCaps | None = None,
        counter_sync: CounterSync | None = None,
    ) -> None:
        super().__init__()
        if not found:
            raise ValueError(f"upstream model {model_name!r} has no replica")
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.settings = settings
        lengths = [f.max_model_len for f in found if f.max_model_len]
        self.max_model_len = min(lengths) if lengths else settings.max_model_len
        self.replicas = [Replica(f, settings) for f in found]
        for replica in self.replicas:
            replica.on_change = self._kick
        self.policy: Any = make_policy(fairness)
        self.counter_sync = counter_sync if shares_counters(self.policy) else None
        self._weights: dict[str, tuple[float, int | None]] = {}
        self._pending: dict[str, Pending] = {}  # queued and in flight, by request id
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limits = RequestLimits(
            tokenizer.vocab_size,
            self.max_model_len,
            _BLOCK,
            -(-self.max_model_len // _BLOCK),
            caps or RequestCaps(),
        )
        self.dispatched = 0
        self.retries = 0

    @property
    def address(self) -> str:
        """The first replica's URL: the key the gateway's engine list shows (gateway/engine_health.py)."""
        return self.replicas[0].url

    # -- life ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Nothing to start: the replicas answered the probe; their clients are made on the gateway's loop."""
        self._alive = True
        if self.counter_sync is not None:
            self.counter_sync.start()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make each replica's client, breaker and metrics watch on `loop` (the gateway's)."""
        if self._loop is None:
            self._loop = loop
            for replica in self.replicas:
                replica.bind()

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.bind(loop)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Cancel what is queued and in flight; close the replicas' connections."""
        self._alive = False
        for pending in list(self._pending.values()):
            self._cancel(pending, "shutdown")
        if self.counter_sync is not None:
            self.counter_sync.close()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            closing = [replica.close() for replica in self.replicas]
            if _on_loop(loop):
                for coro in closing:
                    loop.create_task(coro)
            else:
                future = asyncio.run_coroutine_threadsafe(_gather(closing), loop)
                with contextlib.suppress(Exception):
                    future.result(timeout_s)

    # -- the boundary --------------------------------------------------------------------------
    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        meta: RequestMeta,
        request_id: str,
        sink: Sink | None = None,
    ) -> OutputStream:
        """Check the request, queue it in the policy's order, and dispatch what the windows allow."""
        from upstream.call import refuse_unsupported

        if not self._alive or self._limits is None:
            raise EngineDeadError(self._error or "upstream engine is not serving")
        self._limits.validate(prompt_token_ids, params)
        refuse_unsupported(params)
        loop = asyncio.get_running_loop()
        self._attach(loop)
        weight, priority = self._weights.get(meta.tenant_id, (None, None))
        if weight is not None:
            from dataclasses import replace

            meta = replace(meta, weight=weight, priority=meta.priority if priority is None else priority)
        stream = OutputStream(self, request_id, sink)
        prompt = list(prompt_token_ids)
        with self._lock:
            if request_id in self._streams:
                raise DuplicateRequestError(f"request id {request_id!r} is already live", "request_id")
            info = RequestInfo(request_id, meta.tenant_id, meta.task_id, "waiting")
            self._streams[request_id] = OutputRoute(loop, stream.put, prompt, None, info)
            self._live[request_id] = info
        text = self.tokenizer.decode(self._without_bos(prompt), skip_special_tokens=False)
        pending = Pending(request_id, meta, prompt, params, text)
        self._pending[request_id] = pending
        self.policy.add(pending, time.time())
        if meta.deadline is not None:
            pending.timer = loop.call_later(max(0.0, meta.deadline - time.time()), self._expire, pending)
        self._kick()
        return stream

    def _without_bos(self, prompt: list[int]) -> list[int]:
        """The prompt less its leading BOS: the engine tokenises the text and adds its own (a second one
        would change the answer and count one token more than the gateway checked)."""
        bos = self.tokenizer.bos_token_id
        return prompt[1:] if bos is not None and prompt and prompt[0] == bos else prompt

    def _send(self, msg: Any) -> None:
        """What EngineFront's abort, cancel_task and set_tenant_weight hand over."""
        if isinstance(msg, Abort):
            pending = self._pending.get(msg.request_id)
            if pending is not None:
                self._cancel(pending, msg.reason)
        elif isinstance(msg, SetWeight):
            self._weights[msg.tenant_id] = (msg.weight, msg.priority)
            self.policy.set_weight(msg.tenant_id, msg.weight)

    def stats(self) -> EngineStats:
        """Queued and in-flight requests by tenant, the windows' sum as the batch, the policy's service."""
        waiting: dict[str, int] = {}
        running: dict[str, int] = {}
        for p in self._pending.values():
            side = running if p.dispatched_at is not None else waiting
            side[p.meta.tenant_id] = side.get(p.meta.tenant_id, 0) + 1
        tpots = [r.window.tpot_ewma for r in self.replicas if r.window.tpot_ewma]
        status, age, peers = self.counter_sync.status() if self.counter_sync else ("off", 0.0, 0)
        return EngineStats(
            alive=self._alive,
            waiting=sum(waiting.values()),
            running=sum(running.values()),
            waiting_by_tenant=waiting,
            running_by_tenant=running,
            batch_size=sum(running.values()),
            decode_tokens_per_s=sum(
                r.window.in_flight / r.window.tpot_ewma for r in self.replicas if r.window.tpot_ewma
            ),
            iteration_seconds=max(tpots) if tpots else 0.0,
            max_num_seqs=sum(r.window.limit for r in self.replicas),
            service=dict(self.policy.service()),
            counter_sync=status,
            counter_sync_age_s=age,
            counter_sync_engines=peers,
        )

    # -- dispatch ------------------------------------------------------------------------------
    def _kick(self) -> None:
        """Dispatch the policy's head while some replica has room (called on every change that may free one)."""
        if self.counter_sync is not None:
            self.counter_sync.exchange(self.policy)
        now = time.time()
        while len(self.policy):
            replica = self._pick()
            if replica is None:
                if self._all_skipped():
                    self._fail_queued("every replica of this upstream model is failing")
                return
            head: Pending | None = self.policy.peek(now)
            if head is None:
                return
            self.policy.pop(head)
            self._start(head, replica)

    def _pick(self, besides: Replica | None = None) -> Replica | None:
        """The replica with room and the most of it (relative to its window), skipping `besides`."""
        ready = [r for r in self.replicas if r is not besides and r.available()]
        if not ready:
            return None
        return min(ready, key=lambda r: r.window.in_flight / max(1, r.window.limit))

    def _all_skipped(self) -> bool:
        return all(r.breaker is not None and r.breaker.is_open for r in self.replicas)

    def _start(self, pending: Pending, replica: Replica) -> None:
        if pending.timer is not None:
            pending.timer.cancel()
            pending.timer = None
        deadline = pending.meta.deadline
        if deadline is not None and self._loop is not None:
            # In flight the deadline ends the request as the engine's scheduler ends its own (finish reason
            # deadline, the tokens it has): closing the connection stops the upstream's work on it.
            wait = max(0.0, deadline - time.time())
            pending.timer = self._loop.call_later(wait, self._cancel, pending, "deadline")
        pending.dispatched_at = time.monotonic()
        pending.first_scheduled_time = time.time()
        with self._lock:
            info = self._live.get(pending.request_id)
            if info is not None:
                info.state = "running"
        prompt = len(pending.prompt_token_ids)
        pending.charged_service += self.policy.charge(pending, prompt, 0, 0)
        pending.charged_prompt = prompt
        self.dispatched += 1
        replica.window.in_flight += 1  # now, not in the task: the next head must see the slot taken
        assert self._loop is not None
        pending.task = self._loop.create_task(serve_pending(self, pending, replica))

    def charge_output(self, pending: Pending, tokens: int) -> None:
        """Charge `tokens` output tokens to the request's key, as the scheduler charges decodes."""
        if tokens > 0:
            pending.charged_service += self.policy.charge(pending, 0, tokens, 0)
            pending.charged_output += tokens

    def charge_prompt(self, pending: Pending, tokens: int) -> None:
        """Charge prompt tokens the engine counted beyond the gateway's tokenisation."""
        if tokens > 0:
            pending.charged_service += self.policy.charge(pending, tokens, 0, 0)
            pending.charged_prompt += tokens

    def retry_on(self, failed: Replica) -> Replica | None:
        """Another replica for a request whose call failed before its first token (one retry, same deadline)."""
        replica = self._pick(besides=failed)
        if replica is not None:
            self.retries += 1
        return replica

    def deliver(self, pending: Pending, delta: OutputDelta) -> None:
        """One output of an upstream request to its route (on this loop)."""
        self._deliver(pending.request_id, delta, self._loop)

    def ended(self, pending: Pending, error: BaseException | None = None, kick: bool = True) -> None:
        """A request left (answered, failed, cancelled): the policy forgets it, its slot frees up."""
        self._pending.pop(pending.request_id, None)
        if pending.timer is not None:
            pending.timer.cancel()
        self.policy.finish(pending)
        if error is not None:
            self._deliver(pending.request_id, error, self._loop)
        if kick:
            self._kick()

    # -- ends before dispatch ---------------------------------------------------------------------
    def _expire(self, pending: Pending) -> None:
        """The deadline passed in the queue: the request leaves unserved, 503 with Retry-After."""
        if pending.dispatched_at is not None or pending.request_id not in self._pending:
            return
        self.policy.remove(pending)
        wait = sum(1 for p in self._pending.values() if p.dispatched_at is None)
        tpot = max((r.window.tpot_ewma or 0.0 for r in self.replicas), default=0.0)
        self.ended(pending, QueuedPastDeadline(max(1.0, wait * tpot)))

    def _cancel(self, pending: Pending, reason: str) -> None:
        if pending.dispatched_at is None:
            self.policy.remove(pending)
            self._pending.pop(pending.request_id, None)
            self.deliver(pending, _cancelled(pending))
            self.ended(pending)
            return
        if pending.cancel_reason is None:
            pending.cancel_reason = reason
            if pending.task is not None:
                pending.task.cancel()  # closes the stream's connection: the engine aborts the request

    def _fail_queued(self, why: str) -> None:
        for pending in [p for p in self._pending.values() if p.dispatched_at is None]:
            self.policy.remove(pending)
            self.ended(pending, UpstreamFailed(why), kick=False)


def _cancelled(pending: Pending) -> OutputDelta:
    return OutputDelta(
        pending.request_id, [], "", True, FinishReason.CANCELLED, pending.metrics(0, finished=True)
    )


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _gather(coros: list[Any]) -> None:
    await asyncio.gather(*coros, return_exceptions=True)
