"""The framed pipe between the gateway and the engine worker: order, back-pressure without blocking, EOF."""

from __future__ import annotations

import asyncio
import os
import queue
from collections.abc import Iterator

import pytest

from engine.boundary.pipe import PipeReader, PipeWriter


@pytest.fixture()
def pipe() -> Iterator[tuple[PipeReader, PipeWriter]]:
    r, w = os.pipe()
    yield PipeReader(r, eof_message="eof"), PipeWriter(w)
    os.close(r)
    os.close(w)


def test_messages_arrive_whole_and_in_order(pipe: tuple[PipeReader, PipeWriter]) -> None:
    reader, writer = pipe
    sent = [{"i": i, "pad": "x" * (i * 37 % 5000)} for i in range(300)]
    for msg in sent:
        writer.send(msg)  # off any loop: blocking when full, but 300 small frames fit in the widened pipe
    got = [reader.get(timeout=5) for _ in sent]
    assert got == sent
    with pytest.raises(queue.Empty):
        reader.get_nowait()
    with pytest.raises(queue.Empty):
        reader.get(timeout=0.01)


def test_a_full_pipe_never_blocks_the_loop_and_nothing_is_lost(pipe: tuple[PipeReader, PipeWriter]) -> None:
    reader, writer = pipe
    big = b"y" * (3 << 20)  # larger than any pipe buffer: the rest must wait for room

    async def scenario() -> list[object]:
        writer.bind(asyncio.get_running_loop())
        writer.send(("first", big))  # returns at once though only part of it fits
        writer.send("second")
        # The reader starts only after both sends returned, so they did not wait for it; the loop stays
        # free while it reads and flushes the rest as room appears.
        return await asyncio.to_thread(lambda: [reader.get(timeout=10) for _ in range(2)])

    got = asyncio.run(scenario())
    assert got == [("first", big), "second"]


def test_end_of_file_reads_as_the_eof_message_and_a_gone_reader_raises() -> None:
    r, w = os.pipe()
    reader, writer = PipeReader(r, eof_message="eof"), PipeWriter(w)
    writer.send("last words")
    os.close(w)
    assert reader.get(timeout=5) == "last words"
    assert reader.get(timeout=5) == "eof" and reader.get_nowait() == "eof"
    os.close(r)
    r2, w2 = os.pipe()
    os.close(r2)
    with pytest.raises(BrokenPipeError):
        PipeWriter(w2).send("nobody listens")
    os.close(w2)


def test_a_blocking_send_to_a_reader_that_never_reads_times_out(pipe: tuple[PipeReader, PipeWriter]) -> None:
    _, writer = pipe
    with pytest.raises(TimeoutError):
        writer.send(b"z" * (3 << 20), block=True, timeout=0.2)  # more than the pipe holds, nobody reading


def test_take_ready_never_waits_and_keeps_a_half_written_frame(pipe: tuple[PipeReader, PipeWriter]) -> None:
    """An event loop's reader callback: uvloop makes the descriptor non-blocking, and the worker may be mid-frame."""
    reader, _ = pipe
    os.set_blocking(reader.fd, False)
    raw_r, raw_w = os.pipe()  # frame one message by hand, then hand the reader its bytes in two pieces
    PipeWriter(raw_w).send({"outputs": list(range(5000))})
    os.close(raw_w)
    frame = os.read(raw_r, 1 << 20)
    os.close(raw_r)
    assert reader.take_ready() == []  # nothing there: returns at once
    os.write(pipe[1].fd, frame[: len(frame) // 2])
    assert reader.take_ready() == []
    os.write(pipe[1].fd, frame[len(frame) // 2 :] + frame)
    assert reader.take_ready() == [{"outputs": list(range(5000))}] * 2


def test_take_ready_ends_with_the_eof_message() -> None:
    r, w = os.pipe()
    reader, writer = PipeReader(r, eof_message="eof"), PipeWriter(w)
    writer.send("last words")
    os.close(w)
    assert reader.take_ready() == ["last words", "eof"]
    assert reader.take_ready() == ["eof"]
    os.close(r)
