"""Pickled messages framed over a pipe: a sender that never blocks its event loop, a reader without a thread.

Both directions between the gateway and the engine worker use this framing. The gateway reads the
worker's outputs in an event loop callback, and uvloop makes a watched descriptor non-blocking, so the
reader must take half a frame and wait for the rest: `multiprocessing.Connection.recv` would raise
BlockingIOError mid-message there, which once read as a dead worker.

The gateway sends every Submit down this pipe. A reader thread blocked on the other end had to be
woken for each message (a cross-CPU wake-up that cost the sender ~170 us per write on a 2-core VM)
and then fought the engine loop for the GIL. Instead the engine loop reads between iterations, so
a write while it computes is a plain copy into the pipe buffer. A full pipe never blocks the
gateway's event loop: the rest of the bytes wait, in order, for `add_writer` to report room.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import pickle
import queue
import select
import struct
import threading
import time
from typing import Any

_HEADER = struct.Struct("!I")
_F_SETPIPE_SZ = 1031  # Linux: a larger pipe buffer means fewer partial writes under bursts
_PIPE_BYTES = 1 << 20


def widen(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer where the platform allows it (best effort)."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)


class PipeWriter:
    """Frames pickled messages onto a non-blocking pipe; thread-safe, never blocks the loop it is bound to."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        widen(fd)
        self.fd = fd
        self._pending = bytearray()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watching = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Flush bytes the pipe could not take on `loop` (the loop that sends)."""
        with self._lock:
            self._loop = loop
            self._watching = False

    def send(self, msg: Any, block: bool = False, timeout: float | None = None) -> None:
        """Queue one message (`block`: wait up to `timeout` until it is all in the pipe, else TimeoutError);
        raises OSError once the reader is gone."""
        payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._pending += _HEADER.pack(len(payload))
            self._pending += payload
            self._flush()
            if not self._pending:
                return
            loop = self._loop
            if not block and loop is not None and runs_here(loop):
                if not self._watching:
                    loop.add_writer(self.fd, self._on_writable)
                    self._watching = True
                return
            # Off the loop (shutdown, another thread): wait for room rather than leave bytes behind.
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("the reader took nothing from a full pipe in time")
                select.select([], [self.fd], [], left)
                self._flush()

    def _flush(self) -> None:
        while self._pending:
            try:
                written = os.write(self.fd, self._pending)
            except BlockingIOError:
                return
            del self._pending[:written]

    def _on_writable(self) -> None:
        with self._lock:
            try:
                self._flush()
            except OSError:  # the reader is gone; its exit is noticed on the output pipe
                self._pending.clear()
            if not self._pending and self._watching and self._loop is not None:
                self._loop.remove_writer(self.fd)
                self._watching = False

    def close(self) -> None:
        """Stop watching for room; the caller closes the descriptor."""
        with self._lock:
            if self._watching and self._loop is not None and not self._loop.is_closed():
                self._loop.remove_writer(self.fd)
            self._watching = False


class PipeReader:
    """Decodes framed messages from a pipe with the `queue.Queue` get surface the engine loop drains.

    At end of file it returns `eof_message` from then on (the sender is gone: nobody is left to serve).
    """

    def __init__(self, fd: int, eof_message: Any) -> None:
        self.fd = fd
        self.eof_message = eof_message
        self._buffer = bytearray()
        self._ready: collections.deque[Any] = collections.deque()
        self._eof = False

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next message, waiting up to `timeout` (forever when None) if `block`; raises queue.Empty."""
        wait = (None if timeout is None else max(0.0, timeout)) if block else 0.0
        while not self._ready:
            if self._eof:
                return self.eof_message
            readable, _, _ = select.select([self.fd], [], [], wait)
            if not readable:
                raise queue.Empty
            self._read()
            if self._buffer:
                wait = None  # a frame is half here: its writer is mid-message, the rest follows at once
        return self._ready.popleft()

    def get_nowait(self) -> Any:
        """The next message if one has fully arrived; raises queue.Empty."""
        return self.get(block=False)

    def take_ready(self) -> list[Any]:
        """Every message that has fully arrived, without ever waiting: a half-written frame stays buffered
        for the next call. Ends with `eof_message` once the writer is gone. For an event loop's reader callback."""
        while not self._eof and select.select([self.fd], [], [], 0)[0] and self._read():
            pass
        ready = list(self._ready)
        self._ready.clear()
        if self._eof:
            ready.append(self.eof_message)
        return ready

    def _read(self) -> bool:
        """One read of a readable pipe into whole messages; False when it had nothing after all."""
        try:
            chunk = os.read(self.fd, _PIPE_BYTES)
        except BlockingIOError:  # an event loop may have made the descriptor non-blocking
            return False
        if not chunk:
            self._eof = True
        else:
            self._feed(chunk)
        return True

    def _feed(self, chunk: bytes) -> None:
        buf = self._buffer
        buf += chunk
        start = 0
        while len(buf) - start >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buf, start)
            end = start + _HEADER.size + size
            if len(buf) < end:
                break
            self._ready.append(pickle.loads(buf[start + _HEADER.size : end]))
            start = end
        del buf[:start]


def runs_here(loop: asyncio.AbstractEventLoop) -> bool:
    """True when called on `loop`'s own thread while it runs."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class PipeFrontChannel:
    """The gateway's side of the pipe transport (`transport="pipe"`), kept for A/B runs against ZeroMQ."""

    def __init__(self, ctx: Any, eof_message: Any) -> None:
        self.eof_message = eof_message
        self._worker_in, self._to_worker = ctx.Pipe(duplex=False)
        self._from_worker, self._worker_out = ctx.Pipe(duplex=False)
        self._reader = PipeReader(self._from_worker.fileno(), eof_message)
        self._writer = PipeWriter(self._to_worker.fileno())
        self.fd: int = self._from_worker.fileno()

    def worker_link(self) -> PipeWorkerLink:
        """The worker's ends, handed to the process at its start."""
        return PipeWorkerLink(self._worker_in, self._worker_out)

    def after_spawn(self) -> None:
        """Only the worker may hold its ends, so its death reads as EOF here."""
        self._worker_in.close()
        self._worker_out.close()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Flush what a full pipe could not take on `loop`."""
        self._writer.bind(loop)

    def send(self, msg: Any, block: bool = False, timeout: float | None = None) -> None:
        """See PipeWriter.send."""
        self._writer.send(msg, block, timeout)

    def take_ready(self) -> list[Any]:
        """See PipeReader.take_ready."""
        return self._reader.take_ready()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """See PipeReader.get."""
        return self._reader.get(block, timeout)

    def drain_after_exit(self) -> list[Any]:
        """What an ended worker wrote: its pipe is at end of file, so everything is here."""
        return self._reader.take_ready()

    def close(self) -> None:
        """Stop watching for room and close the gateway's ends."""
        self._writer.close()
        for conn in (self._to_worker, self._from_worker, self._worker_in, self._worker_out):
            conn.close()


class PipeWorkerLink:
    """The worker's two pipe ends (multiprocessing Connections, which cross a spawn or forkserver start)."""

    def __init__(self, inbox: Any, outbox: Any) -> None:
        self.inbox = inbox
        self.outbox = outbox

    def open(self) -> tuple[PipeInbox, PipeOutbox]:
        """The engine loop's inbox and outbox over these ends."""
        return PipeInbox(self.inbox), PipeOutbox(self.outbox)


class PipeInbox(PipeReader):
    """A PipeReader whose end of file is StopLoop (the parent is gone), closing its Connection at the end."""

    def __init__(self, conn: Any) -> None:
        # deferred: messages imports nothing from here, keep it that way
        from engine.boundary.messages import StopLoop

        super().__init__(conn.fileno(), eof_message=StopLoop())
        self._conn = conn

    def close(self) -> None:
        """Close the Connection."""
        self._conn.close()


class PipeOutbox:
    """A PipeWriter whose sends block when the pipe is full (the worker has no event loop)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._writer = PipeWriter(conn.fileno())

    def send(self, msg: Any, block: bool = True, timeout: float | None = None) -> None:
        """Write the whole message, waiting for room."""
        self._writer.send(msg, block=True, timeout=timeout)

    def close(self) -> None:
        """Close the Connection: the front reads end of file after the last frame."""
        self._conn.close()
