"""The engine loop as a process main: one LLMEngine fed by messages from a pipe, publishing outputs, stats and traces.

`EngineLoop` is the one engine loop: `AsyncEngine` runs it on a thread, `ProcessEngine` spawns
`run_worker`, which runs it in its own process. Both speak to it only through engine/serving/boundary/messages.py, so
the gateway sees the same boundary either way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import torch

from engine.config import EngineConfig
from engine.core.outputs import OutputDelta
from engine.core.trace import IterationTrace
from engine.serving.boundary.messages import (
    Abort,
    IterationReport,
    SetWeight,
    StopLoop,
    Submit,
    SubmitFailed,
    WorkerFailed,
    WorkerReady,
)
from engine.serving.boundary.zmq_channel import ZmqWorkerLink
from engine.serving.llm_engine import LLMEngine

log = logging.getLogger("fairserve.engine.worker")

# Idle iterations (nothing could run) publish stats at most this often; working ones always do.
STATS_INTERVAL_S = 0.05


def default_worker_threads() -> int:
    """Torch threads for the worker: every core but one, which the gateway's event loop keeps."""
    return max(1, (os.cpu_count() or 1) - 1)


class Inbox(Protocol):
    """Where the loop's messages wait: a queue.Queue on a thread, a pipe or ZeroMQ inbox in a worker process."""

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next message; raises queue.Empty when none came in time."""

    def get_nowait(self) -> Any:
        """The next message already there; raises queue.Empty."""


class Outbox(Protocol):
    """Where the worker's messages go: a pipe or a ZeroMQ PUSH socket (engine/serving/boundary/zmq_channel.py)."""

    def send(self, msg: Any, block: bool = True, timeout: float | None = None) -> None:
        """Send one message, waiting for room; raises OSError once the gateway is gone."""


class EngineLoop:
    """The engine loop without threads or asyncio: apply messages, step, publish a report per iteration."""

    def __init__(self, engine: LLMEngine, inbox: Inbox, publish: Callable[[Any], None]) -> None:
        self.engine = engine
        # Its front (engine/serving/boundary/front.py) turns token ids into text for every request without stop strings.
        engine.detokenize_in_front()
        self.inbox = inbox
        self.publish = publish
        self._weights: dict[str, tuple[float, int | None]] = {}
        self._last_trace = engine.traces[-1].iteration if engine.traces else -1
        self._published_at = 0.0

    def run(self) -> None:
        """Serve until a StopLoop message, then end what is left as cancelled (reason "shutdown")."""
        engine = self.engine
        while True:
            if not self._drain(block=not engine.has_unfinished()):
                break
            if not engine.has_unfinished():
                continue
            outputs = engine.step_deltas()
            for request_id, exc in engine.take_refused():  # a grammar that failed to compile: a 400
                self.publish(SubmitFailed(request_id, type(exc).__name__, str(exc), exc.field_name))
            last = engine.traces[-1]
            busy = bool(outputs) or last.prefill_tokens + last.decode_tokens > 0
            if busy or time.monotonic() - self._published_at >= STATS_INTERVAL_S:
                self._report(outputs)
            if not busy:
                # Nothing could run (e.g. waiting on a deadline or blocks): wait for a message briefly.
                self._drain(block=True, timeout=0.005)
        self._cancel_everything()

    def _report(self, outputs: list[OutputDelta]) -> None:
        self._published_at = time.monotonic()
        self.publish(IterationReport(outputs, self.engine.stats(), self._new_traces()))

    def _new_traces(self) -> list[IterationTrace]:
        fresh: list[IterationTrace] = []
        for trace in reversed(self.engine.traces):
            if trace.iteration <= self._last_trace:
                break
            fresh.append(trace)
        if fresh:
            self._last_trace = fresh[0].iteration
        fresh.reverse()
        return fresh

    def _drain(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued messages; False when asked to stop."""
        try:
            msg = self.inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        while True:
            if isinstance(msg, StopLoop):
                return False
            self._apply(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, msg: Any) -> None:
        engine = self.engine
        if isinstance(msg, Submit):
            weight, priority = self._weights.get(msg.meta.tenant_id, (None, None))
            meta = msg.meta
            if weight is not None:
                meta = replace(meta, weight=weight, priority=meta.priority if priority is None else priority)
            try:
                engine.add_request(msg.request_id, msg.prompt_token_ids, msg.params, meta)
            except Exception as exc:  # validated by the parent; a race still ends that one stream cleanly
                self.publish(
                    SubmitFailed(
                        msg.request_id, type(exc).__name__, str(exc), getattr(exc, "field_name", None)
                    )
                )
        elif isinstance(msg, Abort):
            engine.abort_request(msg.request_id, msg.reason, msg.signal_time)
        elif isinstance(msg, SetWeight):
            self._weights[msg.tenant_id] = (msg.weight, msg.priority)
            setter = getattr(engine.policy, "set_weight", None)
            if setter is not None:
                setter(msg.tenant_id, msg.weight)

    def _cancel_everything(self) -> None:
        engine = self.engine
        for request_id in list(engine.scheduler.requests):
            engine.abort_request(request_id, "shutdown")
        if engine.has_unfinished():
            self._report(engine.step_deltas())  # retires the aborts and emits each stream's final output


def run_worker(config: EngineConfig, link: ZmqWorkerLink, num_threads: int) -> None:
    """Process main: build the engine, report ready (or the failure), serve messages until told to stop."""
    # The parent owns this process's lifetime: a terminal's Ctrl-C or a group SIGTERM must not kill
    # the loop under a gateway that is still draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    entered_at = time.time()
    torch.set_num_threads(num_threads)
    # Read between iterations, not on a thread, so a Submit never wakes a reader that fights the loop for the
    # GIL; the parent's end reads as StopLoop.
    # Sends wait when the gateway is far behind, as there is no event loop here.
    inbox, outbox = link.open()
    try:
        _serve(config, inbox, outbox, entered_at)
    finally:
        inbox.close()
        outbox.close()


def _serve(config: EngineConfig, inbox: Inbox, outbox: Outbox, entered_at: float) -> None:
    tell = outbox.send
    try:
        engine = LLMEngine(config)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tell(WorkerFailed(f"{type(exc).__name__}: {exc}"))
        return
    tell(
        WorkerReady(
            engine.model_name,
            engine.max_model_len,
            engine.vocab_size,
            engine.pool.block_size,
            engine.pool.num_blocks,
            engine.stats(),
            entered_at=entered_at,
            build_seconds=time.time() - entered_at,
        )
    )
    try:
        EngineLoop(engine, inbox, tell).run()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone: nobody is left to tell
    except BaseException as exc:  # the loop must never die silently
        log.exception("engine loop died")
        with contextlib.suppress(OSError):  # the parent may be gone too
            tell(WorkerFailed(f"engine loop died: {exc!r}"))
    finally:
        engine.close()
