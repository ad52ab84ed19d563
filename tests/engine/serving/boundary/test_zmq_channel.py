"""The ZeroMQ engine boundary: order, frames that do not decode, the worker's goodbye, no leaked files."""

from __future__ import annotations

import asyncio
import os
import queue
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from engine import EngineConfig, ProcessEngine, RequestMeta, SamplingParams
from engine.core.sampling_params import SamplingParams as Params
from engine.serving.boundary.messages import SetWeight, Submit, WorkerFailed
from engine.serving.boundary.zmq_channel import ZmqFrontChannel, encode_frame

EOF_MARK = "eof"
GARBAGE = [b"\xc1\xff not msgpack", msgspec.msgpack.encode(["NoSuchMessage", 1, 2]), b"", b"\x93"]


def rogue(addr: str) -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]]:
    """A third party that connects to a boundary socket and writes whatever it likes."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(addr)
    return ctx, sock


@pytest.fixture()
def channel() -> Iterator[ZmqFrontChannel]:
    ch = ZmqFrontChannel(EOF_MARK)
    yield ch
    ch.close()


def test_messages_arrive_in_order_both_ways_and_the_goodbye_reads_as_eof(channel: ZmqFrontChannel) -> None:
    inbox, outbox = channel.worker_link().open()
    sent = [
        Submit(f"r{i}", list(range(i % 50)), Params(max_tokens=i + 1), RequestMeta(tenant_id=f"t{i}"))
        for i in range(300)
    ]
    for msg in sent:
        channel.send(msg)
    got = [inbox.get(timeout=5) for _ in sent]
    assert [m.request_id for m in got] == [m.request_id for m in sent]
    assert got[-1].params.max_tokens == 300 and got[-1].meta.tenant_id == "t299"
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.01)
    outbox.send(WorkerFailed("first"))
    inbox.close()
    outbox.close()  # sends the goodbye
    assert channel.get(timeout=5) == WorkerFailed("first")
    assert channel.get(timeout=5) == EOF_MARK
    assert channel.take_ready() == [EOF_MARK]


def test_frames_that_do_not_decode_are_dropped_and_the_next_one_arrives(channel: ZmqFrontChannel) -> None:
    inbox, outbox = channel.worker_link().open()
    ctx_out, to_front = rogue(channel.from_worker_addr)
    ctx_in, to_worker = rogue(channel.to_worker_addr)
    try:
        for frame in GARBAGE:
            to_front.send(frame)
            to_worker.send(frame)
        to_front.send(msgspec.msgpack.encode(SetWeight("t", 2.0, None)))  # a valid kind, the wrong direction
        to_front.send(msgspec.msgpack.encode(WorkerFailed("after the garbage")))
        channel.send(SetWeight("t", 3.0, 1))
        assert channel.get(timeout=5) == WorkerFailed("after the garbage")
        assert inbox.get(timeout=5) == SetWeight("t", 3.0, 1)
    finally:
        to_front.close()
        to_worker.close()
        ctx_out.term()
        ctx_in.term()
        inbox.close()
        outbox.close()


def test_frames_sent_together_arrive_one_by_one_in_order_among_single_sends(channel: ZmqFrontChannel) -> None:
    """A loop pass's messages leave as one multipart message; the worker reads them as if sent singly."""
    inbox, outbox = channel.worker_link().open()
    try:
        channel.send(SetWeight("before", 1.0, None))
        channel.send_frames([encode_frame(SetWeight(f"t{i}", float(i), None)) for i in range(5)])
        channel.send_frames([encode_frame(SetWeight("alone", 2.0, None))])
        channel.send(SetWeight("after", 3.0, None))
        got = [inbox.get(timeout=5).tenant_id for _ in range(8)]
        assert got == ["before", "t0", "t1", "t2", "t3", "t4", "alone", "after"]
        with pytest.raises(queue.Empty):
            inbox.get(timeout=0.01)
    finally:
        inbox.close()
        outbox.close()


def test_close_removes_the_sockets_files_and_a_closed_channel_refuses_sends() -> None:
    ch = ZmqFrontChannel(EOF_MARK)
    assert os.path.isdir(ch.dir)
    ch.close()
    ch.close()  # idempotent
    assert not os.path.exists(ch.dir)
    with pytest.raises(BrokenPipeError):
        ch.send(SetWeight("t", 1.0, None))
    with pytest.raises(BrokenPipeError):
        ch.send_frames([encode_frame(SetWeight("t", 1.0, None))])


def test_garbage_on_a_live_engines_sockets_costs_no_request() -> None:
    engine = ProcessEngine(EngineConfig(num_kv_blocks=64, max_num_batched_tokens=64))
    engine.start()
    assert isinstance(engine._channel, ZmqFrontChannel)
    ch = engine._channel
    ctx_out, to_front = rogue(ch.from_worker_addr)
    ctx_in, to_worker = rogue(ch.to_worker_addr)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def scenario() -> int:
        stream = engine.generate([1, 2, 3], greedy, RequestMeta(), "g")
        first = await anext(stream)
        for frame in GARBAGE:  # mid-stream, into both directions
            to_front.send(frame)
            to_worker.send(frame)
        outs = [first] + [out async for out in stream]
        assert outs[-1].finished
        again = [out async for out in engine.generate([4, 5], greedy, RequestMeta(), "after")]
        assert again[-1].finished and len(again[-1].token_ids) == 8
        return len(outs[-1].token_ids)

    try:
        assert asyncio.run(asyncio.wait_for(scenario(), timeout=60)) == 8
        assert engine.is_alive
    finally:
        to_front.close()
        to_worker.close()
        ctx_out.term()
        ctx_in.term()
        engine.shutdown(timeout_s=10)
    assert not os.path.exists(ch.dir)
