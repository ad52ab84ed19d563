"""KV blocks from a prefill engine to a decode engine over ZeroMQ (CurveZMQ with a cluster key).

Pull, not push (as vLLM's NIXL connector and SGLang's disaggregation do it): the decode engine asks for a
request's KV when its Submit arrives, so the prefill engine never sends to an engine that is not ready,
and a decode engine that dies simply never asks; the prefill engine then frees the held blocks after
`kv_hold_timeout_s`. A prefill engine that dies leaves the pull unanswered; the decode engine fails the
request (a retryable EngineDeadError at the gateway) after `kv_pull_timeout_s`.

- `KVServer` (prefill engine): a ROUTER on a port of its own (the announce names it), on a thread of its
  own. `PullKV(request_id)` is answered with one multipart message: a `KVHeader`, then K and V of every
  block-pool layer, one frame each (host copies of the held blocks, sent without another copy). The
  blocks are released to the engine loop once sent, or when they expire unpulled.
- `KVPuller` (decode engine): one DEALER per prefill engine, on a thread of its own; what arrives (or
  the reason nothing did) goes to the engine loop as `engine.serving.disagg.KVArrived`.

With a cluster key both sockets use the deployment's key pairs (engine/serving/remote/curve.py): the KV server is
a CURVE server admitting the deployment's gateway key, which decode engines present as clients.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import torch
import zmq
from zmq.auth.thread import ThreadAuthenticator

from engine.serving.disagg import KVArrived, KVBlocks
from engine.serving.remote.curve import ClusterKey, connect_securely, serve_securely

log = logging.getLogger("fairserve.engine.kv")
_TICK_MS = 10
_ENCODER = msgspec.msgpack.Encoder()


class PullKV(msgspec.Struct, tag=True, array_like=True):
    """A decode engine asks for a request's KV."""

    request_id: str


class KVHeader(msgspec.Struct, tag=True, array_like=True):
    """The answer's first frame; 2 frames (K, V) per layer follow unless `error` says why not."""

    request_id: str
    error: str = ""
    num_tokens: int = 0
    dtype: str = ""
    shape: list[int] = []  # of each frame: [blocks, block_size, kv_heads, head_dim]


_HEADER = msgspec.msgpack.Decoder(KVHeader)
_PULL = msgspec.msgpack.Decoder(PullKV)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


class KVServer:
    """A prefill engine's held blocks, served to the decode engines that pull them (module docstring)."""

    def __init__(
        self,
        host: str,
        read_blocks: Callable[[list[int]], KVBlocks],
        release: Callable[[str], None],
        hold_timeout_s: float,
        cluster_key: ClusterKey | None = None,
    ) -> None:
        self._read = read_blocks
        self._release = release
        self._hold_timeout_s = hold_timeout_s
        self._lock = threading.Lock()
        self._held: dict[str, tuple[list[int], int, float]] = {}  # id -> (block ids, tokens, expiry)
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._auth: ThreadAuthenticator | None = None
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if cluster_key is not None:
            self._auth = serve_securely(self._ctx, self._sock, cluster_key)
        self._sock.bind(f"tcp://{host}:*")
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self.served = 0  # pulls answered with blocks
        self.expired = 0  # holds given up unpulled
        self._thread = threading.Thread(target=self._run, name="fairserve-kv-server", daemon=True)
        self._thread.start()

    def offer(self, request_id: str, block_ids: list[int], num_tokens: int) -> None:
        """Hold these blocks for a pull (thread-safe; the loop calls it at the hand-off)."""
        with self._lock:
            self._held[request_id] = (block_ids, num_tokens, time.monotonic() + self._hold_timeout_s)

    def close(self) -> None:
        """Stop the thread and release the socket."""
        self._stop.set()
        self._thread.join(5.0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._sock.poll(_TICK_MS, zmq.POLLIN):
                    self._answer()
                self._expire(time.monotonic())
        except Exception:
            log.exception("the KV server's thread died")
        finally:
            self._sock.close(linger=0)

    def _answer(self) -> None:
        while True:
            try:
                peer, frame = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                rid = _PULL.decode(frame).request_id
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.error("dropped a KV request that does not decode (%d bytes)", len(frame))
                continue
            with self._lock:
                held = self._held.pop(rid, None)
            if held is None:
                answer = KVHeader(rid, "no KV is held for this request (expired, or never here)")
                self._sock.send_multipart([peer, _ENCODER.encode(answer)])
                continue
            block_ids, num_tokens, _ = held
            try:
                blocks = self._read(block_ids)
            finally:
                self._release(rid)
            k0 = blocks[0][0]
            header = KVHeader(rid, "", num_tokens, str(k0.dtype), list(k0.shape))
            frames: list[Any] = [t.contiguous().view(torch.uint8).numpy() for kv in blocks for t in kv]
            self._sock.send_multipart([peer, _ENCODER.encode(header), *frames], copy=False)
            self.served += 1

    def _expire(self, now: float) -> None:
        with self._lock:
            gone = [rid for rid, (_, _, expiry) in self._held.items() if expiry <= now]
            for rid in gone:
                del self._held[rid]
        for rid in gone:
            log.warning("KV held for %s was not pulled within %.1f s: freed", rid, self._hold_timeout_s)
            self.expired += 1
            self._release(rid)


class KVPuller:
    """A decode engine's pulls from prefill engines' KV servers (module docstring)."""

    def __init__(
        self,
        arrived: Callable[[KVArrived], None],
        timeout_s: float,
        cluster_key: ClusterKey | None = None,
    ) -> None:
        self._arrived = arrived
        self._timeout_s = timeout_s
        self._key = cluster_key
        self._asks: queue.Queue[tuple[str, str]] = queue.Queue()
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._wake_addr = f"inproc://fairserve-kv-puller-{id(self)}"
        self._wake_in = self._ctx.socket(zmq.PULL)
        self._wake_in.bind(self._wake_addr)
        self._wake = self._ctx.socket(zmq.PUSH)  # used by the caller of fetch (the engine loop) only
        self._wake.connect(self._wake_addr)
        self._sources: dict[str, zmq.Socket[Any]] = {}
        self._waiting: dict[str, tuple[str, float]] = {}  # request id -> (source, deadline)
        self._asked: dict[str, float] = {}  # request id -> when the pull was sent
        self.transfers = 0  # pulls answered with KV, their seconds (ask to last frame) and bytes
        self.transfer_s = 0.0
        self.transfer_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fairserve-kv-puller", daemon=True)
        self._thread.start()

    def fetch(self, source: str, request_id: str) -> None:
        """Pull `request_id`'s KV from the KV server at `source`; the result goes to `arrived`."""
        self._asks.put((source, request_id))
        self._wake.send(b"")

    def close(self) -> None:
        """Stop the thread and release the sockets."""
        self._stop.set()
        self._thread.join(5.0)
        self._wake.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                poller = zmq.Poller()
                poller.register(self._wake_in, zmq.POLLIN)
                for sock in self._sources.values():
                    poller.register(sock, zmq.POLLIN)
                events = dict(poller.poll(_TICK_MS))
                if self._wake_in in events:
                    self._ask()
                for source, sock in list(self._sources.items()):
                    if sock in events:
                        self._receive(source, sock)
                self._expire(time.monotonic())
        except Exception:
            log.exception("the KV puller's thread died")
        finally:
            self._wake_in.close(linger=0)
            for sock in self._sources.values():
                sock.close(linger=0)

    def _socket(self, source: str) -> zmq.Socket[Any]:
        sock = self._sources.get(source)
        if sock is None:
            sock = self._sources[source] = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            if self._key is not None:
                connect_securely(sock, self._key)
            sock.connect(source)
        return sock

    def _ask(self) -> None:
        while True:
            try:
                self._wake_in.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        while True:
            try:
                source, rid = self._asks.get_nowait()
            except queue.Empty:
                return
            now = time.monotonic()
            self._waiting[rid] = (source, now + self._timeout_s)
            self._asked[rid] = now
            self._socket(source).send(_ENCODER.encode(PullKV(rid)))

    def _receive(self, source: str, sock: zmq.Socket[Any]) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                header = _HEADER.decode(frames[0].buffer)
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.error("dropped a KV answer from %s that does not decode", source)
                continue
            if self._waiting.pop(header.request_id, None) is None:
                continue  # given up on already
            arrived = _decode(source, header, frames[1:])
            if arrived.blocks is not None:
                self.transfers += 1
                self.transfer_s += time.monotonic() - self._asked.pop(header.request_id, time.monotonic())
                self.transfer_bytes += sum(len(f.buffer) for f in frames[1:])
            self._asked.pop(header.request_id, None)
            self._arrived(arrived)

    def _expire(self, now: float) -> None:
        late = [rid for rid, (_, deadline) in self._waiting.items() if deadline <= now]
        for rid in late:
            source, _ = self._waiting.pop(rid)
            self._asked.pop(rid, None)
            error = f"no answer from the prefill engine at {source} within {self._timeout_s:.1f} s"
            self._arrived(KVArrived(rid, None, error=error))


def _decode(source: str, header: KVHeader, frames: list[Any]) -> KVArrived:
    """The KV of one answer as host tensors (they keep the frames' buffers), or why it is unusable."""
    rid = header.request_id
    if header.error:
        return KVArrived(rid, None, error=f"the prefill engine at {source}: {header.error}")
    try:
        dtype = _dtype(header.dtype)
        tensors = [
            torch.frombuffer(f.buffer, dtype=torch.uint8).view(dtype).view(header.shape) for f in frames
        ]
    except (ValueError, RuntimeError, TypeError) as exc:
        return KVArrived(rid, None, error=f"the prefill engine at {source} sent unreadable KV: {exc}")
    if not tensors or len(tensors) % 2:
        return KVArrived(rid, None, error=f"the prefill engine at {source} sent {len(tensors)} KV frames")
    return KVArrived(rid, list(zip(tensors[::2], tensors[1::2], strict=True)), header.num_tokens)
