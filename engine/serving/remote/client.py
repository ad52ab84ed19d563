"""`RemoteEngine`: the gateway's EngineClient for an engine server at a tcp:// address (engine/serving/remote/server.py).

One DEALER socket, connected with ZMQ_IMMEDIATE: a message is queued only on a live connection, so
nothing meant for an engine that died is ever delivered to the one restarted in its place, and a send
while no engine is connected fails at once (EngineDeadError) instead of waiting in a queue.

Outputs are read on the event loop as ProcessEngine reads its worker: `add_reader` on the socket's
descriptor, which ZeroMQ makes edge-triggered, so each wake-up drains until the socket is empty. A timer
on the same loop sends this gateway's heartbeat (Ping; Hello while the engine is lost) and watches the
engine's (engine/serving/remote/liveness.py): silence past `heartbeat_timeout_s` makes it suspect (`is_suspect`:
routers send it nothing new while another engine is alive), and a definite sign makes it lost: the
connection dropped, its goodbye, a restart, or silence past `lost_timeout_s`. Then every request in
flight fails with EngineDeadError (the gateway's retryable 503, an error event on a stream) and
readiness drops. When the engine answers again it
announces itself: the same `engine_id` (it was only unreachable) is told to abort what this side already
failed; a new one is a fresh process that never saw those requests. Either way the gateway serves again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from typing import Any

import msgspec
import zmq

from engine.core.limits import RequestCaps, RequestLimits
from engine.core.outputs import EngineStats
from engine.serving.boundary.front import EngineFront
from engine.serving.boundary.messages import Abort, EngineDeadError, WorkerExiting
from engine.serving.boundary.process_engine import EngineStartError
from engine.serving.remote.confirmations import RecentConfirmations
from engine.serving.remote.curve import ClusterKey, connect_securely
from engine.serving.remote.liveness import ConnectionEvents, ConnectionWatch, SilenceBounds, StallClock
from engine.serving.remote.messages import (
    Announce,
    AskProduced,
    Billed,
    FromServer,
    Hello,
    Ping,
    Produced,
    tokenizer_from_files,
)

log = logging.getLogger("fairserve.engine.remote")
_ENCODER = msgspec.msgpack.Encoder()
_HELLO_EVERY_S = 1.0  # while starting: a Hello lost to a connection not yet up is sent again after this


class RemoteEngine(EngineFront):
    """Asyncio front of an engine server reached over TCP; the same surface as ProcessEngine."""

    start_timeout_s = 60.0
    # Nothing accepting a TCP connection this long: no engine there (or no route to it). A refused port is
    # retried every 50-500 ms, so a live engine connects well within it; an engine that accepts but is slow
    # to announce still gets `start_timeout_s`.
    reach_timeout_s = 2.0

    def __init__(self, address: str, silence: SilenceBounds, cluster_key: ClusterKey | None = None) -> None:
        super().__init__()
        self._address = address
        self.silence = silence
        # Ping this often: several per engine timeout, and the engine's own heartbeat is checked as often.
        self._tick_s = min(0.1, silence.heartbeat_timeout_s / 5)
        self.gateway_id = uuid.uuid4().hex
        self.model_name = ""
        self.max_model_len = 0
        self._engine_id: str | None = None
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock: zmq.Socket[Any] | None = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.IDENTITY, self.gateway_id.encode())
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        # As the local channel: a send queues, it never waits on the loop.
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.setsockopt(zmq.RECONNECT_IVL, 50)
        self._sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
        if cluster_key is not None:
            connect_securely(self._sock, cluster_key)
        # Until the first announce: a refused handshake (a key that is not the engine's, or one side
        # without a key) fails start() at once with that reason, not after start_timeout_s of silence; and
        # no connection at all within reach_timeout_s fails it naming the address. After it: a dropped
        # connection makes the engine lost at once (a kill -9 closes it).
        self._watch = ConnectionWatch(self._sock)
        self._connected = False
        self._refused: zmq.Event | None = None
        self._suspect_since: float | None = None  # set while a suspicion is logged (once per silence)
        self._sock.connect(address)
        self._fd = int(self._sock.getsockopt(zmq.FD))
        self._decoder = msgspec.msgpack.Decoder(FromServer)
        self._sock_lock = threading.Lock()  # a zmq socket is not thread-safe; shutdown may come from a thread
        self._heard_at = 0.0
        self._stalls = StallClock()
        # Failed here on a timeout: the same engine, if it returns, aborts them.
        self._lost_ids: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.Handle | None = None
        self._read_soon = False  # a read is already scheduled on the loop
        self._stats = EngineStats(alive=False)
        self._produced: list[concurrent.futures.Future[Produced]] = []  # AskProduced answers awaited
        self._confirmations = RecentConfirmations()

    @property
    def address(self) -> str:
        """The engine server's tcp:// address."""
        return self._address

    @property
    def engine_id(self) -> str | None:
        """The engine process this front last heard announce itself (None before the first)."""
        return self._engine_id

    @property
    def is_alive(self) -> bool:
        """True until the engine is lost (engine/serving/remote/liveness.py); a suspect engine is still alive."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._read()  # no loop reads the socket: look now, on the caller's thread
        return self._alive and time.monotonic() - self._heard_at <= self.silence.lost_timeout_s

    @property
    def is_suspect(self) -> bool:
        """True while the engine is alive but silent past `heartbeat_timeout_s`: routers prefer others."""
        return self._alive and time.monotonic() - self._heard_at > self.silence.heartbeat_timeout_s

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Wait (bounded by `start_timeout_s`) for the engine's announce; raises EngineStartError."""
        began = time.monotonic()
        deadline = began + self.start_timeout_s
        said_at = -_HELLO_EVERY_S
        while not self._alive:
            now = time.monotonic()
            if now >= deadline:
                raise EngineStartError(
                    f"no engine answered at {self._address} within {self.start_timeout_s:.0f}s"
                )
            if not self._connected and now - began >= self.reach_timeout_s:
                raise EngineStartError(
                    f"no engine reachable at {self._address}: nothing accepted a connection within "
                    f"{self.reach_timeout_s:.0f}s (is `fairserve engine --listen {self._address}` running?)"
                )
            if now - said_at >= _HELLO_EVERY_S and self._say(Hello(self.gateway_id, want_tokenizer=True)):
                said_at = now
            sock = self._sock
            if sock is None:
                raise EngineStartError("the engine front was shut down")
            with self._sock_lock:
                sock.poll(50, zmq.POLLIN)
            self._read()
            self._check_handshake()
        with contextlib.suppress(RuntimeError):  # started on a loop: read there now, else at the first submit
            self._attach(asyncio.get_running_loop())

    def _check_handshake(self) -> None:
        """Raise EngineStartError if the engine refused this gateway's handshake (or this gateway its)."""
        event = self._refused
        if event is None or self._alive:
            return
        raise EngineStartError(
            f"the engine at {self._address} and this gateway could not agree a handshake ({event!r}): "
            "both must have the same --cluster-key, or neither"
        )

    def _connection_changed(self, seen: ConnectionEvents) -> None:
        """Take the socket monitor's news, before the frames read with it: a drop is seen before anything
        a restarted engine sent on the new connection."""
        self._connected = self._connected or seen.connected
        if seen.refused is not None and not self._alive:
            self._refused = seen.refused
        if seen.disconnected and self._alive:
            self._lost(f"the connection to the engine at {self._address} dropped")

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the engine and keep its heartbeat on `loop` from now on (call on that loop's thread)."""
        self._attach(loop)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Abort this gateway's live requests on the engine, fail them here, and close the socket."""
        loop = self._loop
        if loop is not None and loop.is_running() and not _runs_here(loop):
            done = threading.Event()

            def there() -> None:
                self._detach()
                done.set()

            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(there)
                done.wait(timeout_s)
        else:
            self._detach()
        with self._lock:
            live = list(self._streams)
        for request_id in live:
            self._say(Abort(request_id, "shutdown"))
        self._error = "engine front shut down"
        self._fail_all(EngineDeadError(self._error))
        with self._sock_lock:
            sock, self._sock = self._sock, None
            self._watch.close(sock)
            if sock is not None:
                sock.close(linger=min(int(timeout_s * 1000), 500))  # the aborts get a moment to leave
        self._ctx.term()

    # -- the engine's produced-token records (engine/serving/remote/accounting.py) ----------------------------
    def billed(self, request_ids: list[str], completion_tokens: list[int] | None = None) -> bool:
        """Tell the engine these requests' rows are in the ledger, with the completion tokens billed for
        each when known (it forgets their records, keeping what it produced beyond that)."""
        if completion_tokens and len(completion_tokens) == len(request_ids):
            self._confirmations.keep(request_ids, completion_tokens)  # said again when the engine is back
        return self._say(Billed(request_ids, completion_tokens or []))

    def ask_produced(
        self, since: float, orphans_after_s: float = -1.0
    ) -> concurrent.futures.Future[Produced]:
        """The engine's per-tenant totals since `since` (and dead gateways' records): a future answer."""
        future: concurrent.futures.Future[Produced] = concurrent.futures.Future()
        self._produced.append(future)
        if not self._say(AskProduced(since, orphans_after_s)):
            future.set_exception(EngineDeadError(f"the engine at {self._address} is unreachable"))
        return future

    def produced_now(self, since: float, timeout_s: float = 5.0) -> Produced:
        """ask_produced for a caller without an event loop (the CLI): reads the socket itself, bounded."""
        future = self.ask_produced(since)
        deadline = time.monotonic() + timeout_s
        while not future.done() and time.monotonic() < deadline:
            self._read()
            with self._sock_lock:
                if self._sock is not None:
                    self._sock.poll(20, zmq.POLLIN)
        return future.result(timeout=0)

    # -- the socket -----------------------------------------------------------------------------
    def _send(self, msg: Any) -> None:
        with self._sock_lock:
            sock = self._sock
            if sock is None:
                raise EngineDeadError("engine front is shut down")
            try:
                sock.send(_ENCODER.encode(msg), zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as exc:  # Again: no live connection (ZMQ_IMMEDIATE)
                raise EngineDeadError(f"the engine at {self._address} is unreachable") from exc
            # One socket both ways: a send lets ZeroMQ take in what arrived, and that spends the descriptor's
            # edge, so the reader would not be woken for it (the tick would find it, 100 ms late). Read it
            # soon, as pyzmq's own asyncio sockets do after a send.
            pending = bool(int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)
        if pending and not self._read_soon:
            loop = self._loop
            if loop is not None and _runs_here(loop):
                self._read_soon = True
                loop.call_soon(self._read)

    def _say(self, msg: Any) -> bool:
        """Send a message nobody waits on (heartbeat, hello, abort); False when it could not go."""
        try:
            self._send(msg)
        except EngineDeadError:
            return False
        return True

    def _read(self) -> None:
        """Dispatch every frame that has arrived (the descriptor is edge-triggered: read until empty)."""
        self._read_soon = False
        frames: list[bytes] = []
        with self._sock_lock:
            sock = self._sock
            seen = self._watch.read() if sock is not None else None
            while sock is not None:
                try:
                    frames.append(sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
        if seen is not None:
            self._connection_changed(seen)  # outside the lock: failing streams may send aborts
        if not frames:
            return
        self._heard_at = time.monotonic()
        if self._suspect_since is not None:
            log.warning("the engine at %s speaks again: no longer suspect", self._address)
            self._suspect_since = None
        for frame in frames:
            try:
                msg = self._decoder.decode(frame)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error(
                    "dropped a frame from the engine that does not decode (%d bytes): %s", len(frame), exc
                )
                continue
            if isinstance(msg, Produced):
                waiting, self._produced = self._produced, []
                for future in waiting:
                    if not future.done():
                        future.set_result(msg)
            elif isinstance(msg, Announce):
                self._adopt(msg)
            elif isinstance(msg, WorkerExiting):
                if self._alive:  # a graceful stop, said by the engine: INFO, not an error
                    self._lost(f"the engine at {self._address} shut down", graceful=True)
            elif self._alive:
                self._dispatch(msg)

    def _adopt(self, ann: Announce) -> None:
        """Take an engine's announce: the first one, the same engine back, or a fresh process."""
        if self.model_name and ann.model_name != self.model_name:
            if self._alive:
                self._lost(f"the engine at {self._address} now serves {ann.model_name!r}")
            refusal = (
                f"the engine at {self._address} serves {ann.model_name!r}, not {self.model_name!r}: "
                "refused (one gateway serves one model)"
            )
            if self._error != refusal:  # said once, not at every Hello it answers
                log.error("%s", refusal)
                self._error = refusal
            return
        if ann.engine_id != self._engine_id and self._alive:
            self._lost(f"the engine at {self._address} restarted")  # its connection may never have dropped
        if ann.engine_id == self._engine_id:
            for request_id in self._lost_ids:  # this side gave up on them: the engine should too
                self._say(Abort(request_id, "gateway_lost"))
        self._lost_ids = []
        if not hasattr(self, "tokenizer"):
            if not ann.tokenizer_files:
                return  # an announce that answered a Ping: wait for the one our Hello asks the files in
            self.tokenizer = tokenizer_from_files(ann.tokenizer_files)
        self._limits = RequestLimits(
            ann.vocab_size, ann.max_model_len, ann.block_size, ann.num_kv_blocks, RequestCaps(**ann.caps)
        )
        self.model_name, self.max_model_len = ann.model_name, ann.max_model_len
        if ann.engine_id != self._engine_id and self._engine_id is not None:
            log.warning("engine at %s is back as %s: serving again", self._address, ann.engine_id)
        self._engine_id = ann.engine_id
        self._stats = ann.stats
        self._error = None
        self._heard_at = time.monotonic()
        self._suspect_since = None
        if not self._alive:  # back (a new process, or a connection regained): what it may not have read
            recent = self._confirmations.recent()
            if recent is not None:
                self._say(Billed(*recent))
        self._alive = True

    def _lost(self, reason: str, graceful: bool = False) -> None:
        """Fail every request in flight: the engine is gone (or not the one that had them). An engine that
        said it is stopping (`graceful`) is logged at INFO: an operator's stop is not an error."""
        with self._lock:
            in_flight = len(self._streams)
        log.log(
            logging.INFO if graceful else logging.ERROR,
            "%s: failing the %d requests in flight",
            reason,
            in_flight,
        )
        self._error = reason
        with self._lock:
            self._lost_ids = list(self._streams)
        self._fail_all(EngineDeadError(reason))

    # -- on the event loop ------------------------------------------------------------------------
    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read on `loop` (the loop of the latest submit, once the previous one closed)."""
        if loop is self._loop or self._sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            return  # the loop that reads is still open; other loops get their outputs handed over
        self._loop = loop
        loop.add_reader(self._fd, self._read)
        self._tick = loop.call_soon(self._on_tick)  # also drains what came before the reader was added

    def _detach(self) -> None:
        loop, self._loop = self._loop, None
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)

    def _on_tick(self) -> None:
        """Heartbeat both ways: say we are here, and notice an engine that has gone quiet."""
        loop = self._loop
        if loop is None:
            return
        self._heard_at += self._stalls.stalled(time.monotonic())  # this loop's own stall is not silence
        self._read()
        if self._alive:
            self._judge_silence(time.monotonic() - self._heard_at)
        self._say(
            Ping() if self._alive else Hello(self.gateway_id, want_tokenizer=not hasattr(self, "tokenizer"))
        )
        self._tick = loop.call_later(self._tick_s, self._on_tick)

    def _judge_silence(self, silent_s: float) -> None:
        """Suspect past the heartbeat bound (said once per silence), lost past the lost bound."""
        bounds = self.silence
        if silent_s > bounds.lost_timeout_s:
            self._lost(f"no word from the engine at {self._address} for {bounds.lost_timeout_s:.2f}s")
        elif silent_s > bounds.heartbeat_timeout_s and self._suspect_since is None:
            self._suspect_since = self._heard_at
            what = "suspect: new requests go to other engines, those in flight keep running"
            log.warning("no word from the engine at %s for %.2fs: %s", self._address, silent_s, what)


def _runs_here(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
