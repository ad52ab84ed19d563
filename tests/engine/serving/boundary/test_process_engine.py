"""ProcessEngine: the engine loop in a real spawned worker process with the embedded default model."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvloop

from engine import (
    LLM,
    DuplicateRequestError,
    EngineConfig,
    EngineDeadError,
    EngineStartError,
    FinishReason,
    InvalidRequestError,
    ProcessEngine,
    RequestMeta,
    RequestOutput,
    SamplingParams,
)
from engine.serving.boundary.zmq_channel import ZmqFrontChannel
from engine.worker.loader import default_model_dir

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["The batch never waits.", "Fair share", "x"]


def config(**kw: object) -> EngineConfig:
    return EngineConfig(**{"num_kv_blocks": 96, "max_num_batched_tokens": 64, **kw})  # type: ignore[arg-type]


def started(cfg: EngineConfig) -> tuple[ProcessEngine, int]:
    """A started engine and its worker's pid (the child that appeared with it)."""
    before = {p.pid for p in multiprocessing.active_children()}
    engine = ProcessEngine(cfg)
    engine.start()
    new = [
        p.pid
        for p in multiprocessing.active_children()
        if p.pid not in before and p.name == "fairserve-engine"
    ]
    assert len(new) == 1 and new[0] is not None and new[0] != os.getpid()
    return engine, new[0]


@pytest.fixture(scope="module")
def engine() -> Iterator[ProcessEngine]:
    eng, _ = started(config())
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def reference() -> LLM:
    """The same engine configuration in this process, as the oracle."""
    return LLM(None, num_kv_blocks=96, max_num_batched_tokens=64)


async def collect(
    engine: ProcessEngine, ids: list[int], params: SamplingParams, request_id: str, **meta: object
) -> list[RequestOutput]:
    return [out async for out in engine.generate(ids, params, RequestMeta(**meta), request_id)]  # type: ignore[arg-type]


def test_streams_the_same_greedy_tokens_as_llm(engine: ProcessEngine, reference: LLM) -> None:
    expected = reference.generate(PROMPTS, GREEDY)

    async def scenario() -> list[list[RequestOutput]]:
        return await asyncio.gather(
            *(
                collect(engine, engine.tokenizer.encode(p), GREEDY, f"parity-{i}", tenant_id=f"t{i}")
                for i, p in enumerate(PROMPTS)
            )
        )

    streams = asyncio.run(scenario())
    for want, outs in zip(expected, streams, strict=True):
        last = outs[-1]
        assert last.finished and last.finish_reason is FinishReason.LENGTH
        assert [o.finished for o in outs[:-1]] == [False] * (len(outs) - 1)
        assert last.token_ids == want.token_ids
        assert [t for o in outs for t in o.new_token_ids] == want.token_ids
        assert "".join(o.delta_text for o in outs) == last.text == want.text
        assert last.metrics.completion_tokens == len(want.token_ids)
    stats = engine.stats()
    assert stats.alive and stats.running == 0 and stats.kv_blocks_used == 0 and stats.iterations > 0
    assert engine.recent_traces(5) and engine.recent_traces(5)[-1].iteration == stats.iterations


def test_logprobs_cross_the_process_boundary_as_llm_computes_them(
    engine: ProcessEngine, reference: LLM
) -> None:
    """Each output's TokenLogprobs (msgspec, inside OutputDelta) arrive one per new token, equal to LLM's."""
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=3)
    want = reference.generate(PROMPTS[:1], params)[0]
    outs = asyncio.run(collect(engine, engine.tokenizer.encode(PROMPTS[0]), params, "logprobs-0"))
    got = [lp for o in outs for lp in o.new_logprobs or []]
    assert [len(o.new_logprobs or []) for o in outs] == [len(o.new_token_ids) for o in outs]
    assert want.logprobs is not None and len(got) == len(want.logprobs) == 8
    for a, b in zip(got, want.logprobs, strict=True):
        assert a.top_ids == b.top_ids and a.logprob == pytest.approx(b.logprob, abs=1e-5)


def test_stop_strings_and_whole_responses_match_llm(engine: ProcessEngine, reference: LLM) -> None:
    """Only deltas cross the pipe; the totals the front rebuilds must equal the engine's own."""
    base = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    probe = reference.generate(["Fair share"], base)[0].text
    stop = SamplingParams(**{**base.__dict__, "stop": [probe[len(probe) // 2 : len(probe) // 2 + 2]]})
    want = reference.generate(["Fair share"], stop)[0]
    assert want.finish_reason is FinishReason.STOP and len(want.text) < len(probe)
    ids = engine.tokenizer.encode("Fair share")

    async def scenario() -> tuple[list[RequestOutput], list[RequestOutput]]:
        whole = SamplingParams(**{**stop.__dict__, "stream_outputs": False})
        return (
            await collect(engine, ids, stop, "stop-streamed"),
            await collect(engine, ids, whole, "stop-whole"),
        )

    streamed, whole = asyncio.run(scenario())
    assert len(whole) == 2 and len(streamed) > 2
    for outs in (streamed, whole):
        last = outs[-1]
        assert (last.text, last.token_ids, last.finish_reason) == (
            want.text,
            want.token_ids,
            want.finish_reason,
        )
        assert last.prompt_token_ids == ids and all(o.prompt_token_ids == ids for o in outs)
        assert [len(o.token_ids) for o in outs] == list(
            itertools.accumulate(len(o.new_token_ids) for o in outs)
        )


def test_streams_arrive_whole_under_uvloop(engine: ProcessEngine) -> None:
    """`fairserve serve` runs on uvloop, whose readers make the watched pipe non-blocking (the half-frame
    case itself is pinned in tests/engine/serving/boundary/test_pipe.py)."""
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompts = [[(7 * i + j) % 200 + 3 for j in range(80)] for i in range(8)]

    async def scenario() -> list[list[RequestOutput]]:
        return await asyncio.gather(
            *(collect(engine, ids, params, f"uv-{i}", tenant_id=f"t{i % 3}") for i, ids in enumerate(prompts))
        )

    streams = uvloop.run(asyncio.wait_for(scenario(), timeout=120))
    assert engine.is_alive
    for outs in streams:
        assert outs[-1].finish_reason is FinishReason.LENGTH and len(outs[-1].token_ids) == 40
        assert [t for o in outs for t in o.new_token_ids] == outs[-1].token_ids


def test_sinks_take_what_streams_yield_and_a_raising_sink_costs_nobody_else(
    engine: ProcessEngine, reference: LLM
) -> None:
    """The gateway feeds its runs through `submit(sink=...)`: each output arrives in order on the loop,
    the stream ends itself at the finished one, and a sink that raises loses nothing for the others."""
    want = reference.generate(PROMPTS[:2], GREEDY)

    async def scenario() -> tuple[list[RequestOutput | BaseException], list[RequestOutput | BaseException]]:
        loop = asyncio.get_running_loop()
        good: list[RequestOutput | BaseException] = []
        bad: list[RequestOutput | BaseException] = []
        ends = [loop.create_future(), loop.create_future()]

        def take(
            into: list[RequestOutput | BaseException], end: asyncio.Future[None], broken: bool
        ) -> Callable[[RequestOutput | BaseException], None]:
            def sink(item: RequestOutput | BaseException) -> None:
                assert asyncio.get_running_loop() is loop
                into.append(item)
                if isinstance(item, BaseException) or item.finished:
                    end.set_result(None)
                if broken:
                    raise RuntimeError("a consumer's bug")

            return sink

        ids = [engine.tokenizer.encode(p) for p in PROMPTS[:2]]
        engine.submit(ids[1], GREEDY, RequestMeta(), "sink-bad", sink=take(bad, ends[1], True))
        engine.submit(ids[0], GREEDY, RequestMeta(), "sink-good", sink=take(good, ends[0], False))
        await asyncio.wait_for(asyncio.gather(*ends), 60)
        return good, bad

    good, bad = asyncio.run(scenario())
    for outs, expected in ((good, want[0]), (bad, want[1])):
        assert all(isinstance(o, RequestOutput) for o in outs)
        last = outs[-1]
        assert isinstance(last, RequestOutput) and last.finished and last.text == expected.text
        assert [
            t for o in outs if isinstance(o, RequestOutput) for t in o.new_token_ids
        ] == expected.token_ids
    assert engine.live_request("sink-good") is None and engine.live_request("sink-bad") is None


def test_an_abort_in_the_same_loop_pass_as_its_submit_reaches_the_worker_after_it(
    engine: ProcessEngine, reference: LLM
) -> None:
    """One loop pass's Submits and Aborts go to the worker together, in the order they were made: a request
    closed right after its submit is aborted there, not left to run its 1,500 tokens for nobody."""
    want = reference.generate(PROMPTS[:1], GREEDY)[0]

    async def scenario() -> RequestOutput:
        done: asyncio.Future[RequestOutput] = asyncio.get_running_loop().create_future()

        def sink(item: RequestOutput | BaseException) -> None:
            if isinstance(item, BaseException):
                done.set_exception(item)
            elif item.finished:
                done.set_result(item)

        long = SamplingParams(max_tokens=1500, ignore_eos=True)
        dropped = engine.submit([1, 2, 3], long, RequestMeta(tenant_id="gone"), "same-pass-dropped")
        engine.submit(engine.tokenizer.encode(PROMPTS[0]), GREEDY, RequestMeta(), "same-pass-kept", sink)
        dropped.close()  # the client went away before the pass ended: an Abort after its Submit
        return await asyncio.wait_for(done, 60)

    last = asyncio.run(scenario())
    assert last.text == want.text and last.token_ids == want.token_ids
    # Stats come before outputs: when the kept request's end arrives, the dropped one is already gone.
    stats = engine.stats()
    assert stats.running == 0 and stats.waiting == 0 and stats.kv_blocks_used == 0
    assert engine.live_request("same-pass-dropped") is None


def test_abort_and_cancel_task_end_streams_as_cancelled(engine: ProcessEngine) -> None:
    long = SamplingParams(max_tokens=1500, ignore_eos=True)

    async def until_cancelled(request_id: str, cancel: object, **meta: object) -> RequestOutput:
        outs = []
        async for out in engine.generate([1, 2, 3], long, RequestMeta(**meta), request_id):  # type: ignore[arg-type]
            outs.append(out)
            if len(outs) == 2:
                info = engine.live_request(request_id)
                assert info is not None and info.tenant_id == meta["tenant_id"] and info.state == "running"
                cancel()  # type: ignore[operator]
        return outs[-1]

    async def scenario() -> tuple[RequestOutput, RequestOutput]:
        return await asyncio.gather(
            until_cancelled("ab-1", lambda: engine.abort("ab-1"), tenant_id="alice"),
            until_cancelled("ab-2", lambda: engine.cancel_task("job-7"), tenant_id="bob", task_id="job-7"),
        )

    for last in asyncio.run(scenario()):
        assert last.finished and last.finish_reason is FinishReason.CANCELLED
        assert len(last.token_ids) < long.max_tokens
    assert engine.live_request("ab-1") is None and engine.abort("ab-1") is False
    assert engine.cancel_task("job-7") == []
    assert engine.stats().kv_blocks_used == 0


@pytest.mark.parametrize(
    ("prompt", "params", "error", "field"),
    [
        ([], SamplingParams(), InvalidRequestError, "prompt"),
        ([1, 2, 10**6], SamplingParams(), InvalidRequestError, "prompt"),
        ([1, 2], SamplingParams(max_tokens=0), InvalidRequestError, "max_tokens"),
        ([1, 2], SamplingParams(temperature=float("nan")), InvalidRequestError, "temperature"),
        ([1, 2], SamplingParams(max_tokens=4000), InvalidRequestError, "max_tokens"),  # past the context
        ([1, 2], SamplingParams(max_tokens=1600), InvalidRequestError, "max_tokens"),  # past 96 KV blocks
    ],
)
def test_validation_raises_synchronously_like_the_engine(
    engine: ProcessEngine,
    reference: LLM,
    prompt: list[int],
    params: SamplingParams,
    error: type[Exception],
    field: str,
) -> None:
    with pytest.raises(error) as want:
        reference.engine.validate(prompt, params)
    iterations = engine.stats().iterations

    async def first() -> None:
        await anext(engine.generate(prompt, params, RequestMeta(), "bad"))

    with pytest.raises(error) as got:
        asyncio.run(first())
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)
    assert getattr(got.value, "field_name", None) == field
    assert engine.live_request("bad") is None and engine.stats().iterations == iterations


def test_duplicate_live_id_is_refused(engine: ProcessEngine) -> None:
    async def scenario() -> None:
        stream = engine.generate(
            [5, 6], SamplingParams(max_tokens=400, ignore_eos=True), RequestMeta(), "dup"
        )
        await anext(stream)
        with pytest.raises(DuplicateRequestError):
            await anext(engine.generate([5, 6], GREEDY, RequestMeta(), "dup"))
        assert engine.abort("dup")
        outs = [out async for out in stream]
        assert outs[-1].finish_reason is FinishReason.CANCELLED

    asyncio.run(scenario())


def test_killed_worker_fails_in_flight_streams() -> None:
    engine, pid = started(config())
    try:

        async def scenario() -> None:
            stream = engine.generate(
                [1, 2, 3], SamplingParams(max_tokens=1500, ignore_eos=True), RequestMeta(), "k"
            )
            await anext(stream)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError, match="died"):
                async for _ in stream:
                    pass

        asyncio.run(asyncio.wait_for(scenario(), timeout=3.0))
        assert not engine.is_alive and not engine.stats().alive

        async def late() -> None:
            await anext(engine.generate([1], SamplingParams(), RequestMeta(), "late"))

        with pytest.raises(EngineDeadError):
            asyncio.run(late())
    finally:
        engine.shutdown(timeout_s=5)


def test_restart_replaces_a_dead_worker_and_leaves_a_live_one_alone() -> None:
    engine, pid = started(config())
    try:
        engine.restart()  # alive: nothing happens
        assert engine._proc is not None and engine._proc.pid == pid

        async def dies() -> None:
            stream = engine.generate(
                [1, 2, 3], SamplingParams(max_tokens=1500, ignore_eos=True), RequestMeta(), "d"
            )
            await anext(stream)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError):
                async for _ in stream:
                    pass

        asyncio.run(asyncio.wait_for(dies(), timeout=10.0))
        engine.restart()
        assert engine.is_alive and engine._proc is not None and engine._proc.pid != pid

        async def serves() -> list[RequestOutput]:
            return await collect(engine, [1, 2, 3], GREEDY, "after-restart")

        outs = asyncio.run(asyncio.wait_for(serves(), timeout=60.0))
        assert outs[-1].finished and len(outs[-1].token_ids) == GREEDY.max_tokens

        second = engine._proc.pid
        os.kill(second, signal.SIGKILL)  # this time with no loop reading: nothing has noticed the death
        engine._proc.join(10)
        assert not engine.is_alive
        engine.restart()
        assert engine.is_alive and engine._proc.pid not in (pid, second)
    finally:
        engine.shutdown(timeout_s=5)


def test_a_failed_pipe_under_a_live_worker_fails_streams_and_kills_the_worker() -> None:
    engine, pid = started(config())

    channel = engine._channel
    assert channel is not None
    real: ZmqFrontChannel = channel  # typed, not narrowed: the class body below sees it

    class BrokenPipeEnd:
        """The worker's channel as seen after a read error: the worker lives on, but nothing more can arrive."""

        fd = real.fd

        def take_ready(self) -> list[object]:
            raise OSError(5, "Input/output error")

        drain_after_exit = take_ready

        def send(self, msg: object, block: bool = False, timeout: float | None = None) -> None:
            real.send(msg, block, timeout)

        def close(self) -> None:
            real.close()

    try:

        async def scenario() -> None:
            stream = engine.generate(
                [1, 2, 3], SamplingParams(max_tokens=1500, ignore_eos=True), RequestMeta(), "p"
            )
            await anext(stream)
            engine._channel = BrokenPipeEnd()  # type: ignore[assignment]
            with pytest.raises(EngineDeadError, match="pipe"):
                async for _ in stream:
                    pass

        asyncio.run(asyncio.wait_for(scenario(), timeout=10.0))
        assert not engine.is_alive and pid not in {p.pid for p in multiprocessing.active_children()}
    finally:
        engine.shutdown(timeout_s=5)


def test_shutdown_cancels_in_flight_requests() -> None:
    engine, pid = started(config())

    async def scenario() -> RequestOutput:
        stream = engine.generate(
            [4, 5, 6], SamplingParams(max_tokens=1500, ignore_eos=True), RequestMeta(), "s"
        )
        await anext(stream)
        await asyncio.to_thread(engine.shutdown, 30.0)
        return [out async for out in stream][-1]

    last = asyncio.run(asyncio.wait_for(scenario(), timeout=60.0))
    assert last.finished and last.finish_reason is FinishReason.CANCELLED
    assert not engine.is_alive and pid not in {p.pid for p in multiprocessing.active_children()}


def test_worker_that_cannot_load_its_model_fails_start(tmp_path: Path) -> None:
    broken = tmp_path / "no-weights"
    shutil.copytree(default_model_dir(), broken, ignore=shutil.ignore_patterns("*.safetensors"))
    engine = ProcessEngine(config(model=str(broken)))
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(EngineStartError, match="no \\*.safetensors weights"):
        engine.start()
    assert not engine.is_alive
    assert {p.pid for p in multiprocessing.active_children()} <= before  # the failed worker was reaped


@pytest.mark.parametrize("stop", [[], ["\x00never"]])  # text made by the front, and by the loop
def test_choices_cross_the_process_boundary_each_with_its_own_text(
    engine: ProcessEngine, reference: LLM, stop: list[str]
) -> None:
    """n = 3: every output names its choice; each choice's totals equal the one-choice answer, and only the
    last choice's end ends the stream, with metrics summed over the choices."""
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, stop=stop)
    want = reference.generate(PROMPTS[:1], params)[0]
    three = SamplingParams(**{**params.__dict__, "n": 3})
    outs = asyncio.run(collect(engine, engine.tokenizer.encode(PROMPTS[0]), three, f"choices-{len(stop)}"))
    last = {o.index: o for o in outs}
    assert sorted(last) == [0, 1, 2]
    assert all(list(o.token_ids) == want.token_ids and o.text == want.text for o in last.values())
    assert all(o.finish_reason is FinishReason.LENGTH for o in last.values())
    assert [o.finished for o in outs].count(True) == 1 and outs[-1].finished
    assert outs[-1].metrics.completion_tokens == 3 * 6
