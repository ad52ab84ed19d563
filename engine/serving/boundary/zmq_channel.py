"""The engine boundary on ZeroMQ: msgspec frames over two PUSH/PULL ipc sockets, one per direction.

Socket pattern as vLLM V1's EngineCoreClient: requests go into the engine over PUSH -> PULL and outputs
come back over PUSH -> PULL. Both directions are one-way streams with a single peer, so there is no
request/reply lockstep to wait on (REQ/REP) and no identity routing to pay for (ROUTER/DEALER); PUSH/PULL
gives ordered, message-atomic delivery, which a hand-written pipe framing had to build and fix by hand (it
was measured against this and deleted, docs/gateway.md "Transport A/B"): a frame arrives whole or not at all.

Each PULL binds and each PUSH connects. A connecting PUSH queues messages at once, before the peer has
even bound, so the gateway can send a Submit the moment the worker reports ready and the worker can
report before the gateway reads; nothing waits for a handshake. Every start of a worker gets fresh ipc
paths in its own temp directory (unique per engine), removed with linger 0 when the worker is released.

The gateway side does not run a reader task: its event loop watches the PULL socket's descriptor with
`add_reader`, which is how zmq.asyncio integrates a socket with asyncio too, and the callback drains every
whole frame without a task switch per report (docs/engine.md, "Transport"). The descriptor is
edge-triggered, so every drain reads until the socket says it has nothing more.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import queue
import select
import shutil
import tempfile
import threading
import time
import weakref
from typing import Any

import msgspec
import zmq

from engine.serving.boundary.messages import FromEngineAsRead, StopLoop, ToEngine, WorkerExiting

log = logging.getLogger("fairserve.engine.zmq")
_ENCODER = msgspec.msgpack.Encoder()
encode_frame = _ENCODER.encode  # one boundary message to the bytes of one frame
# The worker sends at most this many reports ahead of a gateway that reads none before its send waits.
_WORKER_SNDHWM = 1000
# After the worker process ended, how long a quiet socket is given to bring in frames it wrote last.
_EXIT_QUIET_S = 0.02


def decode_all(
    sock: zmq.Socket[Any], decoder: msgspec.msgpack.Decoder[Any], into: collections.deque[Any]
) -> None:
    """Read every frame waiting on `sock` without blocking; a frame that does not decode is logged and dropped.

    A garbage or unknown frame belongs to nobody: dropping it costs no request, and the loop goes on.
    """
    while True:
        try:
            frame = sock.recv(zmq.NOBLOCK, copy=True)
        except zmq.Again:
            return
        try:
            into.append(decoder.decode(frame))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("dropped an engine-boundary frame that does not decode (%d bytes): %s", len(frame), exc)


class ZmqFrontChannel:
    """The gateway's side: PUSH to the worker's inbox, PULL from its outbox, in a fresh temp directory."""

    def __init__(self, eof_message: Any) -> None:
        self.eof_message = eof_message
        self.dir = tempfile.mkdtemp(prefix="fairserve-engine-")
        # Removed at close, or when the channel is dropped or the interpreter exits without one.
        self._remove_dir = weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)
        self.to_worker_addr = f"ipc://{self.dir}/in"
        self.from_worker_addr = f"ipc://{self.dir}/out"
        self._ctx = zmq.Context()
        self._out = self._ctx.socket(zmq.PUSH)
        self._out.setsockopt(zmq.LINGER, 0)
        self._out.setsockopt(zmq.SNDHWM, 0)  # as the pipe did: a send queues, it never waits on the loop
        self._out.connect(self.to_worker_addr)
        self._in = self._ctx.socket(zmq.PULL)
        self._in.setsockopt(zmq.LINGER, 0)
        self._in.setsockopt(zmq.RCVHWM, 0)
        self._in.bind(self.from_worker_addr)
        self.fd = int(self._in.getsockopt(zmq.FD))
        self._decoder = msgspec.msgpack.Decoder(FromEngineAsRead)
        self._ready: collections.deque[Any] = collections.deque()
        self._send_lock = threading.Lock()  # a zmq socket is not thread-safe; shutdown may send from a thread
        self._eof = False
        self._closed = False

    def worker_link(self) -> ZmqWorkerLink:
        """What the worker process needs to connect back: the two addresses."""
        return ZmqWorkerLink(self.to_worker_addr, self.from_worker_addr)

    def send(self, msg: Any, block: bool = False, timeout: float | None = None) -> None:
        """Queue one message for the worker; raises OSError once the channel is closed. Never blocks (no HWM)."""
        frame = _ENCODER.encode(msg)
        with self._send_lock:
            if self._closed:
                raise BrokenPipeError("the engine channel is closed")
            try:
                self._out.send(frame, zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as exc:
                raise BrokenPipeError(f"engine channel: {exc}") from exc

    def send_frames(self, frames: list[bytes]) -> None:
        """Queue frames already encoded (`encode_frame`) as one multipart ZeroMQ message: one wake-up of the
        I/O thread and one write for all of them.

        Each part is a whole frame, so the worker's reader (`decode_all`, a recv per part) takes them as
        if they had been sent one by one; a multipart message arrives whole or not at all.
        """
        with self._send_lock:
            if self._closed:
                raise BrokenPipeError("the engine channel is closed")
            try:
                if len(frames) == 1:
                    self._out.send(frames[0], zmq.NOBLOCK, copy=False)
                else:
                    self._out.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as exc:
                raise BrokenPipeError(f"engine channel: {exc}") from exc

    def take_ready(self) -> list[Any]:
        """Every message that has arrived, without waiting; ends with `eof_message` after the worker's goodbye."""
        if not self._eof and not self._closed:
            decode_all(self._in, self._decoder, self._ready)
        ready: list[Any] = []
        while self._ready:
            msg = self._ready.popleft()
            if isinstance(msg, WorkerExiting):
                self._eof = True
                self._ready.clear()
                break
            ready.append(msg)
        if self._eof:
            ready.append(self.eof_message)
        return ready

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next message, waiting up to `timeout` if `block`; raises queue.Empty."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = self.take_ready()
            if ready:
                self._ready.extendleft(reversed(ready[1:]))  # keep the rest for the next call
                if ready[0] is self.eof_message:
                    self._ready.clear()
                return ready[0]
            left = None if deadline is None else deadline - time.monotonic()
            if not block or (left is not None and left <= 0):
                raise queue.Empty
            self._in.poll(None if left is None else max(1, int(left * 1000)), zmq.POLLIN)

    def drain_after_exit(self) -> list[Any]:
        """What a worker that has ended still sent: up to its goodbye, or until the socket stays quiet."""
        got: list[Any] = []
        while not self._closed:
            ready = self.take_ready()
            got.extend(ready)
            if self._eof:
                break
            if not ready and not self._in.poll(int(_EXIT_QUIET_S * 1000), zmq.POLLIN):
                break
        return got

    def close(self) -> None:
        """Close both sockets at once (linger 0) and remove the ipc files; idempotent."""
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
            self._out.close(linger=0)
            self._in.close(linger=0)
            self._ctx.term()
        self._remove_dir()


class ZmqWorkerLink(msgspec.Struct, frozen=True):
    """The addresses a worker connects to: picklable, so it crosses the spawn or forkserver start."""

    inbox_addr: str
    outbox_addr: str

    def open(self) -> tuple[ZmqInbox, ZmqOutbox]:
        """Bind the inbox and connect the outbox, in the worker process."""
        ctx = zmq.Context()
        parent = multiprocessing.parent_process()
        sentinel = parent.sentinel if parent is not None else None
        return ZmqInbox(ctx, self.inbox_addr, sentinel), ZmqOutbox(ctx, self.outbox_addr, sentinel)


class ZmqInbox:
    """The worker's PULL socket with the `queue.Queue` get surface the engine loop drains.

    The parent's death reads as StopLoop, as end of file on the pipe did: nobody is left to serve.
    """

    def __init__(self, ctx: zmq.Context[Any], addr: str, parent_sentinel: int | None) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(addr)
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        self._sentinel = parent_sentinel
        if parent_sentinel is not None:
            self._poller.register(parent_sentinel, zmq.POLLIN)
        self._decoder = msgspec.msgpack.Decoder(ToEngine)
        self._ready: collections.deque[Any] = collections.deque()
        self._orphaned = False

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next message, waiting up to `timeout` (forever when None) if `block`; raises queue.Empty."""
        deadline = None if timeout is None or not block else time.monotonic() + timeout
        while not self._ready:
            if self._orphaned:
                return StopLoop()
            decode_all(self.sock, self._decoder, self._ready)
            if self._ready:
                break
            left = 0.0 if not block else (None if deadline is None else deadline - time.monotonic())
            if left is not None and left <= 0:
                raise queue.Empty
            events = dict(self._poller.poll(None if left is None else max(1, int(left * 1000))))
            if self._sentinel is not None and self._sentinel in events:
                decode_all(self.sock, self._decoder, self._ready)
                self._orphaned = True
        return self._ready.popleft()

    def get_nowait(self) -> Any:
        """The next message if one has arrived; raises queue.Empty."""
        return self.get(block=False)

    def close(self) -> None:
        """Close without lingering: the parent is gone or has told us to stop."""
        self.sock.close(linger=0)


class ZmqOutbox:
    """The worker's PUSH socket: a send waits while the gateway is a full HWM behind, unless the gateway is gone."""

    def __init__(self, ctx: zmq.Context[Any], addr: str, parent_sentinel: int | None) -> None:
        self._ctx = ctx
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, _WORKER_SNDHWM)
        self.sock.setsockopt(zmq.SNDTIMEO, 200)
        self.sock.connect(addr)
        self._sentinel = parent_sentinel

    def send(self, msg: Any, block: bool = True, timeout: float | None = None) -> None:
        """Encode and send; raises BrokenPipeError when the parent died while the send waited for room."""
        frame = _ENCODER.encode(msg)
        while True:
            try:
                self.sock.send(frame, copy=False)
                return
            except zmq.Again:
                if self._sentinel is not None and _readable(self._sentinel):
                    raise BrokenPipeError("the gateway is gone") from None

    def close(self) -> None:
        """Say goodbye (the front then knows every frame before it has arrived), flush briefly, and end the context."""
        with contextlib.suppress(zmq.ZMQError, BrokenPipeError):
            self.send(WorkerExiting())
        self.sock.close(linger=2000)
        self._ctx.term()


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])
