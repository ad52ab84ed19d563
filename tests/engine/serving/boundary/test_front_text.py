"""Text made by the front instead of the engine loop: same text, same stops, same tokens; a failure ends one request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence

import pytest

from engine import (
    LLM,
    AsyncEngine,
    EngineConfig,
    FinishReason,
    LLMEngine,
    RequestMeta,
    RequestOutput,
    SamplingParams,
)
from engine.core.detokenizer import Detokenizer, IncrementalDetokenizer
from engine.core.tokenizer import Tokenizer
from engine.worker.loader import LoadedModel, load_model

PROMPTS = ["The batch never waits.", "Fair share", "x", "\u00e9t\u00e9 \u2603"]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, dtype="auto", device="cpu")


def engine_config() -> EngineConfig:
    return EngineConfig(num_kv_blocks=96, max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def reference() -> LLM:
    """The offline API: the engine detokenizes and checks stops itself, as before text left the loop."""
    return LLM(None, num_kv_blocks=96, max_num_batched_tokens=32)


@pytest.fixture()
def front(loaded: LoadedModel) -> Iterator[AsyncEngine]:
    eng = AsyncEngine(engine_config(), engine=LLMEngine(engine_config(), loaded=loaded))
    eng.start()
    yield eng
    eng.shutdown()


async def collect(
    engine: AsyncEngine, ids: list[int], params: SamplingParams, request_id: str
) -> list[RequestOutput]:
    return [out async for out in engine.generate(ids, params, RequestMeta(tenant_id=request_id), request_id)]


def run_all(engine: AsyncEngine, prompts: Sequence[str], params: SamplingParams) -> list[list[RequestOutput]]:
    async def scenario() -> list[list[RequestOutput]]:
        return await asyncio.gather(
            *(collect(engine, engine.tokenizer.encode(p), params, f"r{i}") for i, p in enumerate(prompts))
        )

    return asyncio.run(scenario())


def test_the_loop_leaves_text_to_the_front_only_without_stop_strings(loaded: LoadedModel) -> None:
    engine = LLMEngine(engine_config(), loaded=loaded)
    engine.detokenize_in_front()
    engine.add_request("plain", "Fair share", SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    engine.add_request(
        "stops",
        "Fair share",
        SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, stop=["\u0000never"]),
    )
    text: dict[str, str] = {"plain": "", "stops": ""}
    tokens: dict[str, int] = {"plain": 0, "stops": 0}
    while engine.has_unfinished():
        for delta in engine.step_deltas():
            text[delta.request_id] += delta.delta_text
            tokens[delta.request_id] += len(delta.new_token_ids)
    assert tokens == {"plain": 6, "stops": 6}
    assert text["plain"] == "" and text["stops"] != ""


@pytest.mark.parametrize("stream_outputs", [True, False])
def test_front_text_equals_the_engines_own_with_split_utf8(
    front: AsyncEngine, reference: LLM, stream_outputs: bool
) -> None:
    """Hot sampling emits bytes that are not UTF-8 on their own; held back, released and replaced as before."""
    params = SamplingParams(
        max_tokens=40, temperature=3.0, seed=7, ignore_eos=True, stream_outputs=stream_outputs
    )
    want = reference.generate(PROMPTS, params)
    assert any("\ufffd" in w.text or any(ord(c) > 127 for c in w.text) for w in want)  # the case is exercised
    for w, outs in zip(want, run_all(front, PROMPTS, params), strict=True):
        last = outs[-1]
        assert (last.text, list(last.token_ids), last.finish_reason) == (w.text, w.token_ids, w.finish_reason)
        assert "".join(o.delta_text for o in outs) == w.text


def test_stop_strings_end_in_the_same_iteration_with_the_same_tokens_charged(
    front: AsyncEngine, reference: LLM, loaded: LoadedModel
) -> None:
    base = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    probe = reference.generate(["Fair share"], base)[0].text
    stop = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop=[probe[10:12]])
    offline = LLMEngine(engine_config(), loaded=loaded)  # text and stops in the loop, as before
    offline.add_request("r0", "Fair share", stop)
    want: RequestOutput | None = None
    while offline.has_unfinished():
        want = next((o for o in offline.step() if o.finished), want)
    assert want is not None and want.finish_reason is FinishReason.STOP and len(want.token_ids) < 30
    [outs] = run_all(front, ["Fair share"], stop)
    last = outs[-1]
    assert (last.text, list(last.token_ids), last.finish_reason) == (
        want.text,
        want.token_ids,
        want.finish_reason,
    )
    # Charged exactly the tokens up to the match, as the engine that stopped it in the same iteration did.
    assert last.metrics.completion_tokens == want.metrics.completion_tokens
    assert last.metrics.charged_service == want.metrics.charged_service


class _FailingDetokenizer(IncrementalDetokenizer):
    __slots__ = ()

    def push(self, new_ids: Sequence[int]) -> str:
        raise UnicodeError("injected detokenizer failure")


class _BrokenOn:
    """A tokenizer whose incremental detokenizer fails for one prompt: a stand-in for a tokenizer bug."""

    def __init__(self, real: Tokenizer, prompt: list[int]) -> None:
        self._real = real
        self._prompt = prompt

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def detokenizer(self, prompt_ids: Sequence[int]) -> Detokenizer:
        if list(prompt_ids) == self._prompt:
            return _FailingDetokenizer(self._real, prompt_ids)
        return self._real.detokenizer(prompt_ids)


def test_a_detokenizer_failure_ends_that_request_alone(front: AsyncEngine, reference: LLM) -> None:
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    bad = front.tokenizer.encode(PROMPTS[1])
    front.tokenizer = _BrokenOn(front.tokenizer, bad)  # type: ignore[assignment]
    want = reference.generate(PROMPTS, params)
    streams = run_all(front, PROMPTS, params)
    for i, (w, outs) in enumerate(zip(want, streams, strict=True)):
        last = outs[-1]
        if i == 1:
            assert last.finished and last.finish_reason is FinishReason.ERROR
            assert last.text == "" and len(last.token_ids) == last.metrics.completion_tokens
        else:
            assert (last.text, list(last.token_ids), last.finish_reason) == (
                w.text,
                w.token_ids,
                w.finish_reason,
            )
    engine = front.engine
    deadline = time.monotonic() + 30
    while engine.has_unfinished() and time.monotonic() < deadline:  # poll: the loop retires the abort
        time.sleep(0.01)
    assert not engine.has_unfinished() and front.stats().kv_blocks_used == 0
    # The engine stopped computing it at the abort, long before its 200 tokens: service is prompt + 2/token.
    service = front.stats().service
    assert service["r1"] < len(bad) + 2 * 50 < service["r0"]
