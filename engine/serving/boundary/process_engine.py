"""`ProcessEngine`: the AsyncEngine boundary with the loop in its own process, so it never takes the gateway's GIL.

The parent keeps only the tokenizer, the live-request table and the cached stats; it validates
requests itself with the limits the worker reports once at startup and sends submit/abort/weight
messages down one channel: ZeroMQ PUSH/PULL sockets with msgspec frames (engine/serving/boundary/zmq_channel.py). The worker's
outputs are read on the event loop of the requests (`loop.add_reader` on the channel's descriptor and on
the process sentinel), not on a reader thread: a thread would
have to win the GIL from a busy event loop (up to the 5 ms switch interval) and then wake the loop
again for every report, and both hops showed in the gateway's tail latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import queue
import threading
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.core.limits import RequestLimits
from engine.core.outputs import EngineStats
from engine.core.tokenizer import Tokenizer
from engine.serving.boundary.front import EngineFront
from engine.serving.boundary.messages import EngineDeadError, StopLoop, Submit, WorkerFailed, WorkerReady
from engine.serving.boundary.worker import default_worker_threads, run_worker
from engine.serving.boundary.zmq_channel import ZmqFrontChannel, encode_frame
from engine.worker.loader import DEFAULT_MODEL_NAME, default_model_dir

log = logging.getLogger("fairserve.engine")
_EOF = object()  # what the worker's channel reads as once the worker is gone (or said goodbye)


def runs_here(loop: asyncio.AbstractEventLoop) -> bool:
    """True when called on `loop`'s own thread while it runs."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class EngineStartError(RuntimeError):
    """The engine worker process failed to build its engine or did not report ready in time."""


class ProcessEngine(EngineFront):
    """Asyncio front of an LLMEngine whose loop runs in a spawned worker process; same surface as AsyncEngine."""

    start_timeout_s = 180.0  # spawn, import torch, load the model

    def __init__(self, config: EngineConfig) -> None:
        super().__init__()
        self.config = config  # validated by pydantic when built
        model_dir = default_model_dir(config.cache_dir) if config.model is None else Path(config.model)
        self.tokenizer = Tokenizer.from_dir(model_dir)
        # Provisional until the worker reports the engine's own figures at start().
        self.model_name = config.served_model_name or (
            DEFAULT_MODEL_NAME if config.model is None else model_dir.resolve().name
        )
        self.max_model_len = _context_length(model_dir, config.max_model_len)
        self._proc: BaseProcess | None = None
        self._channel: ZmqFrontChannel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop that reads the worker's pipe
        self._watched: tuple[int, ...] = ()  # its descriptors: the pipe and the process sentinel
        self._exited = threading.Event()
        self._stopping = False
        self._shutdowns = 0  # counts shutdown calls, so a restart can tell one happened while it loaded
        # This loop pass's messages, encoded, and the request each Submit among them starts (see _send).
        self._outgoing: list[bytes] = []
        self._outgoing_ids: list[str | None] = []
        self._stats = EngineStats(
            alive=False,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
        )
        self.last_start: dict[str, float] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the worker and wait (bounded) for its ready message; raises EngineStartError if it never comes."""
        if self._proc is not None:
            return
        ctx = _worker_context(self.config.worker_start_method)
        channel = ZmqFrontChannel(_EOF)
        spawned_at = time.time()
        proc = ctx.Process(
            target=run_worker,
            args=(self.config, channel.worker_link(), default_worker_threads()),
            name="fairserve-engine",
            daemon=True,
        )
        try:
            proc.start()
            ready = _await_ready(proc, channel, self.start_timeout_s)
        except BaseException:
            if proc.is_alive():
                proc.kill()
            if proc.pid is not None:
                proc.join(5)
            channel.close()
            raise
        self._proc, self._channel = proc, channel
        self._exited.clear()
        self._stopping = False
        self._limits = RequestLimits(
            ready.vocab_size, ready.max_model_len, ready.block_size, ready.num_kv_blocks, self.config.caps
        )
        self.model_name, self.max_model_len = ready.model_name, ready.max_model_len
        self._stats = ready.stats
        # Where the last start's time went (docs/engine.md, "Kill to ready").
        self.last_start = {
            "spawn_and_imports_s": ready.entered_at - spawned_at,
            "build_s": ready.build_seconds,
            "total_s": time.time() - spawned_at,
        }
        self._alive = True
        with contextlib.suppress(
            RuntimeError
        ):  # started on a loop: read there now, else at the first generate
            self._attach(asyncio.get_running_loop())

    @property
    def pid(self) -> int | None:
        """The worker process's id while one is started (the admin API shows it per engine), else None."""
        proc = self._proc
        return None if proc is None else proc.pid

    @property
    def is_alive(self) -> bool:
        """True while the worker runs; polls the process itself until a live loop reads its pipe."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            return self._alive
        return self._alive and self._proc is not None and self._proc.is_alive()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the worker; in-flight requests end as cancelled (reason "shutdown")."""
        self._shutdowns += 1
        proc = self._proc
        if proc is None:
            return
        self._stopping = True
        with contextlib.suppress(EngineDeadError):
            self._send(StopLoop(), block=True, timeout=timeout_s)  # a hung worker is killed below
        loop = self._loop
        if loop is not None and loop.is_running() and not runs_here(loop):
            self._exited.wait(timeout_s)  # that loop reads the final reports and fails what is left
            detached = threading.Event()

            def detach_there() -> None:
                self._detach()
                detached.set()

            with contextlib.suppress(RuntimeError):  # and it lets go of the descriptors before they close
                loop.call_soon_threadsafe(detach_there)
                detached.wait(timeout_s)
        else:
            self._detach()
            self._read_until_exit(time.monotonic() + timeout_s)
        proc.join(timeout_s)
        if proc.is_alive():
            log.warning("engine worker did not stop within %.1fs; killing it", timeout_s)
            proc.kill()
            proc.join(5)
        self._worker_exited()
        self._release()

    def restart(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Replace a dead worker with a fresh one, reading its pipe on `loop` if given; a no-op while one runs.

        It blocks for the spawn and the model load (seconds), so an event loop calls it on a thread. The new
        worker starts with empty queues and fairness counters: what died with the old one was failed already.
        """
        proc = self._proc
        if (
            proc is not None
            and self._alive
            and not proc.is_alive()
            and (self._loop is None or self._loop.is_closed())
        ):
            self._worker_exited()  # it died with no loop reading its pipe to notice
        if self._alive or (proc is not None and not self._exited.is_set()):
            return  # running, or its death not yet handled (that handler fails its streams first)
        shutdowns = self._shutdowns
        self._release()
        self._error = None
        self.start()
        if self._shutdowns != shutdowns:  # shut down while the new worker loaded: that one goes too
            self.shutdown()
            raise EngineStartError("the engine was shut down while a new worker started")
        if loop is not None:
            loop.call_soon_threadsafe(self._reattach, loop)

    def _reattach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._detach()
        self._attach(loop)

    def _release(self) -> None:
        """Let go of an ended worker: its process and its channel (sockets and their files, or pipe ends)."""
        if self._proc is not None:
            self._proc.join(5)
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._proc = None

    # -- the pipes --------------------------------------------------------------------------
    def _send(self, msg: Any, block: bool = False, timeout: float | None = None) -> None:
        """Send now, or, on the reading loop's thread, at the end of this loop pass with whatever else it sends.

        The messages of one pass (the Submits of the requests a burst of replies let in, their Aborts)
        leave as one multipart ZeroMQ message: one wake-up of ZeroMQ's I/O thread and one write, where
        each used to cost its own (docs/gateway.md, "Benchmark: gateway CPU against its floor"). The flush
        is `call_soon`, so a lone request waits for no timer. Order holds: a pass's messages keep theirs,
        and a message sent off the loop's thread (shutdown's StopLoop) carries no promise against them.
        """
        channel = self._channel
        if channel is None:
            raise EngineDeadError("engine worker is not running")
        loop = self._loop
        if not block and loop is not None and runs_here(loop):
            frame = encode_frame(msg)  # here: a message that does not encode fails its caller, not the batch
            if not self._outgoing:
                loop.call_soon(self._flush)
            self._outgoing.append(frame)
            self._outgoing_ids.append(msg.request_id if isinstance(msg, Submit) else None)
            return
        try:
            channel.send(msg, block, timeout)
        except OSError as exc:  # BrokenPipeError and a closed connection alike
            raise EngineDeadError(f"engine worker is gone: {exc}") from exc

    def _flush(self) -> None:
        """Send this pass's messages; a worker gone meanwhile fails the requests they would have started."""
        frames, ids = self._outgoing, self._outgoing_ids
        self._outgoing, self._outgoing_ids = [], []
        if not frames:
            return  # the worker ended first: _worker_exited dropped them and failed their streams
        channel = self._channel
        try:
            if channel is None:
                raise BrokenPipeError("the engine worker is not running")
            channel.send_frames(frames)
        except OSError as exc:
            failure = EngineDeadError(f"engine worker is gone: {exc}")
            for request_id in ids:
                if request_id is not None:
                    self._deliver(request_id, failure)

    # -- reading the worker's outputs on the event loop -------------------------------------------
    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the worker's pipe on `loop` (the loop of the latest generate, once the previous one closed)."""
        if loop is self._loop or self._channel is None or self._proc is None or self._exited.is_set():
            return
        if self._loop is not None and not self._loop.is_closed():
            return  # the loop that reads is still open; other loops get their outputs handed over
        self._loop = loop
        self._watched = (self._channel.fd, self._proc.sentinel)
        loop.add_reader(self._watched[0], self._on_readable)
        loop.add_reader(self._watched[1], self._worker_exited)

    def _detach(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        for fd in self._watched:
            loop.remove_reader(fd)

    def _on_readable(self) -> None:
        """Dispatch every message that has fully arrived; a half-written one waits for the next call."""
        reader = self._channel
        assert reader is not None
        try:
            for msg in reader.take_ready():
                if msg is _EOF:
                    self._worker_exited()
                    return
                self._dispatch(msg)
        except OSError:
            log.exception("reading the engine worker's pipe failed")
            self._worker_exited()
        except Exception:  # a bad message must not leave streams hanging
            log.exception("engine reader failed")
            self._worker_exited()

    def _read_until_exit(self, deadline: float) -> None:
        """Off the loop (shutdown): dispatch messages until the worker's EOF or exit, or the deadline."""
        reader, proc = self._channel, self._proc
        assert reader is not None and proc is not None
        with contextlib.suppress(OSError):
            while (left := deadline - time.monotonic()) > 0:
                for msg in reader.take_ready():
                    if msg is _EOF:
                        return
                    self._dispatch(msg)
                # A ZeroMQ descriptor is edge-triggered: wake at least every 50 ms to look again.
                ready = wait([reader.fd, proc.sentinel], timeout=min(left, 0.05))
                if proc.sentinel in ready:
                    break

    def _worker_exited(self) -> None:
        """The worker ended (or shutdown gave up on it): deliver what it wrote, then fail what is left. Idempotent."""
        if self._loop is not None and runs_here(self._loop):
            self._detach()  # first: a readable sentinel would call this again on every loop pass
        reader, proc = self._channel, self._proc
        if self._exited.is_set() or reader is None or proc is None:
            return
        with contextlib.suppress(OSError):
            for msg in reader.drain_after_exit() if not proc.is_alive() else reader.take_ready():
                if msg is not _EOF:
                    self._dispatch(msg)
        self._alive = False
        self._outgoing, self._outgoing_ids = (
            [],
            [],
        )  # fenced: nothing meant for this worker goes to the one started in its place
        if self._stopping:
            reason = "engine shut down"
        else:
            proc.join(1.0)
            if proc.exitcode is None:  # its pipe failed under a live worker: no request could end now
                proc.kill()
                proc.join(5)
                reason = self._error or "lost the engine worker's pipe; the worker was killed"
            else:
                reason = self._error or f"engine worker died (exit code {proc.exitcode})"
            log.error("%s", reason)
        self._fail_all(EngineDeadError(reason))
        self._exited.set()


def _worker_context(method: str) -> Any:
    """The multiprocessing context workers start from. Never plain fork: the gateway holds threads and torch
    state. A forkserver is a fresh interpreter that only imported engine.boundary.worker (no threads, no CUDA), which
    is what makes forking from it safe."""
    if method == "forkserver":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(
            ["engine.serving.boundary.worker"]
        )  # read when the server starts (at the first worker)
        return ctx
    return multiprocessing.get_context("spawn")


def _await_ready(proc: BaseProcess, reader: ZmqFrontChannel, timeout_s: float) -> WorkerReady:
    """The worker's ready message, or EngineStartError naming why it did not come."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            # In slices: a socket has no end of file, so a worker that died early shows only in its exit code.
            msg = reader.get(timeout=min(0.1, deadline - time.monotonic()))
        except queue.Empty:
            if not proc.is_alive():
                proc.join(1.0)
                msg = next(iter(reader.drain_after_exit()), _EOF)
            elif time.monotonic() >= deadline:
                raise EngineStartError(
                    f"engine worker did not report ready within {timeout_s:.0f}s"
                ) from None
            else:
                continue
        if isinstance(msg, WorkerReady):
            return msg
        if isinstance(msg, WorkerFailed):
            raise EngineStartError(f"engine worker failed to start: {msg.error}")
        if msg is _EOF:
            proc.join(1.0)
            raise EngineStartError(f"engine worker exited (code {proc.exitcode}) before it was ready")


def _context_length(model_dir: Path, configured: int | None) -> int:
    """The context the engine will serve, read from config.json (the worker's ready message confirms it)."""
    try:
        declared = int(json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings", 0))
    except (OSError, ValueError):
        declared = 0
    if not declared:
        return configured or 0
    return min(configured or declared, declared)
