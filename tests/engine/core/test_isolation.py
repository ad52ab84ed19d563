"""A bad request fails alone: validation accepts exactly what the engine can compute, and whatever one
request's own work raises ends that request with finish_reason "error" while the others go on."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EngineConfig, FinishReason, InvalidRequestError, LLMEngine, RequestMeta, SamplingParams
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.limits import RequestCaps
from engine.worker.loader import LoadedModel, load_model

FIELDS = {f.name for f in dataclasses.fields(SamplingParams)} | {"prompt"}


@pytest.fixture(scope="module", params=["off", "on"])
def engine(request: pytest.FixtureRequest) -> LLMEngine:
    """With and without async scheduling: a failure found while the next step is in flight ends its request alone."""
    loaded: LoadedModel = load_model(None, dtype="auto", device="cpu")
    return LLMEngine(
        EngineConfig(num_kv_blocks=64, max_num_batched_tokens=64, async_scheduling=request.param),
        loaded=loaded,
    )


def finish_all(engine: LLMEngine, limit: int = 200) -> dict[str, FinishReason | None]:
    reasons: dict[str, FinishReason | None] = {}
    for _ in range(limit):
        if not engine.has_unfinished():
            return reasons
        for out in engine.step():
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    raise AssertionError("requests did not finish")


floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-39, 1e-300, 5e-324, 1e-6, 1e-5]),
    st.integers(-3, 3),
)
ints = st.one_of(
    st.integers(-5, 70),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 10**30]),
    st.booleans(),
)
params_strategy = st.builds(
    SamplingParams,
    max_tokens=st.one_of(st.integers(-1, 3), st.just(10**9)),
    temperature=floats,
    top_p=floats,
    top_k=ints,
    seed=st.one_of(st.none(), ints),
    stop=st.lists(st.text(max_size=4), max_size=3),
    stop_token_ids=st.lists(st.integers(-2, 400), max_size=3),
    ignore_eos=st.booleans(),
    logit_bias=st.dictionaries(st.integers(-2, 400), floats, max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=params_strategy, prompt=st.lists(st.integers(-1, 300), min_size=0, max_size=6))
def test_accepted_requests_never_raise_and_refused_ones_name_a_field(
    engine: LLMEngine, params: SamplingParams, prompt: list[int]
) -> None:
    try:
        engine.validate(prompt, params)
    except InvalidRequestError as exc:
        assert exc.field_name in FIELDS, exc
        with pytest.raises(InvalidRequestError):
            engine.add_request("poison", prompt, params)
        return
    engine.add_request("poison", prompt, params, RequestMeta(tenant_id="a"))
    engine.add_request(
        "neighbour",
        [5, 6, 7],
        SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True),
        RequestMeta(tenant_id="b"),
    )
    reasons = finish_all(engine)  # step() must not raise
    assert reasons["neighbour"] is FinishReason.LENGTH
    assert reasons["poison"] is not FinishReason.ERROR  # what validation accepts, the sampler computes


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(seed=2**64), "seed"),
        (SamplingParams(seed=-(2**63) - 1), "seed"),
        (SamplingParams(seed=True), "seed"),
        (SamplingParams(stop=["x"] * 17), "stop"),
        (SamplingParams(stop=["x" * 257]), "stop"),
        (SamplingParams(stop_token_ids=list(range(65))), "stop_token_ids"),
        (SamplingParams(logit_bias=dict.fromkeys(range(301), 1.0)), "logit_bias"),
        (SamplingParams(logit_bias={3: 101.0}), "logit_bias"),
        (SamplingParams(logit_bias={10**6: 1.0}), "logit_bias"),
    ],
)
def test_caps_and_ranges_are_refused_naming_the_field(
    engine: LLMEngine, params: SamplingParams, field: str
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        engine.validate([1, 2, 3], params)
    assert info.value.field_name == field


def test_tiny_temperature_is_greedy(engine: LLMEngine) -> None:
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("g", [9, 8, 7], greedy)
    engine.add_request("t", [9, 8, 7], dataclasses.replace(greedy, temperature=1e-39, seed=2**64 - 1))
    outs: dict[str, list[int]] = {"g": [], "t": []}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id] += out.new_token_ids
    assert outs["g"] == outs["t"] and len(outs["g"]) == 4


def test_logit_bias_moves_the_choice(engine: LLMEngine) -> None:
    engine.add_request(
        "b", [9, 8, 7], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, logit_bias={42: 100.0})
    )
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
    assert tokens == [42, 42]


def poison_and_neighbour(engine: LLMEngine) -> None:
    engine.add_request(
        "poison",
        [1, 2, 3],
        SamplingParams(max_tokens=8, temperature=1.0, seed=7, ignore_eos=True),
        RequestMeta(tenant_id="a"),
    )
    engine.add_request(
        "neighbour",
        [4, 5, 6],
        SamplingParams(max_tokens=8, temperature=0.8, seed=1, ignore_eos=True),
        RequestMeta(tenant_id="b"),
    )


def test_a_sampling_failure_ends_only_its_request(engine: LLMEngine) -> None:
    """Validation bypassed on purpose: a seed torch refuses reaches the real sampler."""
    poison_and_neighbour(engine)
    engine.scheduler.requests["poison"].sampling.seed = 2**70
    before = engine.failed_requests
    reasons = finish_all(engine)
    assert reasons == {"poison": FinishReason.ERROR, "neighbour": FinishReason.LENGTH}
    assert engine.failed_requests == before + 1
    assert engine.pool.num_used == 0  # its blocks went back


class BrokenDetokenizer(IncrementalDetokenizer):
    def push(self, new_ids: Sequence[int]) -> str:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")

    def finish(self) -> str:
        return ""


def test_a_detokenization_failure_ends_only_its_request(engine: LLMEngine) -> None:
    poison_and_neighbour(engine)
    engine._streams["poison"].detokenizer = BrokenDetokenizer(engine.tokenizer, [1, 2, 3])
    reasons = finish_all(engine)
    assert reasons == {"poison": FinishReason.ERROR, "neighbour": FinishReason.LENGTH}
    assert not engine.has_unfinished() and engine.pool.num_used == 0


def test_prompt_bytes_cap() -> None:
    caps = RequestCaps(max_prompt_bytes=1000)
    caps.check_prompt_text("x" * 1000)
    caps.check_prompt_text("é" * 500)  # 1000 bytes
    for text in ("x" * 1001, "é" * 501):
        with pytest.raises(InvalidRequestError) as info:
            caps.check_prompt_text(text)
        assert info.value.field_name == "prompt"
