"""`EngineServer`: one engine loop serving many gateways over ZeroMQ TCP.

Socket pattern: one ROUTER socket on the engine, one DEALER per gateway (as vLLM's data-parallel engine
core does). A ROUTER knows every connected peer by its identity, so the outputs of a request go back to
the gateway that submitted it and to no other, while stats, the heartbeat, go to all of them; a DEALER
sends and receives without a request/reply lockstep, so submits and aborts stream in while outputs stream
out. PUSH/PULL (the local process engine's ipc pattern, engine/serving/boundary/zmq_channel.py) has one peer per
direction and no way to address a reply; PUB/SUB would send every gateway every output and drop
messages for a slow subscriber without telling anyone.

Threads: the engine loop (engine/serving/boundary/worker.py `EngineLoop`, the same loop the local worker runs) on the
thread that calls `run()`, and the socket thread (engine/serving/remote/gateways.py) that owns the ROUTER,
answers handshakes, sends the heartbeat and reaps silent gateways. They meet at a `queue.Queue` (gateway
-> loop) and an inproc PUSH/PULL pair (loop -> gateways), so neither waits on the other's work.

What a gateway sends is trusted as a gateway (the engine has no tenant keys; run it on a private
network), but two gateways cannot step on each other: a request id already live is refused, and only the
gateway that submitted a request can abort it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import torch
import zmq
from zmq.auth.thread import ThreadAuthenticator

from engine.config import EngineConfig
from engine.core.outputs import EngineStats, OutputDelta
from engine.serving.boundary.messages import Abort, IterationReport, StopLoop, Submit, SubmitFailed
from engine.serving.boundary.worker import EngineLoop, default_worker_threads
from engine.serving.llm_engine import LLMEngine
from engine.serving.remote.accounting import ProducedBook
from engine.serving.remote.address import bindable
from engine.serving.remote.curve import ClusterKey, serve_securely
from engine.serving.remote.gateways import QUIT, GatewayLink, PeerLost
from engine.serving.remote.messages import TOKENIZER_FILES, Announce, AskProduced, Billed, Produced

log = logging.getLogger("fairserve.engine.remote")
_ENCODER = msgspec.msgpack.Encoder()
# Frames the socket thread may queue for one gateway before it drops (that gateway then times us out).
_SNDHWM = 10_000
_CLOSE_LINGER_MS = 1000  # the final outputs and the goodbye get this long to leave at stop


class EngineServer:
    """Build an engine, bind `listen`, and serve its loop to every gateway that connects."""

    def __init__(
        self,
        config: EngineConfig,
        listen: str,
        gateway_timeout_s: float,
        grace_period_s: float,
        cluster_key: ClusterKey | None = None,
        produced_path: Path | None = None,
    ) -> None:
        self.config = config
        self.cluster_key = (
            cluster_key  # None: the port admits anyone who reaches it (engine/serving/remote/curve.py)
        )
        self.listen = listen
        self.gateway_timeout_s = gateway_timeout_s
        self.grace_period_s = grace_period_s
        self.engine_id = uuid.uuid4().hex  # per process start: a gateway tells a restarted engine by it
        self.address = ""  # the resolved tcp://HOST:PORT, once started
        self._engine: LLMEngine | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._router: zmq.Socket[Any] | None = None
        self._link: GatewayLink | None = None
        self._auth: ThreadAuthenticator | None = None
        self._items: queue.Queue[Any] = queue.Queue()
        self._owners: dict[str, bytes] = {}  # live request id -> the gateway that submitted it
        # What was produced, until a gateway bills it (accounting.py); on disk when given a path.
        self.produced = ProducedBook(produced_path)
        self._outbox_addr = f"inproc://fairserve-engine-{self.engine_id}"
        self._push: zmq.Socket[Any] | None = None
        self._push_lock = threading.Lock()  # one sender on the PUSH socket at a time
        self._tokenizer_files: dict[str, str] = {}
        self._draining = threading.Event()
        self.stopped = threading.Event()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Build the engine and bind; returns when gateways can connect (`address` is then set)."""
        # Bound before the engine is built, so a taken address fails in milliseconds, not after the model
        # loads; a gateway that connects meanwhile waits in the socket's queue for its announce.
        ctx = self._ctx = zmq.Context()
        router = self._router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a gateway that reconnects takes its identity over
        router.setsockopt(zmq.SNDHWM, _SNDHWM)
        router.setsockopt(zmq.RCVHWM, 0)
        router.setsockopt(zmq.LINGER, 0)
        try:
            if self.cluster_key is not None:
                self._auth = serve_securely(ctx, router, self.cluster_key)
            router.bind(bindable(self.listen))
            self.address = router.getsockopt_string(zmq.LAST_ENDPOINT)
            # As the local worker: every core but one for torch, which the socket thread (and a gateway on
            # the same host) keeps; torch's default, every core, starved both on the 2-core test VM.
            torch.set_num_threads(default_worker_threads())
            engine = self._engine = LLMEngine(self.config)
        except BaseException:
            router.close(linger=0)
            self._stop_auth()
            ctx.term()
            raise
        root = Path(engine.loaded.path)
        self._tokenizer_files = {n: (root / n).read_text() for n in TOKENIZER_FILES if (root / n).is_file()}
        self._link = GatewayLink(
            ctx,
            router,
            self._outbox_addr,
            self._items,
            self._announce,
            self.gateway_timeout_s,
            self._account,
        )
        self._link.latest_stats = engine.stats()
        self._link.start()

    def run(self) -> None:
        """Serve on this thread until `stop()`, `drain()`, or SIGTERM/SIGINT (on the main thread: drain)."""
        engine, link, ctx = self._engine, self._link, self._ctx
        if engine is None or link is None or ctx is None:
            raise RuntimeError("EngineServer.run() before start()")
        push = self._push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 0)
        push.connect(self._outbox_addr)
        restore = self._install_signals()
        inbox = GatewayInbox(self._items, self._owners, self._reply, self._drained, self.produced)
        try:
            self._make_loop(engine, inbox).run()
        finally:
            self._close(push, link, ctx, engine)
            for signum, handler in restore.items():
                signal.signal(signum, handler)
            log.info("engine %s stopped", self.engine_id)
            self.stopped.set()

    def _drained(self) -> bool:
        """Draining, and nothing but live requests keeps the loop: it stops once none is left."""
        return self._draining.is_set()

    def _make_loop(self, engine: LLMEngine, inbox: GatewayInbox) -> EngineLoop:
        """The loop this server runs (engine/serving/remote/roles.py runs a prefill or decode engine's)."""
        return EngineLoop(engine, inbox, self._publish)

    def stop(self) -> None:
        """End now: live requests end as cancelled (reason "shutdown"). Thread-safe."""
        self._items.put(StopLoop())

    def drain(self, grace_s: float | None = None) -> None:
        """Refuse new requests, let live ones finish for `grace_s` (default grace_period_s), then stop. Thread-safe."""
        if self._draining.is_set():
            return
        self._draining.set()
        if self._link is not None:
            self._link.draining = True
        self._items.put(_WAKE)  # an idle loop waiting on its queue looks again and stops
        timer = threading.Timer(self.grace_period_s if grace_s is None else grace_s, self.stop)
        timer.daemon = True
        timer.start()

    def _install_signals(self) -> dict[int, Any]:
        """SIGTERM and SIGINT drain; a second one stops at once. Only the main thread may set handlers."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: Any) -> None:
            if self._draining.is_set():
                self.stop()
            else:
                log.warning("signal %d: draining (a second signal stops at once)", signum)
                self.drain()

        return {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

    def _close(
        self, push: zmq.Socket[Any], link: GatewayLink, ctx: zmq.Context[Any], engine: LLMEngine
    ) -> None:
        """Say goodbye to every gateway (after the final outputs), then release sockets and the engine."""
        try:
            with self._push_lock:
                push.send_multipart([QUIT, b""])
            link.join(5.0)
        finally:
            push.close(linger=_CLOSE_LINGER_MS)
            if self._router is not None:
                self._router.close(linger=_CLOSE_LINGER_MS)
            self._stop_auth()
            ctx.term()
            engine.close()

    def _stop_auth(self) -> None:
        """Stop the ZAP thread, whose socket would otherwise keep `ctx.term()` waiting."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    # -- what the loop publishes ------------------------------------------------------------------
    def _announce(self, want_tokenizer: bool) -> Announce:
        """Called on the socket thread: the engine's fixed figures and its latest stats."""
        engine, link = self._engine, self._link
        assert engine is not None and link is not None
        return Announce(
            self.engine_id,
            engine.model_name,
            engine.max_model_len,
            engine.vocab_size,
            engine.pool.block_size,
            engine.pool.num_blocks,
            self.config.caps.model_dump(),
            _without_tenants(link.latest_stats),
            self._tokenizer_files if want_tokenizer else {},
        )

    def _account(self, msg: Billed | AskProduced, live: list[bytes]) -> Produced | None:
        """On the socket thread: forget billed records, or report totals and dead gateways' records."""
        if isinstance(msg, Billed):
            self.produced.billed(msg.request_ids, msg.completion_tokens)
            return None
        orphans = self.produced.orphans(live, msg.orphans_after_s) if msg.orphans_after_s >= 0 else []
        return Produced(self.engine_id, self.produced.totals(msg.since), orphans, self.produced.unconfirmed())

    def _publish(self, msg: Any) -> None:
        """Each gateway gets the outputs of its own requests; every gateway gets the stats and traces."""
        if isinstance(msg, SubmitFailed):
            self.produced.refused(msg.request_id)
            owner = self._owners.pop(msg.request_id, None)
            if owner is not None:
                self._tell(owner, _ENCODER.encode(msg))
            return
        if not isinstance(msg, IterationReport):
            return
        link = self._link
        assert link is not None
        link.latest_stats = msg.stats
        by_owner: dict[bytes, list[OutputDelta]] = {}
        for delta in msg.outputs:
            rid = delta.request_id
            owner = self._owners.pop(rid, None) if delta.finished else self._owners.get(rid)
            if delta.finished:
                self.produced.finished(delta)
            if owner is not None:
                by_owner.setdefault(owner, []).append(delta)
        common: bytes | None = None
        for peer in by_owner.keys() | set(link.peers()):
            outputs = by_owner.get(peer)
            if outputs:
                self._tell(peer, _ENCODER.encode(IterationReport(outputs, msg.stats, msg.traces)))
                continue
            if common is None:
                common = _ENCODER.encode(IterationReport([], msg.stats, msg.traces))
            self._tell(peer, common)

    def _reply(self, peer: bytes, msg: Any) -> None:
        self._tell(peer, _ENCODER.encode(msg))

    def _tell(self, peer: bytes, frame: bytes) -> None:
        push = self._push
        assert push is not None
        with self._push_lock:
            push.send_multipart([peer, frame], copy=False)


class _Wake(msgspec.Struct):
    """Put on the loop's queue so a loop idle on it looks at the drain flag again."""


_WAKE = _Wake()


class GatewayInbox:
    """The loop's Inbox over the socket thread's queue: remembers who owns each request, checks aborts.

    Also where a drain ends: an idle loop asks for its next message, and a draining server with nothing
    live answers StopLoop.
    """

    def __init__(
        self,
        items: queue.Queue[Any],
        owners: dict[str, bytes],
        reply: Callable[[bytes, Any], None],
        draining: Callable[[], bool],
        produced: ProducedBook | None = None,
    ) -> None:
        self._items = items
        self._produced = produced
        self._owners = owners
        self._reply = reply
        self._draining = draining
        self._pending: collections.deque[Any] = collections.deque()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next message for the loop; raises queue.Empty when none came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            if self._draining() and not self._owners and self._items.empty():
                return StopLoop()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._take(self._items.get(block, left))
        return self._pending.popleft()

    def get_nowait(self) -> Any:
        """The next message already there; raises queue.Empty."""
        return self.get(block=False)

    def _take(self, item: Any) -> None:
        if isinstance(item, PeerLost):
            lost = [rid for rid, owner in self._owners.items() if owner == item.peer]
            self._pending.extend(Abort(rid, "gateway_lost") for rid in lost)
            return
        if isinstance(item, (StopLoop, _Wake)):
            if isinstance(item, StopLoop):
                self._pending.append(item)
            return
        peer, msg = item
        if isinstance(msg, Submit):
            if msg.request_id in self._owners:
                self._reply(
                    peer,
                    SubmitFailed(
                        msg.request_id,
                        "DuplicateRequestError",
                        f"request id {msg.request_id!r} is already live",
                        "request_id",
                    ),
                )
                return
            self._owners[msg.request_id] = peer
            if self._produced is not None:
                self._produced.opened(msg.request_id, peer, msg.meta)
        elif isinstance(msg, Abort) and self._owners.get(msg.request_id) != peer:
            return  # not this gateway's request (or already over)
        self._pending.append(msg)


def _without_tenants(stats: EngineStats) -> EngineStats:
    """The stats a Hello is answered with: nothing about tenants (who they are, what they run), which a
    peer gets only with the iteration reports of the requests it submits, once it has joined."""
    return dataclasses.replace(
        stats, waiting_by_tenant={}, running_by_tenant={}, service={}, weights={}, backlogged_s={}
    )
