"""`overlap_publish`: the worker publishes from a thread of its own; every stream must be what it was without it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine import EngineConfig, FinishReason, ProcessEngine, RequestMeta, RequestOutput, SamplingParams
from engine.boundary.publisher import BackgroundPublisher

PROMPTS = [[(7 * i + j) % 250 + 1 for j in range(40 + 9 * i)] for i in range(6)]  # 40-85 tokens
GREEDY = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)


def scenario(overlap: bool) -> tuple[list[list[RequestOutput]], int]:
    """Chunked prefill (16-token budget), preemption (too few KV blocks for all six), one cancellation."""
    engine = ProcessEngine(
        EngineConfig(
            num_kv_blocks=24,
            block_size=16,
            max_num_batched_tokens=16,
            max_num_seqs=6,
            overlap_publish=overlap,
        )
    )
    engine.start()
    try:

        async def one(i: int) -> list[RequestOutput]:
            outs = []
            async for out in engine.generate(PROMPTS[i], GREEDY, RequestMeta(tenant_id=f"t{i % 3}"), f"r{i}"):
                outs.append(out)
                if i == 5 and len(outs) == 3:
                    engine.abort("r5")
            return outs

        async def run() -> list[list[RequestOutput]]:
            return await asyncio.gather(*(one(i) for i in range(6)))

        streams = asyncio.run(run())
        return streams, engine.stats().preemptions_total
    finally:
        engine.shutdown()


def test_overlapped_publishing_streams_the_same_tokens_and_text() -> None:
    plain, plain_preempted = scenario(overlap=False)
    overlapped, overlapped_preempted = scenario(overlap=True)
    assert plain_preempted > 0 and overlapped_preempted > 0  # the scenario does exercise preemption
    for i, (want, got) in enumerate(zip(plain, overlapped, strict=True)):
        a, b = want[-1], got[-1]
        if i == 5:  # cancelled after its third output: where it stopped depends on timing, not on the option
            assert a.finish_reason is b.finish_reason is FinishReason.CANCELLED
            n = min(len(a.token_ids), len(b.token_ids))
            assert list(a.token_ids)[:n] == list(b.token_ids)[:n]
            continue
        assert (list(b.token_ids), b.text, b.finish_reason) == (
            list(a.token_ids),
            a.text,
            FinishReason.LENGTH,
        )
        assert "".join(o.delta_text for o in got) == b.text


def test_publisher_sends_in_order_and_hands_a_send_failure_to_the_loop() -> None:
    sent: list[int] = []
    release = threading.Event()

    def send(msg: int) -> None:
        release.wait(10)
        if msg == 3:
            raise BrokenPipeError("front gone")
        sent.append(msg)

    publisher = BackgroundPublisher(send, depth=2)
    publisher(1)
    publisher(2)
    release.set()
    publisher(3)
    with pytest.raises(BrokenPipeError):
        for n in range(4, 100):  # the loop learns of the failure at a later publish at the latest
            publisher(n)
    assert sent == [1, 2]
    with pytest.raises(BrokenPipeError):
        publisher.close()
