"""`EngineFront`: the asyncio side of the engine boundary, shared by the thread and the process engines.

A front validates a request, registers its stream, sends a Submit, and turns the loop's
IterationReports into per-request asyncio queues, or calls to a consumer's sink. Subclasses only say
how messages travel (`_send`) and how the loop is started and stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace
from typing import Any

import msgspec

from engine.core.errors import DuplicateRequestError, InvalidRequestError, PromptTooLongError
from engine.core.limits import RequestCaps, RequestLimits
from engine.core.outputs import (
    EngineStats,
    OutputDelta,
    RequestInfo,
    RequestOutput,
    TokenPrefix,
    text_in_loop,
)
from engine.core.request import FinishReason, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.tokenizer import Tokenizer
from engine.core.trace import IterationTrace
from engine.serving.boundary.messages import (
    Abort,
    EngineDeadError,
    IterationReport,
    ReportAsRead,
    SetWeight,
    Submit,
    SubmitFailed,
    WorkerFailed,
)
from engine.serving.boundary.route import OutputRoute as OutputRoute  # re-exported: the front's public names
from engine.serving.boundary.route import Sink as Sink

_ERRORS: dict[str, type[InvalidRequestError]] = {
    cls.__name__: cls for cls in (InvalidRequestError, DuplicateRequestError, PromptTooLongError)
}
_TRACES_KEPT = 256
_STATS = msgspec.msgpack.Decoder(EngineStats)
_TRACES = msgspec.msgpack.Decoder(list[IterationTrace])
_NO_TRACES = 1  # the msgpack of an empty list is one byte
_REPORTS = (
    ReportAsRead,
    IterationReport,
)  # as read off a channel, and as a thread engine's loop hands it over
log = logging.getLogger("fairserve.engine")


class GenerateOverSubmit:
    """`generate` as the iteration of `submit`'s stream, written once for every client that submits.

    The engine's fronts and the router over many engines (routing/router.py) each implement `submit`
    their own way; the generator around it (and its `close`, which aborts a request whose consumer
    went away) must not drift between them, so they inherit it from here.
    """

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        meta: RequestMeta,
        request_id: str,
        sink: Sink | None = None,
    ) -> OutputStream:
        """Validate and queue a request now; outputs go to the returned stream (or to `sink`)."""
        raise NotImplementedError

    async def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, meta: RequestMeta, request_id: str
    ) -> AsyncGenerator[RequestOutput, None]:
        """Queue a request and yield its outputs; validation errors raise before anything is queued.

        Closing the generator early (`aclose`) closes the stream, which aborts the request."""
        stream = self.submit(prompt_token_ids, params, meta, request_id)
        try:
            async for item in stream:
                yield item
        finally:
            stream.close()


class EngineFront(GenerateOverSubmit):
    """Streams, live-request table and cached stats; the loop lives behind `_send`."""

    tokenizer: Tokenizer  # set by each subclass: the front detokenizes what the loop leaves to it

    def __init__(self) -> None:
        self._streams: dict[str, OutputRoute] = {}
        self._live: dict[str, RequestInfo] = {}
        self._lock = threading.Lock()
        self._alive = False
        self._error: str | None = None
        self._limits: RequestLimits | None = None
        # The latest snapshot, or its msgpack as the last report brought it (decoded by `stats` when asked).
        self._stats: EngineStats | msgspec.Raw = EngineStats()
        self._traces: deque[IterationTrace] = deque(maxlen=_TRACES_KEPT)
        self._traces_read: deque[msgspec.Raw] = deque(maxlen=_TRACES_KEPT)  # not yet decoded, each >= 1 trace

    def _send(self, msg: Any) -> None:
        """Hand a message to the loop; raise EngineDeadError when it is gone."""
        raise NotImplementedError

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called on the event loop of every generate; a front that reads its loop's outputs there binds to it."""

    @property
    def caps(self) -> RequestCaps:
        """The per-request caps the engine enforces (engine/core/limits.py), for checks at the edge."""
        return self._limits.caps if self._limits is not None else RequestCaps()

    @property
    def limits(self) -> RequestLimits | None:
        """What a request must fit (vocabulary, context, KV geometry incl. block_size), once the engine
        has reported it; a router reads the block size from here to key its prefix affinity."""
        return self._limits

    @property
    def is_alive(self) -> bool:
        """True while the loop runs."""
        return self._alive

    # -- the boundary (`generate` is GenerateOverSubmit's, over this `submit`) ----------------
    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        meta: RequestMeta,
        request_id: str,
        sink: Sink | None = None,
    ) -> OutputStream:
        """Validate and queue a request now, on the running loop; its outputs come from the returned stream.

        Unlike `generate`, whose body waits for the consumer's first step, the Submit is on its way
        before this returns: a caller that hands the stream to another task saves that task's turn.
        With a `sink`, each output (or the error that ends the stream) is instead handed to it on this
        loop as it arrives, and the stream is only the handle that aborts the request when closed.
        """
        if not self._alive or self._limits is None:
            raise EngineDeadError(self._error or "engine loop is not running")
        self._limits.validate(prompt_token_ids, params)
        loop = asyncio.get_running_loop()
        self._attach(loop)
        stream = OutputStream(self, request_id, sink)
        prompt = list(prompt_token_ids)
        with self._lock:
            if request_id in self._streams:
                raise DuplicateRequestError(f"request id {request_id!r} is already live", "request_id")
            detokenizer = None if text_in_loop(params) else self.tokenizer.detokenizer(prompt)
            info = RequestInfo(request_id, meta.tenant_id, meta.task_id, "waiting")
            route = self._streams[request_id] = OutputRoute(loop, stream.put, prompt, detokenizer, info)
            if params.n > 1:
                route.add_choices(
                    [
                        None if detokenizer is None else self.tokenizer.detokenizer(prompt)
                        for _ in range(params.n - 1)
                    ]
                )
            self._live[request_id] = info
        try:
            self._send(Submit(request_id, prompt, params, meta))
        except BaseException:
            self._forget(request_id)
            raise
        return stream

    def _forget(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
            self._live.pop(request_id, None)

    def abort(self, request_id: str, reason: str = "cancelled") -> bool:
        """Cancel a live request at the next iteration boundary."""
        with self._lock:
            live = request_id in self._live
        if live:
            with contextlib.suppress(EngineDeadError):  # a dead loop has already failed the stream
                self._send(Abort(request_id, reason))
        return live

    def cancel_task(self, task_id: str) -> list[str]:
        """Cancel every live request of `task_id`; returns their ids."""
        with self._lock:
            ids = [i for i, info in self._live.items() if info.task_id == task_id]
        for request_id in ids:
            with contextlib.suppress(EngineDeadError):
                self._send(Abort(request_id, "cancelled"))
        return ids

    def live_request(self, request_id: str) -> RequestInfo | None:
        """Owner of a live request, for tenant checks at the edge."""
        with self._lock:
            info = self._live.get(request_id)
            return replace(info) if info else None

    def set_tenant_weight(self, tenant_id: str, weight: float, priority: int | None = None) -> None:
        """Change a tenant's weight (and class) for requests not yet admitted and future charges."""
        with contextlib.suppress(EngineDeadError):
            self._send(SetWeight(tenant_id, weight, priority))

    def stats(self) -> EngineStats:
        """The snapshot the loop published after its last working iteration."""
        # A shallow copy, as dataclasses.replace made, at a fifth of its cost: admission asks twice a request.
        stats = self._stats
        if isinstance(stats, msgspec.Raw):
            decoded = _STATS.decode(stats)
            with self._lock:  # unless a newer report came meanwhile
                if self._stats is stats:
                    self._stats = decoded
            stats = decoded
        s = object.__new__(EngineStats)
        s.__dict__.update(stats.__dict__)
        s.alive = self._alive
        return s

    def recent_traces(self, n: int = 50) -> list[IterationTrace]:
        """The last `n` iteration traces."""
        with self._lock:
            while self._traces_read:
                self._traces.extend(_TRACES.decode(self._traces_read.popleft()))
            return list(self._traces)[-n:]

    # -- what comes back from the loop ------------------------------------------------------
    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, _REPORTS):
            # Stats before outputs, so a consumer that sees its request end sees its blocks freed.
            with self._lock:
                self._stats = msg.stats
                if isinstance(msg, IterationReport):
                    self._traces.extend(msg.traces)  # the last _TRACES_KEPT, with no copy per report
                elif len(msg.traces) > _NO_TRACES:
                    self._traces_read.append(msg.traces.copy())  # not a view that keeps the whole frame
            here = _running_loop()  # once a report, not once an output (0.7 us a call)
            for delta in msg.outputs:
                self._deliver(delta.request_id, delta, here)
        elif isinstance(msg, SubmitFailed):
            cls = _ERRORS.get(msg.kind)
            exc: Exception = cls(msg.message, msg.field_name) if cls else EngineDeadError(msg.message)
            self._deliver(msg.request_id, exc)
        elif isinstance(msg, WorkerFailed):
            self._error = msg.error

    def _deliver(
        self,
        request_id: str,
        item: OutputDelta | BaseException,
        here: asyncio.AbstractEventLoop | None | bool = False,
    ) -> None:
        """Hand one output (or a request's error) to its route, on the consumer's loop; `here` is the running
        loop (None: none) when the caller already knows it."""
        with self._lock:
            route = self._streams.get(request_id)
            if route is None:
                return
            if route.info is not None and isinstance(item, OutputDelta):
                route.info.state = "finished" if item.finished else "running"
        if here is False:
            here = _running_loop()
        if route.loop is here:  # dispatched on the consumer's own loop: no wake-up round trip
            self._hand_over(route, item)
            return
        # Expanded (and detokenized) on the consumer's loop, not here: under AsyncEngine "here" is the
        # engine loop's thread, which is what moving the text out of the loop is for.
        # RuntimeError: the consumer's event loop is already closed.
        with contextlib.suppress(RuntimeError):
            route.loop.call_soon_threadsafe(self._hand_over, route, item)

    def _hand_over(self, route: OutputRoute, item: OutputDelta | BaseException) -> None:
        if isinstance(item, BaseException):
            route.put(item)
            return
        try:
            update = route.expand(item)
        except Exception:  # this request's text failed (a tokenizer bug): end it alone
            log.exception("detokenizing %s failed; ending it", item.request_id)
            update = self._text_failed(route, item)
        route.put(update)

    def _text_failed(self, route: OutputRoute, item: OutputDelta) -> RequestOutput:
        """The final output of a request whose text could not be made: finish_reason "error", the engine told
        to stop computing it; its tokens so far and their metrics still reach the consumer (and the ledger)."""
        route.detokenizer = None
        if not item.finished:
            with contextlib.suppress(EngineDeadError):
                self._send(Abort(item.request_id, "error"))
        return RequestOutput(
            item.request_id,
            route.prompt_token_ids,
            item.new_token_ids,
            TokenPrefix(route.token_ids, len(route.token_ids)),
            "",
            route.text,
            True,
            FinishReason.ERROR,
            item.metrics,
            new_logprobs=item.logprobs,
            index=item.index,
        )

    def _fail_all(self, exc: BaseException) -> None:
        self._alive = False
        with self._lock:
            ids = list(self._streams)
        for request_id in ids:
            self._deliver(request_id, exc)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class OutputStream:
    """One submitted request's outputs in order, ending after the finished one (or raising the loop's error).

    Closing it before the end aborts the request: the consumer went away (a client disconnect), so the
    engine stops computing for nobody.
    """

    def __init__(self, front: EngineFront, request_id: str, sink: Sink | None = None) -> None:
        self.front = front
        self.request_id = request_id
        # With a sink, outputs go straight to it and nothing waits on a queue: none is made.
        self.queue: asyncio.Queue[RequestOutput | BaseException] | None = (
            asyncio.Queue() if sink is None else None
        )
        self._sink = sink
        self._ended = False
        self._on_end: list[Callable[[], None]] = []

    def put(self, item: RequestOutput | BaseException) -> None:
        """Take one output (or the stream's error) from the front, on the consumer's loop."""
        if self._sink is None:
            assert self.queue is not None
            self.queue.put_nowait(item)
            return
        if self._ended:
            return
        if isinstance(item, BaseException) or item.finished:
            self._end(abort=False)
        try:
            self._sink(item)
        except Exception:  # one consumer's bug must not cost the other streams in the same report
            log.exception("the output sink of %s raised", self.request_id)

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._ended:
            raise StopAsyncIteration
        if self.queue is None:
            raise TypeError(
                "a stream submitted with a sink hands its outputs to the sink; it is not iterated"
            )
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self._end(abort=False)  # the loop already ended this request; aborting could hit a namesake
            raise item
        if item.finished:
            self._end(abort=False)
        return item

    def when_ended(self, callback: Callable[[], None]) -> None:
        """Call `callback` once when this stream ends (finished, failed or closed); at once if it already has.

        A router that remembers which engine serves a request forgets it here, however the request ends.
        """
        if self._ended:
            callback()
        else:
            self._on_end.append(callback)

    def close(self) -> None:
        """Stop reading; aborts the request unless it already ended. Idempotent."""
        self._end(abort=True)

    async def aclose(self) -> None:
        """`close` for `async with contextlib.aclosing(...)` and other async-generator-shaped callers."""
        self.close()

    def _end(self, abort: bool) -> None:
        if self._ended:
            return
        self._ended = True
        if abort:
            self.front.abort(self.request_id, "cancelled")
        self.front._forget(self.request_id)
        callbacks, self._on_end = self._on_end, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # bookkeeping of whoever asked; the stream has ended regardless
                log.exception("an end callback of %s raised", self.request_id)
