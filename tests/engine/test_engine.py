"""LLMEngine and AsyncEngine on the embedded default model: validation, cancellation, seeding, traces, failure."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from engine import (
    LLM,
    AsyncEngine,
    DuplicateRequestError,
    EngineConfig,
    EngineDeadError,
    FinishReason,
    InvalidRequestError,
    LLMEngine,
    PromptTooLongError,
    RequestMeta,
    RequestOutput,
    RequestState,
    SamplingParams,
)
from engine.worker.loader import LoadedModel, load_model


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, dtype="auto", device="cpu")


def make_engine(loaded: LoadedModel, **kw: object) -> LLMEngine:
    cfg = EngineConfig(**{"num_kv_blocks": 64, "max_num_batched_tokens": 32, **kw})  # type: ignore[arg-type]
    return LLMEngine(cfg, loaded=loaded)


def run_until(engine: LLMEngine, predicate: object, limit: int = 500) -> None:
    for _ in range(limit):
        if predicate():  # type: ignore[operator]
            return
        engine.step()
    raise AssertionError("condition not reached")


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ([], SamplingParams(), "prompt"),
        ([1, 2, 10**6], SamplingParams(), "prompt"),
        ([1, 2, -1], SamplingParams(), "prompt"),
        ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
        ([1, 2], SamplingParams(temperature=float("nan")), "temperature"),
        ([1, 2], SamplingParams(temperature=-1.0), "temperature"),
        ([1, 2], SamplingParams(top_p=0.0), "top_p"),
        ([1, 2], SamplingParams(top_k=-3), "top_k"),
        ([1, 2], SamplingParams(max_tokens=10**7), "max_tokens"),
    ],
)
def test_bad_input_raises_specific_error_and_engine_stays_healthy(
    loaded: LoadedModel, prompt: list[int], params: SamplingParams, field: str
) -> None:
    engine = make_engine(loaded)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("bad", prompt, params)
    assert info.value.field_name == field
    assert not engine.has_unfinished()
    engine.add_request("good", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    run_until(engine, lambda: not engine.has_unfinished())


def test_prompt_past_context_and_duplicate_id(loaded: LoadedModel) -> None:
    engine = make_engine(loaded, max_model_len=64)
    with pytest.raises(PromptTooLongError):
        engine.add_request("long", list(range(60)), SamplingParams(max_tokens=10))
    engine.add_request("dup", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(DuplicateRequestError):
        engine.add_request("dup", [1, 2], SamplingParams(max_tokens=2))


@pytest.mark.parametrize("state", ["waiting", "prefill", "decode"])
def test_cancel_in_each_state_frees_blocks_and_ends_once(loaded: LoadedModel, state: str) -> None:
    engine = make_engine(loaded, max_num_seqs=1, max_num_batched_tokens=16)
    engine.add_request("blocker", list(range(1, 40)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("target", list(range(1, 40)), SamplingParams(max_tokens=50, ignore_eos=True))
    target = engine.scheduler.requests["target"]
    if state != "waiting":
        engine.abort_request("blocker")
        engine.step()
        if state == "prefill":
            run_until(engine, lambda: 0 < target.num_computed_tokens < target.num_prompt_tokens)
        else:
            run_until(engine, lambda: len(target.output_token_ids) >= 2)
    assert engine.abort_request("target")
    outputs = [o for o in engine.step() if o.request_id == "target"]
    assert len(outputs) == 1 and outputs[0].finished
    assert outputs[0].finish_reason is FinishReason.CANCELLED
    assert outputs[0].metrics.cancel_state == state
    assert target.state is RequestState.FINISHED
    assert "target" not in engine.pool.tables
    engine.abort_request("blocker")
    engine.step()
    assert engine.pool.num_free == engine.pool.num_blocks
    assert not engine.abort_request("target"), "a finished request cannot be cancelled twice"


def test_seeded_sampling_is_independent_of_batch(loaded: LoadedModel) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    alone = LLM(None, num_kv_blocks=64).generate("seeded prompt", params)[0].token_ids
    others = [SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True) for n in (5, 9, 14)]
    mixed = LLM(None, num_kv_blocks=64).generate(
        ["noise a", "seeded prompt", "noise bb", "noise ccc"], [others[0], params, others[1], others[2]]
    )
    assert mixed[1].token_ids == alone
    different = LLM(None, num_kv_blocks=64).generate(
        "seeded prompt",
        SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=99, ignore_eos=True),
    )
    assert different[0].token_ids != alone


def test_stop_string_cuts_text_and_finishes(loaded: LoadedModel) -> None:
    llm = LLM(None, num_kv_blocks=64)
    free = llm.generate("stop test", SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
    assert len(free.text) > 4
    stop = free.text[2:4]
    cut = llm.generate(
        "stop test", SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    )[0]
    assert cut.finish_reason is FinishReason.STOP
    assert cut.text == free.text[: free.text.index(stop)]


def _outputs(engine: LLMEngine, request_id: str) -> list[RequestOutput]:
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.request_id == request_id]
    return outs


@pytest.mark.parametrize("stop", [[], "cut"])
def test_unstreamed_outputs_are_the_first_and_the_last_with_the_same_text(
    loaded: LoadedModel, stop: list[str] | str
) -> None:
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    engine = make_engine(loaded)
    ids = engine.tokenizer.encode("quiet until done")
    engine.add_request("streamed", ids, params, RequestMeta())
    streamed = _outputs(engine, "streamed")
    stops = [streamed[-1].text[3:5]] if stop else []
    if stops:  # a stop string found only across skipped outputs must still cut the text
        engine.add_request(
            "streamed-stop", ids, SamplingParams(**{**params.__dict__, "stop": stops}), RequestMeta()
        )
        streamed = _outputs(engine, "streamed-stop")
    engine.add_request(
        "whole",
        ids,
        SamplingParams(**{**params.__dict__, "stop": stops, "stream_outputs": False}),
        RequestMeta(),
    )
    whole = _outputs(engine, "whole")
    assert len(streamed) > 2 and len(whole) == 2 and not whole[0].finished and whole[1].finished
    assert whole[1].text == streamed[-1].text and whole[1].finish_reason is streamed[-1].finish_reason
    assert "".join(o.delta_text for o in whole) == whole[1].text
    assert [t for o in whole for t in o.new_token_ids] == whole[1].token_ids == streamed[-1].token_ids


def test_trace_rows_are_written_as_json_lines(loaded: LoadedModel, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    engine = make_engine(loaded, trace_path=str(path))
    engine.add_request("a", list(range(1, 50)), SamplingParams(max_tokens=4, ignore_eos=True))
    run_until(engine, lambda: not engine.has_unfinished())
    engine.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == engine.scheduler.iteration
    assert sum(r["prefill_tokens"] for r in rows) == 49  # the prompt, in chunks of at most 32
    assert sum(r["decode_tokens"] for r in rows) == 3  # the first token comes from the prefill
    assert max(r["prefill_tokens"] for r in rows) <= 32
    assert rows[-1]["completions"] == 1 and rows[-1]["kv_blocks_used"] == 0


def test_async_engine_streams_and_cancels(loaded: LoadedModel) -> None:
    engine = AsyncEngine(EngineConfig(num_kv_blocks=64), engine=make_engine(loaded))
    engine.start()

    async def scenario() -> None:
        texts = []
        async for out in engine.generate(
            [1, 2, 3],
            SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
            RequestMeta(tenant_id="a"),
            "r1",
        ):
            texts.append(out.delta_text)
            last = out
        assert last.finished and last.finish_reason is FinishReason.LENGTH
        assert len(last.token_ids) == 6 and "".join(texts) == last.text

        seen = 0
        stream = engine.generate(
            [1, 2, 3],
            SamplingParams(max_tokens=400, ignore_eos=True),
            RequestMeta(tenant_id="a", task_id="t1"),
            "r2",
        )
        async for out in stream:
            seen += 1
            if seen == 2:
                assert engine.cancel_task("t1") == ["r2"]
            if out.finished:
                assert out.finish_reason is FinishReason.CANCELLED
                assert len(out.token_ids) < 400
        with pytest.raises(InvalidRequestError):
            await anext(engine.generate([], SamplingParams(), RequestMeta(), "r3"))

    asyncio.run(scenario())
    stats = engine.stats()
    assert stats.alive and stats.kv_blocks_used == 0 and stats.running == 0
    engine.shutdown()
    assert not engine.is_alive


def test_submit_queues_at_once_and_closing_early_aborts(loaded: LoadedModel) -> None:
    engine = AsyncEngine(EngineConfig(num_kv_blocks=64), engine=make_engine(loaded))
    engine.start()

    async def scenario() -> None:
        with pytest.raises(InvalidRequestError):  # raised by the call itself, nothing registered
            engine.submit([], SamplingParams(), RequestMeta(), "bad")
        assert engine.live_request("bad") is None
        stream = engine.submit(
            [1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True), RequestMeta(), "early"
        )
        info = engine.live_request("early")
        assert info is not None and info.state == "waiting"  # live before anyone reads the stream
        with pytest.raises(DuplicateRequestError):
            engine.submit([1], SamplingParams(), RequestMeta(), "early")
        first = await anext(stream)
        assert not first.finished
        stream.close()  # the reader went away mid-request
        assert engine.live_request("early") is None
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        # Messages reach the loop in order: once a later request has run to its end, the abort has
        # been applied and the 400-token request holds nothing (checked below).
        after = [
            out
            async for out in engine.submit(
                [1, 2], SamplingParams(max_tokens=3, ignore_eos=True), RequestMeta(), "after"
            )
        ]
        assert after[-1].finished and len(after[-1].token_ids) == 3
        assert engine.stats().running == 0

    asyncio.run(scenario())
    stats = engine.stats()
    assert stats.running == 0 and stats.kv_blocks_used == 0
    engine.shutdown()


def test_a_sink_on_the_thread_engine_takes_outputs_on_its_loop_and_closing_aborts(
    loaded: LoadedModel,
) -> None:
    engine = AsyncEngine(EngineConfig(num_kv_blocks=64), engine=make_engine(loaded))
    engine.start()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        taken: list[RequestOutput | BaseException] = []
        first: asyncio.Future[None] = loop.create_future()

        def sink(item: RequestOutput | BaseException) -> None:
            assert asyncio.get_running_loop() is loop  # handed over from the engine thread
            taken.append(item)
            if not first.done():
                first.set_result(None)

        stream = engine.submit(
            [1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True), RequestMeta(), "s", sink=sink
        )
        await asyncio.wait_for(first, 30)
        stream.close()  # the consumer went away mid-request
        assert engine.live_request("s") is None
        after = [
            out
            async for out in engine.submit(
                [1, 2], SamplingParams(max_tokens=3, ignore_eos=True), RequestMeta(), "after"
            )
        ]
        assert after[-1].finished and engine.stats().running == 0  # the abort reached the loop first
        assert all(isinstance(o, RequestOutput) and not o.finished for o in taken)

    asyncio.run(scenario())
    assert engine.stats().kv_blocks_used == 0
    engine.shutdown()


def test_async_engine_death_fails_streams(loaded: LoadedModel) -> None:
    inner = make_engine(loaded)
    engine = AsyncEngine(EngineConfig(), engine=inner)

    def crash(*_: object) -> dict[str, int]:
        raise RuntimeError("simulated device fault")

    inner.runner.execute = crash  # type: ignore[method-assign, assignment]
    engine.start()

    async def scenario() -> None:
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate([1, 2, 3], SamplingParams(max_tokens=4), RequestMeta(), "x"):
                pass

    asyncio.run(asyncio.wait_for(scenario(), timeout=5))
    assert not engine.stats().alive

    async def late() -> None:
        await anext(engine.generate([1], SamplingParams(), RequestMeta(), "y"))

    with pytest.raises(EngineDeadError):
        asyncio.run(late())
    assert math.isfinite(engine.stats().iteration_seconds)


def test_end_callbacks_run_once_however_a_stream_ends(loaded: LoadedModel) -> None:
    """What a router forgets a request by: the callback runs when the stream finishes or is closed, once."""
    engine = AsyncEngine(EngineConfig(num_kv_blocks=64), engine=make_engine(loaded))
    engine.start()
    ended: list[str] = []

    async def scenario() -> None:
        done = engine.submit([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True), RequestMeta(), "done")
        done.when_ended(lambda: ended.append("done"))
        assert [out.finished async for out in done][-1] and ended == ["done"]
        done.when_ended(lambda: ended.append("late"))  # already ended: at once
        closed = engine.submit(
            [1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True), RequestMeta(), "closed"
        )
        closed.when_ended(lambda: ended.append("closed"))
        closed.close()
        closed.close()

    asyncio.run(scenario())
    assert ended == ["done", "late", "closed"]
    engine.shutdown()
