"""The engine server's socket thread: one ROUTER socket that every gateway's DEALER connects to.

It owns the TCP socket (a ZeroMQ socket is not thread-safe, so nothing else touches it) and does all of
the server's talking that must not wait on the engine loop:

- the handshake (Hello -> Announce) and the peer table of gateways, by their DEALER identity;
- the heartbeat: a stats report to every gateway that has been sent nothing for `HEARTBEAT_S`. It runs
  here, not in the loop, because one long iteration (a big prefill on a GPU, anything on a CPU) would
  otherwise read as a dead engine to every gateway; torch releases the GIL during the forward, so this
  thread gets its turn. What it proves is that the process and its socket live; a hung loop shows as
  stats whose `iterations` stop advancing;
- reaping a gateway silent for `gateway_timeout_s`: its live requests are aborted (reason
  "gateway_lost"), because a dead gateway must not keep burning engine time;
- forwarding what the loop publishes: the loop thread sends [gateway identity, frame] pairs over an
  inproc PUSH socket, and this thread puts them on the ROUTER.

Requests for the loop go onto a `queue.Queue` as (gateway identity, message) pairs (server.py turns
them back into the loop's messages and remembers which gateway owns each request).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from engine.core.outputs import EngineStats
from engine.serving.boundary.messages import IterationReport, Submit, SubmitFailed, WorkerExiting
from engine.serving.remote.liveness import StallClock
from engine.serving.remote.messages import Announce, AskProduced, Billed, Hello, Ping, ToServer

log = logging.getLogger("fairserve.engine.remote")
HEARTBEAT_S = 0.05  # the longest a connected gateway goes without a message from the engine
_TICK_S = 0.01  # how often the thread looks at the clocks when no socket wakes it
_REAP_EVERY_S = 0.1
# After the goodbye the thread keeps reading the gateways this long before the socket closes. Closing a TCP
# socket with unread bytes in its receive buffer (a gateway's Ping that came in meanwhile) sends a reset, and
# a reset makes the gateway's kernel drop what it has received and not yet handed to ZeroMQ: the request's
# final output and the goodbye itself. Reading on, and giving the gateways time to take in the last frames
# first, turns that close into an orderly one.
_GOODBYE_READ_S = 0.3
QUIT = b"!quit"  # the inproc control frames the loop thread sends: stop after saying goodbye
_ENCODER = msgspec.msgpack.Encoder()


class PeerLost(msgspec.Struct):
    """Put on the loop's queue: abort every live request of this gateway (it went silent)."""

    peer: bytes


class GatewayLink:
    """The ROUTER socket, its peer table and heartbeats, on a thread of its own (see the module docstring)."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        router: zmq.Socket[Any],
        outbox_addr: str,
        inbox: queue.Queue[Any],
        announce: Callable[[bool], Announce],
        gateway_timeout_s: float,
        account: Callable[[Billed | AskProduced, list[bytes]], Any] | None = None,
    ) -> None:
        self._router = router
        self._pull = ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(outbox_addr)
        self._inbox = inbox
        self._announce = announce
        self._account = account  # answers Billed/AskProduced here: they need no engine loop
        self._gateway_timeout_s = gateway_timeout_s
        self._decoder = msgspec.msgpack.Decoder(ToServer)
        self._lock = threading.Lock()
        self._heard: dict[bytes, float] = {}  # gateway identity -> when it last sent anything
        self._sent: dict[bytes, float] = {}  # gateway identity -> when it was last sent anything
        self.latest_stats = EngineStats()
        self.draining = False
        self._reaped_at = 0.0
        self._stalls = StallClock()
        self._thread = threading.Thread(target=self._run, name="fairserve-engine-io", daemon=True)

    def start(self) -> None:
        """Serve the socket on the thread."""
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait for the thread to end (after the loop sent QUIT)."""
        self._thread.join(timeout_s)

    def peers(self) -> list[bytes]:
        """The gateways connected now."""
        with self._lock:
            return list(self._heard)

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll(int(_TICK_S * 1000)))
                if self._pull in events and not self._forward():
                    return
                if self._router in events:
                    self._receive()
                self._keep_time(time.monotonic())
        except Exception:  # the engine is unreachable without this thread: say so loudly
            log.exception("the engine's socket thread died")
        finally:
            self._pull.close(linger=0)

    def _forward(self) -> bool:
        """Put what the loop published on the ROUTER; False after QUIT (the goodbye is sent first)."""
        now = time.monotonic()
        while True:
            try:
                peer, frame = self._pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return True
            name = peer.bytes
            if name == QUIT:
                self._broadcast(_ENCODER.encode(WorkerExiting()), now)
                self._read_until_closed(now + _GOODBYE_READ_S)
                return False
            self._send(name, frame, now)

    def _read_until_closed(self, until: float) -> None:
        """Read and drop what gateways send until `until`, so the socket closes with nothing unread."""
        while (left := until - time.monotonic()) > 0:
            if self._router.poll(max(1, int(left * 1000)), zmq.POLLIN):
                with contextlib.suppress(zmq.Again):
                    while True:
                        self._router.recv_multipart(zmq.NOBLOCK)

    def _send(self, peer: bytes, frame: Any, now: float) -> None:
        try:
            self._router.send_multipart([peer, frame], zmq.NOBLOCK, copy=False)
        except zmq.Again:  # this gateway is a full high-water mark behind: it will time the engine out
            return
        self._sent[peer] = now

    def _broadcast(self, frame: bytes, now: float) -> None:
        for peer in self.peers():
            self._send(peer, frame, now)

    def _receive(self) -> None:
        now = time.monotonic()
        while True:
            try:
                peer, frame = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = self._decoder.decode(frame)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # belongs to nobody: drop it
                log.error(
                    "dropped a frame from a gateway that does not decode (%d bytes): %s", len(frame), exc
                )
                continue
            with self._lock:
                known = peer in self._heard
                self._heard[peer] = now
            if isinstance(msg, Hello) or not known:
                # A gateway we do not know (new, or one we reaped) learns who we are before anything else.
                want = isinstance(msg, Hello) and msg.want_tokenizer
                self._send(peer, _ENCODER.encode(self._announce(want)), now)
            if isinstance(msg, (Hello, Ping)):
                continue
            if isinstance(msg, (Billed, AskProduced)):
                answer = self._account(msg, self.peers()) if self._account is not None else None
                if answer is not None:
                    self._send(peer, _ENCODER.encode(answer), now)
                continue
            if isinstance(msg, Submit) and self.draining:
                refusal = SubmitFailed(msg.request_id, "EngineDeadError", "the engine is draining", None)
                self._send(peer, _ENCODER.encode(refusal), now)
                continue
            self._inbox.put((peer, msg))

    def _keep_time(self, now: float) -> None:
        """Heartbeat every gateway sent nothing lately; reap the ones silent too long (silent while this
        thread ran: a stall of its own moves every gateway's last word forward by the stall)."""
        stalled = self._stalls.stalled(now)
        if stalled:
            with self._lock:
                self._heard = {p: min(heard + stalled, now) for p, heard in self._heard.items()}
        quiet = [p for p in self.peers() if now - self._sent.get(p, 0.0) >= HEARTBEAT_S]
        if quiet:
            frame = _ENCODER.encode(IterationReport([], self.latest_stats, []))
            for peer in quiet:
                self._send(peer, frame, now)
        if now - self._reaped_at < _REAP_EVERY_S:
            return
        self._reaped_at = now
        with self._lock:
            silent = [p for p, heard in self._heard.items() if now - heard > self._gateway_timeout_s]
            for peer in silent:
                del self._heard[peer]
                self._sent.pop(peer, None)
        for peer in silent:
            log.warning(
                "gateway %s silent for over %.1f s: aborting its requests",
                peer.hex(),
                self._gateway_timeout_s,
            )
            self._inbox.put(PeerLost(peer))
