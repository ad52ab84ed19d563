"""Penalties, min-p and logit bias in the batched sampler, checked against transformers' logits processors on
the same logits: the distribution a row samples from (what `logprobs` reports over the whole vocabulary) is
the one transformers' processors give, row by row, in a batch that mixes them with plain rows."""

from __future__ import annotations

from typing import cast

import pytest
import torch
from transformers import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
)

from engine.core.errors import InvalidRequestError
from engine.core.request import Request, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.worker.sampler import Sampler

VOCAB = 64
PROMPT = [3, 5, 5, 9, 11]


def _logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _request(rid: str, **params: float | int | dict[int, float] | None) -> Request:
    return Request(rid, list(PROMPT), SamplingParams(logprobs=VOCAB, **params), RequestMeta())  # type: ignore[arg-type]


def _reported(sampler: Sampler, rid: str) -> torch.Tensor:
    """The row's whole distribution as `logprobs` reported it, by token id."""
    lp = sampler.last_logprobs[rid]
    out = torch.full((VOCAB,), float("-inf"))
    out[torch.tensor(lp.top_ids)] = torch.tensor(lp.top_logprobs, dtype=torch.float32)
    return out


def _presence_frequency(
    scores: torch.Tensor, output: list[int], presence: float, frequency: float
) -> torch.Tensor:
    """OpenAI's definition, token by token (transformers has no processor for these two)."""
    scores = scores.clone()
    for token in set(output):
        scores[token] -= frequency * output.count(token) + presence
    return scores


def _steps(sampler: Sampler, requests: list[Request], steps: int) -> torch.Tensor:
    """Sample `steps` times, each sampled token landing in its request's output as the engine lands it;
    returns the last step's logits."""
    logits = _logits(len(requests), 0)
    for step in range(steps):
        logits = _logits(len(requests), step)
        for request, token in zip(requests, sampler.sample(logits, requests), strict=True):
            if step < steps - 1:
                request.output_token_ids.append(token)
    return logits


@pytest.mark.parametrize("greedy", [True, False])
def test_penalties_match_transformers_over_prompt_and_output(greedy: bool) -> None:
    temperature = 0.0 if greedy else 1.0
    rows = [
        {"repetition_penalty": 1.3},
        {"repetition_penalty": 0.7, "presence_penalty": 0.5},
        {},  # a plain row in the same batch
        {"frequency_penalty": 1.5},
        {"presence_penalty": -1.0, "frequency_penalty": 0.4, "repetition_penalty": 1.9},
    ]
    requests = [_request(f"r{i}", temperature=temperature, seed=i, **p) for i, p in enumerate(rows)]
    sampler = Sampler(0)
    logits = _steps(sampler, requests, 6)
    for row, (request, params) in enumerate(zip(requests, rows, strict=True)):
        history = torch.tensor([request.prompt_token_ids + request.output_token_ids])
        want = logits[row : row + 1].clone()
        want = RepetitionPenaltyLogitsProcessor(params.get("repetition_penalty", 1.0))(history, want)[0]
        want = _presence_frequency(
            want,
            request.output_token_ids,
            params.get("presence_penalty", 0.0),
            params.get("frequency_penalty", 0.0),
        )
        torch.testing.assert_close(_reported(sampler, request.request_id), torch.log_softmax(want, -1))


def test_a_greedy_row_with_a_repetition_penalty_is_not_the_plain_argmax() -> None:
    logits = torch.zeros(2, VOCAB)
    logits[:, 5] = 2.0  # a prompt token, most likely
    logits[:, 20] = 1.5
    plain = Request("plain", list(PROMPT), SamplingParams(temperature=0.0), RequestMeta())
    penalized = Request(
        "pen", list(PROMPT), SamplingParams(temperature=0.0, repetition_penalty=2.0), RequestMeta()
    )
    assert Sampler(0).sample(logits[:1], [plain]) == [5]
    assert Sampler(0).sample(logits, [plain, penalized]) == [5, 20]  # 2.0 / 2 < 1.5


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_min_p_matches_transformers_after_temperature(temperature: float) -> None:
    rows = [0.05, 0.0, 0.3, 0.9]
    requests = [_request(f"m{i}", temperature=temperature, min_p=m, seed=i) for i, m in enumerate(rows)]
    sampler = Sampler(0)
    logits = _logits(len(rows), 7)
    sampler.sample(logits, requests)
    ids = cast(torch.LongTensor, torch.tensor([PROMPT]))
    for row, min_p in enumerate(rows):
        want = TemperatureLogitsWarper(temperature)(ids, logits[row : row + 1].clone())
        if min_p:
            want = MinPLogitsWarper(min_p)(ids, want)
        torch.testing.assert_close(_reported(sampler, f"m{row}"), torch.log_softmax(want[0], -1))


def test_logit_bias_matches_transformers_sequence_bias() -> None:
    bias = {4: 5.0, 17: -100.0, 30: 2.5}
    requests = [_request("b", temperature=1.0, logit_bias=bias), _request("p", temperature=1.0)]
    sampler = Sampler(0)
    logits = _logits(2, 3)
    sampler.sample(logits, requests)
    processor = SequenceBiasLogitsProcessor(sequence_bias=[[[t], v] for t, v in bias.items()])
    want = processor(torch.tensor([PROMPT]), logits[0:1].clone())[0]
    torch.testing.assert_close(_reported(sampler, "b"), torch.log_softmax(want, -1))
    torch.testing.assert_close(_reported(sampler, "p"), torch.log_softmax(logits[1], -1))


def test_each_request_counts_only_its_own_tokens() -> None:
    # Two requests of one prompt, one forked later: each counts its own output, not the other's.
    a = _request("a", temperature=0.0, frequency_penalty=2.0)
    b = _request("b", temperature=0.0, frequency_penalty=2.0)
    sampler = Sampler(0)
    logits = torch.zeros(2, VOCAB)
    logits[:, 40] = 1.0
    assert sampler.sample(logits, [a, b]) == [40, 40]
    logits_a_only = torch.zeros(1, VOCAB)
    logits_a_only[0, 40] = 1.0
    assert sampler.sample(logits_a_only, [a]) != [40]  # its own 40 costs it 2.0
    assert sampler.sample(logits, [a, b])[1] != 40 and _reported(sampler, "b")[40] < 0  # b's own single 40
    sampler.forget("a")
    assert "a" not in sampler._outputs and "a" not in sampler._prompts


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", 100.5),
        ("min_p", -0.1),
        ("min_p", 1.01),
        ("presence_penalty", float("nan")),
    ],
)
def test_out_of_bounds_values_name_their_field(field: str, value: float) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        SamplingParams(**{field: value}).validate()  # type: ignore[arg-type]
    assert refused.value.field_name == field
