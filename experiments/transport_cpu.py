"""The engine hand-off's transport alone: gateway-side CPU per round trip, ZeroMQ against loop-driven sockets.

    .venv/bin/python -m experiments.transport_cpu --rounds 4        # --clients 1: one output per report

`--clients` closed-loop asyncio clients on uvloop each send a 299-byte msgspec frame to an echo worker
process (a blocking loop; its CPU is not counted) and await a 280-byte output; the worker answers all it
has read in one report, as an engine iteration report carries several outputs. A loop pass's frames
leave together at its end (`call_soon`), as process_engine.py's `_send`/`_flush` does. In every round
(order reversed every other round): `zmq`, ipc PUSH/PULL read as engine/serving/boundary/zmq_channel.py does
(the PULL fd on `add_reader`, drained NOBLOCK until zmq.Again; a pass as one multipart message);
`stream`, a Unix stream socketpair under `create_unix_connection` and an asyncio.Protocol
(length-prefixed frames, one `transport.write` per pass); `seqpacket`, a SOCK_SEQPACKET socketpair on
`add_reader`, `recv` until EAGAIN (a pass in one packet). CPU is every thread of this process
(/proc/self/task/*/schedstat, ns; its third field, times run, counts wake-ups), less the idle rate of
the half second before; context switches are getrusage(RUSAGE_SELF), all threads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import zmq

_PREFIX = struct.Struct("<I")


class Ask(msgspec.Struct, array_like=True):  # a Submit-sized frame: 299 bytes encoded
    request_id: int
    tenant: str
    prompt: list[int]


class Output(msgspec.Struct, array_like=True):  # one request's share of a report: 280 bytes
    request_id: int
    token_ids: list[int]
    text: str
    finished: bool = True


class Report(msgspec.Struct, array_like=True):  # what one worker iteration sends back
    outputs: list[Output]


PROMPT = list(range(1000, 1095))  # 95 ids of 3 bytes each
ENCODE = msgspec.msgpack.Encoder().encode


def framed(frames: list[bytes]) -> bytes:
    """Frames as one length-prefixed run of bytes."""
    return b"".join(_PREFIX.pack(len(f)) + f for f in frames)


def unframe(buf: bytearray) -> list[bytes]:
    """Take every whole length-prefixed frame off the front of `buf`; a partial tail stays."""
    frames, at = [], 0
    while len(buf) - at >= 4:
        (n,) = _PREFIX.unpack_from(buf, at)
        if len(buf) - at - 4 < n:
            break
        frames.append(bytes(buf[at + 4 : at + 4 + n]))
        at += 4 + n
    del buf[:at]
    return frames


# -- the worker: a plain blocking loop in its own process ------------------------------------------
def worker(kind: str, arg: str) -> None:
    """Answer whatever has arrived with one report, until the gateway side goes away."""
    decode = msgspec.msgpack.Decoder(Ask).decode

    def report(frames: list[bytes]) -> bytes:
        return ENCODE(
            Report([Output(decode(f).request_id, list(range(20000, 20024)), "x" * 200) for f in frames])
        )

    if kind == "zmq":
        ctx = zmq.Context()
        inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        inbox.bind(arg.split(" ")[0])
        outbox.connect(arg.split(" ")[1])
        while True:
            frames = inbox.recv_multipart()
            with contextlib.suppress(zmq.Again):
                while True:
                    frames += inbox.recv_multipart(zmq.NOBLOCK)
            if b"" in frames:
                return
            outbox.send(report(frames))
    sock, buf = socket.socket(fileno=int(arg)), bytearray()
    while data := sock.recv(1 << 16):
        buf += data
        with contextlib.suppress(BlockingIOError):
            while more := sock.recv(1 << 16, socket.MSG_DONTWAIT):
                buf += more
        if frames := unframe(buf):
            sock.sendall(framed([report(frames)]))


# -- the gateway-like side -----------------------------------------------------------------------
class Channel(asyncio.Protocol):
    """Sends a pass's frames together at the pass's end; hands every report's outputs to their futures."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.pending, self.outgoing = loop, dict[int, asyncio.Future[Output]](), list[bytes]()
        self.reports, self.outputs, self.buf = 0, 0, bytearray()
        self._decode = msgspec.msgpack.Decoder(Report).decode

    def send(self, frame: bytes) -> None:
        if not self.outgoing:
            self.loop.call_soon(self.flush)
        self.outgoing.append(frame)

    def flush(self) -> None:
        frames, self.outgoing = self.outgoing, []
        self.write(frames)

    def deliver(self, frames: list[bytes]) -> None:
        for frame in frames:
            outs = self._decode(frame).outputs
            self.reports, self.outputs = self.reports + 1, self.outputs + len(outs)
            for out in outs:
                self.pending.pop(out.request_id).set_result(out)

    def spawn(self, arg: str, fd: int | None = None) -> subprocess.Popen[bytes]:
        """The echo worker, handed `fd` (its end of a socketpair)."""
        fds = () if fd is None else (fd,)
        return subprocess.Popen([sys.executable, __file__, "--worker", self.kind, arg], pass_fds=fds)

    kind = ""

    async def start(self) -> subprocess.Popen[bytes]:  # connect, and start the worker
        raise NotImplementedError

    def write(self, frames: list[bytes]) -> None: ...  # one send of the pass's frames

    def close(self) -> None: ...  # the worker ends when it sees this


class ZmqChannel(Channel):
    kind = "zmq"

    async def start(self) -> subprocess.Popen[bytes]:
        self.dir = tempfile.TemporaryDirectory(prefix="transport-cpu-")
        inbox, outbox = f"ipc://{self.dir.name}/in", f"ipc://{self.dir.name}/out"
        self.ctx = zmq.Context()
        self.out, self.inp = self.ctx.socket(zmq.PUSH), self.ctx.socket(zmq.PULL)
        self.out.setsockopt(zmq.SNDHWM, 0)
        self.out.connect(inbox)
        self.inp.bind(outbox)
        self.fd = int(self.inp.getsockopt(zmq.FD))
        self.loop.add_reader(self.fd, self.readable)
        return self.spawn(f"{inbox} {outbox}")

    def write(self, frames: list[bytes]) -> None:
        self.out.send_multipart(frames, zmq.NOBLOCK, copy=False)

    def readable(self) -> None:
        while True:
            try:
                self.deliver([self.inp.recv(zmq.NOBLOCK, copy=True)])
            except zmq.Again:
                return

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        self.out.send(b"")
        self.out.close(linger=1000)
        self.inp.close(linger=0)
        self.ctx.term()
        self.dir.cleanup()


class StreamChannel(Channel):
    kind = "stream"

    async def start(self) -> subprocess.Popen[bytes]:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            proc = self.spawn(str(theirs.fileno()), theirs.fileno())
        self.transport, _ = await self.loop.create_unix_connection(lambda: self, sock=mine)
        return proc

    def write(self, frames: list[bytes]) -> None:
        self.transport.write(framed(frames))  # written at once when nothing is queued: no thread

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.deliver(unframe(self.buf))

    def close(self) -> None:
        self.transport.close()


class SeqpacketChannel(Channel):
    kind = "seqpacket"

    async def start(self) -> subprocess.Popen[bytes]:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            proc = self.spawn(str(theirs.fileno()), theirs.fileno())
        self.sock.setblocking(False)
        self.loop.add_reader(self.sock.fileno(), self.readable)
        return proc

    def write(self, frames: list[bytes]) -> None:
        self.sock.send(framed(frames))  # 8 frames in flight never fill the socket's buffer here

    def readable(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while True:
                self.deliver(unframe(bytearray(self.sock.recv(1 << 16))))

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


CHANNELS = {c.kind: c for c in (ZmqChannel, StreamChannel, SeqpacketChannel)}


def sample() -> tuple[float, int, int, int, float]:
    """CPU seconds and times run of all threads (schedstat); voluntary and involuntary switches
    (getrusage); CPU seconds of ZeroMQ's I/O thread alone."""
    cpu, runs, io = 0, 0, 0
    for task in Path("/proc/self/task").iterdir():
        try:
            fields, name = (task / "schedstat").read_text().split(), (task / "comm").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        cpu, runs = cpu + int(fields[0]), runs + int(fields[2])
        io += int(fields[0]) if name.startswith("ZMQbg/IO") else 0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return cpu / 1e9, runs, ru.ru_nvcsw, ru.ru_nivcsw, io / 1e9


async def measure(kind: str, trips: int, clients: int) -> dict[str, float]:
    """Per round trip: µs of CPU less the idle rate, wake-ups, context switches, outputs per report."""
    loop = asyncio.get_running_loop()
    channel = CHANNELS[kind](loop)
    proc = await channel.start()
    ids, left = itertools.count(), [0]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            rid = next(ids)
            done: asyncio.Future[Output] = loop.create_future()
            channel.pending[rid] = done
            channel.send(ENCODE(Ask(rid, "tenant-a", PROMPT)))
            await done

    try:
        left[0] = clients * 50
        await asyncio.gather(*(client() for _ in range(clients)))
        idle = sample()
        await asyncio.sleep(0.5)
        idle_cpu, idle_runs = ((a - b) / 0.5 for a, b in zip(sample()[:2], idle[:2], strict=True))
        left[0], channel.reports, channel.outputs = trips, 0, 0
        before, t0 = sample(), time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        after, wall = sample(), time.perf_counter() - t0
    finally:
        channel.close()  # the worker ends on its end of file (zmq: on an empty frame)
        await loop.run_in_executor(None, proc.wait, 5)
    return {
        "us": (after[0] - before[0] - idle_cpu * wall) / trips * 1e6,
        "wakeups": (after[1] - before[1] - idle_runs * wall) / trips,
        "vcsw": (after[2] - before[2]) / trips,
        "ivcsw": (after[3] - before[3]) / trips,
        "io_us": (after[4] - before[4]) / trips * 1e6,
        "per_report": channel.outputs / max(channel.reports, 1),
    }


def show(m: dict[str, float]) -> str:
    return (f"{m['us']:6.1f} us/trip (I/O thread {m['io_us']:4.1f})  wake-ups {m['wakeups']:.2f}  cs vol {m['vcsw']:.2f} "
            f"invol {m['ivcsw']:.2f}  outputs/report {m['per_report']:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Parse flags, alternate the variants round by round, print each measurement and the medians."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--trips", type=int, default=6000, help="measured round trips per variant and round")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--variants", default="zmq,stream,seqpacket")
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)  # the echo worker's side: kind, address
    args = p.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    import uvloop

    kinds = args.variants.split(",")
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    got: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            got[kind].append(uvloop.run(measure(kind, args.trips, args.clients)))
            print(f"round {r} {kind:9}", show(got[kind][-1]), flush=True)
    for kind, runs in got.items():
        print(f"{kind:9} median ", show({key: statistics.median(m[key] for m in runs) for key in runs[0]}))
    for kind in kinds[1:]:
        ratios = [o["us"] / z["us"] for o, z in zip(got[kind], got[kinds[0]], strict=True)]
        print(f"{kind}/{kinds[0]} by round:", " ".join(f"{x:.2f}" for x in ratios),
              f"(median {statistics.median(ratios):.2f})")  # fmt: skip
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
