"""The engine loop on its own thread, behind a narrow message boundary: submit, abort, weights, outputs, stats.

Only messages cross the boundary, so the loop can later move into its own process (one worker per
GPU) without the gateway changing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import EngineStats, RequestInfo, RequestOutput
from engine.request import DuplicateRequestError, RequestMeta, SamplingParams
from engine.trace import IterationTrace

log = logging.getLogger("fairserve.engine")


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can make progress."""


@dataclass
class _Submit:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    meta: RequestMeta


@dataclass
class _Abort:
    request_id: str
    reason: str
    signal_time: float = field(default_factory=time.time)


@dataclass
class _CancelTask:
    task_id: str
    signal_time: float = field(default_factory=time.time)


@dataclass
class _SetWeight:
    tenant_id: str
    weight: float
    priority: int | None


_STOP = object()


class AsyncEngine:
    """Asyncio front of an LLMEngine whose loop runs on a dedicated thread."""

    def __init__(self, config: EngineConfig, engine: LLMEngine | None = None) -> None:
        self.engine = engine or LLMEngine(config)
        self.config = config
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.engine.model_name
        self.max_model_len = self.engine.max_model_len
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._alive = False
        self._error: BaseException | None = None
        self._stats = self.engine.stats()
        self._traces: list[IterationTrace] = []
        self._live: dict[str, RequestInfo] = {}
        self._weights: dict[str, tuple[float, int | None]] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop thread."""
        if self._thread is not None:
            return
        self._alive = True
        self._thread = threading.Thread(target=self._run, name="fairserve-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; in-flight requests end as cancelled."""
        if self._thread is None:
            return
        self._inbox.put(_STOP)
        self._thread.join(timeout_s)
        self._thread = None

    @property
    def is_alive(self) -> bool:
        """True while the loop thread runs."""
        return self._alive

    # -- the boundary -----------------------------------------------------------------------
    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, meta: RequestMeta,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its outputs; validation errors raise before anything is queued."""
        if not self._alive:
            raise EngineDeadError("engine loop is not running")
        self.engine.validate(prompt_token_ids, params)
        q: asyncio.Queue[Any] = asyncio.Queue()
        with self._lock:
            if request_id in self._streams:
                raise DuplicateRequestError(f"request id {request_id!r} is already live", "request_id")
            self._streams[request_id] = (asyncio.get_running_loop(), q)
            self._live[request_id] = RequestInfo(request_id, meta.tenant_id, meta.task_id, "waiting")
        self._inbox.put(_Submit(request_id, list(prompt_token_ids), params, meta))
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True  # the loop already ended this request; aborting could hit a namesake
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                # The consumer went away (client disconnect): stop computing for nobody.
                self.abort(request_id, "cancelled")
            with self._lock:
                self._streams.pop(request_id, None)
                self._live.pop(request_id, None)

    def abort(self, request_id: str, reason: str = "cancelled") -> bool:
        """Cancel a live request at the next iteration boundary."""
        with self._lock:
            live = request_id in self._live
        if live:
            self._inbox.put(_Abort(request_id, reason))
        return live

    def cancel_task(self, task_id: str) -> list[str]:
        """Cancel every live request of `task_id`; returns their ids."""
        with self._lock:
            ids = [i for i, info in self._live.items() if info.task_id == task_id]
        for request_id in ids:
            self._inbox.put(_Abort(request_id, "cancelled"))
        return ids

    def live_request(self, request_id: str) -> RequestInfo | None:
        """Owner of a live request, for tenant checks at the edge."""
        with self._lock:
            info = self._live.get(request_id)
            return replace(info) if info else None

    def set_tenant_weight(self, tenant_id: str, weight: float, priority: int | None = None) -> None:
        """Change a tenant's weight (and class) for requests not yet admitted and future charges."""
        self._inbox.put(_SetWeight(tenant_id, weight, priority))

    def stats(self) -> EngineStats:
        """The snapshot published after the last iteration."""
        s = replace(self._stats)
        s.alive = self._alive
        return s

    def recent_traces(self, n: int = 50) -> list[IterationTrace]:
        """The last `n` iteration traces."""
        return list(self._traces[-n:])

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                block = not engine.has_unfinished()
                if not self._drain_inbox(block):
                    break
                if not engine.has_unfinished():
                    continue
                outputs = engine.step()
                # Publish stats before outputs, so a consumer that sees its request end sees its blocks freed.
                self._stats = engine.stats()
                self._traces = list(engine.traces)[-256:]
                for out in outputs:
                    self._deliver(out.request_id, out)
                if not outputs and self._stats.batch_size == 0:
                    # Nothing could run (e.g. waiting on a deadline or blocks): wait for a message briefly.
                    self._drain_inbox(block=True, timeout=0.005)
        except BaseException as exc:  # the loop must never die silently
            log.exception("engine loop died")
            self._error = exc
            self._alive = False
            self._fail_all(EngineDeadError(f"engine loop died: {exc!r}"))
            return
        self._alive = False
        self._cancel_everything()

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued messages; False when asked to stop."""
        try:
            msg = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        while True:
            if msg is _STOP:
                return False
            self._apply(msg)
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, msg: Any) -> None:
        engine = self.engine
        if isinstance(msg, _Submit):
            weight, priority = self._weights.get(msg.meta.tenant_id, (None, None))
            meta = msg.meta
            if weight is not None:
                meta = replace(meta, weight=weight, priority=meta.priority if priority is None else priority)
            try:
                engine.add_request(msg.request_id, msg.prompt_token_ids, msg.params, meta)
            except Exception as exc:  # validated already; a race (e.g. duplicate) still ends the stream cleanly
                self._deliver(msg.request_id, exc)
        elif isinstance(msg, _Abort):
            engine.abort_request(msg.request_id, msg.reason, msg.signal_time)
        elif isinstance(msg, _SetWeight):
            self._weights[msg.tenant_id] = (msg.weight, msg.priority)
            setter = getattr(engine.policy, "set_weight", None)
            if setter is not None:
                setter(msg.tenant_id, msg.weight)

    def _deliver(self, request_id: str, item: Any) -> None:
        with self._lock:
            target = self._streams.get(request_id)
            if target is not None and isinstance(item, RequestOutput) and request_id in self._live:
                self._live[request_id].state = "finished" if item.finished else "running"
        if target is not None:
            loop, q = target
            # RuntimeError: the consumer's event loop is already closed.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(q.put_nowait, item)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            ids = list(self._streams)
        for request_id in ids:
            self._deliver(request_id, exc)

    def _cancel_everything(self) -> None:
        engine = self.engine
        for request_id in list(engine.scheduler.requests):
            engine.abort_request(request_id, "shutdown")
        if engine.has_unfinished():
            for out in engine.step():  # retires the aborts and emits each stream's final output
                self._deliver(out.request_id, out)
        self._fail_all(EngineDeadError("engine shut down"))
