"""Several choices per request (n > 1): one prefill forked into n sequences that share the prompt's KV
blocks by reference count, each decoding, stopping, charged and preempted on its own."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import torch

from engine.config import EngineConfig
from engine.core.errors import InvalidRequestError
from engine.core.family import choice_seed
from engine.core.request import FinishReason, RequestMeta
from engine.core.sampling_params import Grammar, SamplingParams
from engine.serving.llm import LLM
from engine.serving.llm_engine import LLMEngine

PROMPT = "the quick brown fox jumps over the lazy dog and a"  # not a whole number of 4-token blocks
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _engine(**overrides: Any) -> LLMEngine:
    config: dict[str, Any] = {"num_kv_blocks": 128, "block_size": 4, "enable_prefix_caching": False}
    config.update(overrides)
    return LLMEngine(EngineConfig(model=None, **config))


Choices = dict[int, tuple[list[int], str, FinishReason | None]]


def _run(engine: LLMEngine, request_id: str = "r") -> tuple[Choices, Any]:
    """Step until `request_id` ends: each choice's tokens, text and finish reason, and the last metrics."""
    tokens: dict[int, list[int]] = {}
    texts: dict[int, str] = {}
    reasons: dict[int, FinishReason | None] = {}
    finished = None
    while engine.has_unfinished():
        for out in engine.step_deltas():
            assert out.request_id == request_id
            assert finished is None, "an output after the request's last"
            tokens.setdefault(out.index, []).extend(out.new_token_ids)
            texts[out.index] = texts.get(out.index, "") + out.delta_text
            if out.finish_reason is not None:
                assert out.index not in reasons, "a choice ended twice"
                reasons[out.index] = out.finish_reason
            if out.finished:
                finished = out.metrics
    return {i: (tokens[i], texts[i], reasons.get(i)) for i in sorted(tokens)}, finished


def _single(engine: LLMEngine, params: SamplingParams, prompt: str = PROMPT) -> list[int]:
    engine.add_request("one", prompt, params)
    choices, _ = _run(engine, "one")
    return choices[0][0]


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("async_scheduling", ["off", "on"])
def test_greedy_choices_each_equal_the_single_request(prefix_caching: bool, async_scheduling: str) -> None:
    engine = _engine(enable_prefix_caching=prefix_caching, async_scheduling=async_scheduling)
    reference = _single(_engine(), GREEDY)
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, n=3))
    choices, metrics = _run(engine)
    assert sorted(choices) == [0, 1, 2]
    assert all(tokens == reference for tokens, _, _ in choices.values())
    assert all(reason is FinishReason.LENGTH for _, _, reason in choices.values())
    assert metrics.completion_tokens == 3 * 8
    engine.pool.check_invariants()
    assert engine.pool.num_free == engine.pool.num_blocks, "a block leaked"
    engine.close()


def test_forked_choices_share_every_prompt_block_and_copy_the_partial_one_when_written() -> None:
    engine = _engine()
    prompt = engine.encode(PROMPT)
    assert len(prompt) % 4 != 0
    engine.add_request("r", prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, n=3))
    while not all(f"r{s}" in engine.scheduler.requests for s in ("#1", "#2")):
        engine.step_deltas()
    # Forked in the step that computed the leader's last prompt token: every block shared, none computed.
    ids = ("r", "r#1", "r#2")
    tables = [list(engine.pool.block_ids(rid)) for rid in ids]
    blocks = -(-len(prompt) // 4)
    assert tables[0] == tables[1] == tables[2] and len(tables[0]) == blocks
    assert all(engine.pool.blocks[b].ref_count == 3 for b in tables[0])
    assert all(engine.scheduler.requests[rid].num_computed_tokens == len(prompt) for rid in ids)
    assert all(len(engine.scheduler.requests[rid].output_token_ids) == 1 for rid in ids)
    shared = tables[0][-1]
    written = len(prompt) % 4  # the prompt's positions in its partial last block
    layers = engine.runner.main_layers
    before = {
        layer: [t[shared, :written].clone() for t in engine.runner.kv_caches[layer]] for layer in layers
    }
    engine.step_deltas()  # each choice's first decode writes into that block: two of them copy it first
    tables = [list(engine.pool.block_ids(rid)) for rid in ids]
    tails = [t[blocks - 1] for t in tables]
    assert len(set(tails)) == 3 and shared in tails
    assert all(engine.pool.blocks[b].ref_count == 1 for b in tails)
    assert tables[0][:-2] == tables[1][:-2] == tables[2][:-2]  # the full blocks stay shared
    for layer in layers:
        for tensor, kept in zip(engine.runner.kv_caches[layer], before[layer], strict=True):
            assert all(torch.equal(tensor[tail, :written], kept) for tail in tails)
    engine.pool.check_invariants()
    _run(engine)
    assert engine.pool.num_free == engine.pool.num_blocks
    engine.close()


@pytest.mark.parametrize("async_scheduling", ["off", "on"])
def test_no_choice_recomputes_a_prompt_token(async_scheduling: str) -> None:
    engine = _engine(async_scheduling=async_scheduling)
    prompt = engine.encode(PROMPT)
    engine.add_request("r", prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, n=4))
    _run(engine)
    assert sum(t.prefill_tokens for t in engine.traces) == len(prompt)
    engine.close()


def test_seeded_choices_each_equal_a_single_request_of_their_seed() -> None:
    """Each choice samples its first token from the leader's last prompt row with its own seed: exactly what
    a request of that seed alone samples from its own prefill."""
    params: dict[str, Any] = {"max_tokens": 10, "temperature": 1.0, "ignore_eos": True}
    engine = _engine()
    engine.add_request("r", PROMPT, SamplingParams(**params, seed=11, n=3))
    choices, _ = _run(engine)
    alone = [_single(_engine(), SamplingParams(**params, seed=choice_seed(11, i))) for i in range(3)]
    assert [choices[i][0] for i in range(3)] == alone
    engine.close()


@pytest.mark.parametrize("async_scheduling", ["off", "on"])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_aborting_the_request_ends_every_choice_and_frees_every_block(
    steps: int, async_scheduling: str
) -> None:
    engine = _engine(async_scheduling=async_scheduling)
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, n=3))
    outputs = [out for _ in range(steps) for out in engine.step_deltas()]
    assert engine.abort_request("r")
    choices, metrics = _run(engine)
    ended = {out.index for out in outputs if out.finish_reason is not None}
    assert not ended
    assert {i: reason for i, (_, _, reason) in choices.items()} == dict.fromkeys(
        range(3), FinishReason.CANCELLED
    )
    assert metrics is not None
    engine.pool.check_invariants()
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.scheduler.requests
    engine.close()


def test_aborting_after_choice_zero_ended_still_ends_the_others() -> None:
    engine = _engine()
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, n=3))
    while "r#2" not in engine.scheduler.requests:
        engine.step_deltas()
    engine.scheduler.finish(engine.scheduler.requests["r"], FinishReason.STOP)  # choice 0 ends first
    assert engine.abort_request("r")
    choices, _ = _run(engine)
    assert [reason for _, _, reason in choices.values()] == [
        FinishReason.STOP,
        FinishReason.CANCELLED,
        FinishReason.CANCELLED,
    ]
    assert not engine.abort_request("r") and not engine.scheduler.families
    assert engine.pool.num_free == engine.pool.num_blocks
    engine.close()


def test_seeded_choices_differ_and_choice_zero_is_the_single_request() -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    reference = _single(_engine(), params)
    engine = _engine()
    engine.add_request(
        "r", PROMPT, SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True, n=3)
    )
    choices, _ = _run(engine)
    assert choices[0][0] == reference
    assert len({tuple(tokens) for tokens, _, _ in choices.values()}) == 3
    engine.close()


def test_each_choice_stops_on_its_own() -> None:
    params: dict[str, Any] = {"max_tokens": 12, "temperature": 1.0, "seed": 3, "ignore_eos": True, "n": 2}
    engine = _engine()
    engine.add_request("r", PROMPT, SamplingParams(**params))
    free, _ = _run(engine)
    text0, text1 = free[0][1], free[1][1]
    stop = next(c for c in text0 if c.strip() and c not in text1)  # ends choice 0, never choice 1
    engine.add_request("r", PROMPT, SamplingParams(**params, stop=[stop]))
    choices, metrics = _run(engine)
    assert choices[0][2] is FinishReason.STOP and choices[0][1] == text0[: text0.index(stop)]
    assert choices[1][2] is FinishReason.LENGTH and choices[1][1] == text1
    assert metrics.completion_tokens == len(choices[0][0]) + len(choices[1][0])
    engine.close()


def test_n_choices_are_charged_one_prefill_and_n_decodes() -> None:
    # The token formula alone: the step's work charged on top of it is tests/engine/core/test_step_cost.py's.
    engine = _engine(step_cost_charge=False)
    prompt = engine.encode(PROMPT)
    engine.add_request("r", prompt, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, n=4))
    _, metrics = _run(engine)
    w_in, w_out = engine.config.fairness.w_in, engine.config.fairness.w_out
    one_prefill = w_in * len(prompt) + w_out * 4 * 5
    assert metrics.charged_service == pytest.approx(one_prefill)
    assert engine.policy.service()["default"] == pytest.approx(one_prefill)
    assert one_prefill < w_in * 4 * len(prompt) + w_out * 4 * 5  # not four prefills
    engine.close()


@pytest.mark.parametrize("async_scheduling", ["off", "on"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_choices_resume_with_the_unpreempted_output(mode: str, async_scheduling: str) -> None:
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    reference = _single(_engine(), params)
    # Each choice grows to ~36 tokens (9 blocks of 4): 20 blocks cannot hold three.
    engine = _engine(num_kv_blocks=20, preemption_mode=mode, async_scheduling=async_scheduling)
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, n=3))
    choices, metrics = _run(engine)
    assert metrics.preemptions > 0, "the pool must be too small for the three choices"
    assert all(tokens == reference for tokens, _, _ in choices.values())
    engine.pool.check_invariants()
    assert engine.pool.num_free == engine.pool.num_blocks
    engine.close()


def test_n_over_the_cap_is_refused_naming_n() -> None:
    engine = _engine()
    with pytest.raises(InvalidRequestError) as over:
        engine.add_request("r", PROMPT, SamplingParams(n=9))
    assert over.value.field_name == "n"
    with pytest.raises(InvalidRequestError) as zero:
        engine.add_request("r", PROMPT, SamplingParams(n=0))
    assert zero.value.field_name == "n"
    meta = RequestMeta(kv_handoff="hold")
    with pytest.raises(InvalidRequestError) as split:
        engine.add_request("r", PROMPT, SamplingParams(n=2), meta)
    assert split.value.field_name == "n"
    engine.close()
    narrow = _engine(max_num_seqs=2)  # every choice needs a seat at once
    with pytest.raises(InvalidRequestError) as seats:
        narrow.add_request("r", PROMPT, SamplingParams(n=3))
    assert seats.value.field_name == "n" and not narrow.has_unfinished()
    narrow.close()
    with pytest.raises(ValueError, match="n > 1"):
        LLM(None, num_kv_blocks=32).generate(PROMPT, SamplingParams(n=2))


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "maximum": 99}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("async_scheduling", ["off", "on"])
def test_choices_under_a_grammar_each_follow_it(async_scheduling: str) -> None:
    """One compile, a matcher per choice: every seeded choice is valid JSON of the schema, and they differ."""
    engine = _engine(async_scheduling=async_scheduling)
    grammar = Grammar("json_schema", json.dumps(SCHEMA), "response_format")
    engine.add_request(
        "r", PROMPT, SamplingParams(max_tokens=60, temperature=1.0, seed=3, n=3, grammar=grammar)
    )
    choices: dict[int, list[int]] = {}
    while engine.has_unfinished():
        assert not engine.take_refused()
        for out in engine.step_deltas():
            choices.setdefault(out.index, []).extend(out.new_token_ids)
    texts = [engine.tokenizer.decode(choices[i]) for i in range(3)]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) == 3
    assert engine.pool.num_free == engine.pool.num_blocks
    engine.close()


def test_a_grammar_that_fails_refuses_the_request_once_with_all_its_choices() -> None:
    engine = _engine()
    field = "response_format.json_schema.schema"
    bad = Grammar("json_schema", json.dumps({"type": "array", "uniqueItems": True}), field)
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=8, n=3, grammar=bad))
    refused: list[tuple[str, InvalidRequestError]] = []
    while engine.has_unfinished():
        engine.step_deltas()
        refused += engine.take_refused()
    assert [request_id for request_id, _ in refused] == ["r"]
    assert refused[0][1].field_name == field and "uniqueItems" in str(refused[0][1])
    assert (
        not engine.scheduler.requests
        and not engine._streams
        and engine.pool.num_free == engine.pool.num_blocks
    )
    engine.close()


@pytest.mark.parametrize("cached", [False, True])
def test_aborting_a_request_held_for_its_grammar_ends_every_choice(cached: bool) -> None:
    """Aborted while its grammar compiles (or, cached, before its first step): every choice ends cancelled
    and no choice's matcher is left behind."""
    engine = _engine()
    grammar = Grammar("json_schema", json.dumps(SCHEMA), "response_format")
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=5, n=3, grammar=grammar)
    if cached:  # a first request compiles the grammar; the second gets its matchers at once
        engine.add_request("r", PROMPT, params)
        _run(engine)
    engine.add_request("r", PROMPT, params)
    assert engine.grammar.waiting == (0 if cached else 1)
    assert engine.abort_request("r")
    choices, metrics = _run(engine)
    assert {i: reason for i, (_, _, reason) in choices.items()} == dict.fromkeys(
        range(3), FinishReason.CANCELLED
    )
    assert metrics is not None and not engine.take_refused()
    assert not engine.grammar.masks and not engine._streams and not engine.scheduler.requests
    assert engine.pool.num_free == engine.pool.num_blocks
    engine.close()
