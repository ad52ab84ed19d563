"""RequestLimits' vocabulary checks take C-level passes (a type set, min, max) on the common prompt and walk
the ids in Python only to name a refused one: the same ids are accepted and refused as by a per-token test."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import InvalidRequestError, SamplingParams
from engine.core.limits import RequestLimits

VOCAB = 100
LIMITS = RequestLimits(vocab_size=VOCAB, max_model_len=4096, block_size=16, num_kv_blocks=1024)


def _refused(ids: list[Any], params: SamplingParams | None = None) -> str | None:
    try:
        LIMITS.validate(ids, params or SamplingParams(max_tokens=4))
    except InvalidRequestError as exc:
        return str(exc)
    return None


def _per_token(ids: list[Any]) -> Any:
    """The first id a per-token test refuses (the check as it was written before), None when all fit."""
    return next((t for t in ids if not isinstance(t, int) or not 0 <= t < VOCAB), None)


@given(st.lists(st.one_of(st.integers(-5, VOCAB + 5), st.floats(-2, VOCAB + 2), st.booleans()), min_size=1))
def test_the_same_prompts_are_refused_as_by_a_per_token_test(ids: list[Any]) -> None:
    first_bad = _per_token(ids)
    message = _refused(ids)
    if first_bad is None:
        assert message is None
    else:
        assert message is not None and f"token id {first_bad!r} is outside" in message


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        ([1, VOCAB, -1], repr(VOCAB)),
        ([0, -1], "-1"),
        ([3, 2.0], "2.0"),
        ([5, "7"], "'7'"),
        ([math.nan], "nan"),
    ],
)
def test_a_refused_prompt_names_its_first_bad_id(ids: list[Any], named: str) -> None:
    message = _refused(ids)
    assert message is not None and f"token id {named} is outside the vocabulary [0, {VOCAB})" in message


def test_stop_token_ids_and_logit_bias_outside_the_vocabulary_are_refused_by_name() -> None:
    assert _refused([1, 2], SamplingParams(max_tokens=4, stop_token_ids=[3, VOCAB + 7])) == (
        f"stop_token_ids: token id {VOCAB + 7} is outside the vocabulary [0, {VOCAB})"
    )
    assert _refused([1, 2], SamplingParams(max_tokens=4, logit_bias={VOCAB: 1.0, 4: -1.0})) == (
        f"logit_bias: token id {VOCAB} is outside the vocabulary [0, {VOCAB})"
    )
    assert (
        _refused([1, 2], SamplingParams(max_tokens=4, stop_token_ids=[VOCAB - 1], logit_bias={0: 5.0}))
        is None
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 4.0),
        ("max_tokens", True),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", -0.5),
        ("top_p", -math.inf),
        ("top_p", 0.0),
        ("top_k", 1.0),
        ("stop", "x"),
        ("stop", [""]),
        ("stop_token_ids", (1,)),
        ("ignore_eos", 1),
        ("logit_bias", [(1, 1.0)]),
    ],
)
def test_sampling_params_refuse_what_the_sampler_cannot_use(field: str, value: Any) -> None:
    params = SamplingParams(max_tokens=4)
    setattr(params, field, value)
    with pytest.raises(InvalidRequestError) as refused:
        params.validate()
    assert refused.value.field_name == field


def test_sampling_params_accept_ints_where_floats_are_usual() -> None:
    SamplingParams(max_tokens=4, temperature=0, top_p=1).validate()  # JSON's 0 and 1 arrive as ints


@pytest.mark.parametrize("logprobs", [-1, 21, 2.5, True, "3"])
def test_logprobs_outside_zero_to_the_cap_is_refused_naming_it(logprobs: Any) -> None:
    with pytest.raises(InvalidRequestError) as info:
        LIMITS.validate([1, 2], SamplingParams(max_tokens=4, logprobs=logprobs))
    assert info.value.field_name == "logprobs"


@pytest.mark.parametrize("logprobs", [None, 0, 5, 20])
def test_logprobs_up_to_the_cap_is_accepted(logprobs: int | None) -> None:
    LIMITS.validate([1, 2], SamplingParams(max_tokens=4, logprobs=logprobs))
