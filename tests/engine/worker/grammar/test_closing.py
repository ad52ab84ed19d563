"""Closing a constrained output before its budget ends (engine/worker/grammar/closing.py): the mask is narrowed,
by where the output is, to the tokens that end it; so an unbounded schema on the random built-in model
still ends in JSON that parses, greedy or sampled, instead of a string cut at max_tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import BaseModel

from engine import LLM, FinishReason, RequestMeta, SamplingParams
from engine.core.request import Request
from engine.core.sampling_params import Grammar
from engine.core.tokenizer import Tokenizer
from engine.worker.grammar.closing import IN_STRING, OUTSIDE, Closers, closing_budget, is_closing


class Person(BaseModel):
    """Unbounded: nothing in the schema ends the name, the number or the list."""

    name: str
    age: int
    tags: list[str]


GRAMMAR = Grammar("json_schema", json.dumps(Person.model_json_schema()), "response_format")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    return LLM(cache_dir=str(tmp_path_factory.mktemp("closing") / "model"))


def _words(vocab_size: int, allowed: list[int]) -> np.ndarray:
    words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
    for token in allowed:
        words.view(np.uint32)[token >> 5] |= np.uint32(1) << np.uint32(token & 31)
    return words


def _allowed(words: np.ndarray, vocab_size: int) -> list[int]:
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size]
    return [int(t) for t in np.flatnonzero(bits)]


def test_the_mask_narrows_to_what_ends_the_output_where_it_is(llm: LLM) -> None:
    tokenizer: Tokenizer = llm.engine.tokenizer
    vocab = llm.engine.vocab_size
    eos = sorted(llm.engine.eos_token_ids)
    closers = Closers(tokenizer.token_bytes, vocab, eos)
    ids = {ch: tokenizer.encode(ch)[-1] for ch in ('"', "}", "]", ",", "a", "7")}
    candidates = [ids[ch] for ch in ('"', "}", "]", ",", "a", "7")]
    # In a string: only the closing quote (a `}` there is just a character).
    words = _words(vocab, candidates)
    closers.narrow(words, IN_STRING)
    assert _allowed(words, vocab) == [ids['"']]
    # Outside: end of sequence first, then `}` and `]`, then a comma; nothing of theirs allowed: untouched.
    words = _words(vocab, [*candidates, eos[0]])
    closers.narrow(words, OUTSIDE)
    assert _allowed(words, vocab) == [eos[0]]
    words = _words(vocab, candidates)
    closers.narrow(words, OUTSIDE)
    assert _allowed(words, vocab) == sorted([ids["}"], ids["]"]])
    words = _words(vocab, [ids[","], ids["7"]])
    closers.narrow(words, OUTSIDE)
    assert _allowed(words, vocab) == [ids[","]]
    words = _words(vocab, [ids["a"], ids["7"]])
    closers.narrow(words, OUTSIDE)
    assert _allowed(words, vocab) == sorted([ids["a"], ids["7"]])


def test_the_lexer_follows_strings_and_escapes_token_by_token(llm: LLM) -> None:
    tokenizer: Tokenizer = llm.engine.tokenizer
    closers = Closers(tokenizer.token_bytes, llm.engine.vocab_size, [])
    request = Request("r", [1, 2], SamplingParams(max_tokens=64), RequestMeta(tenant_id="t"))
    states = []
    for text in ['{"name":"a', '\\"', "b", '"', ',"x":[']:
        request.output_token_ids.extend(tokenizer.encode(text))
        states.append(closers.state(request))
    assert states == [IN_STRING, IN_STRING, IN_STRING, OUTSIDE, OUTSIDE]


def test_the_closing_stretch_is_a_quarter_of_the_budget_or_enough_for_a_small_one() -> None:
    assert closing_budget(2000) == 500
    assert closing_budget(120) == 64
    assert closing_budget(40) == 30


@pytest.mark.parametrize("reserve", [0, 14])
def test_the_stretch_starts_earlier_by_what_the_grammar_forces_after_the_json(reserve: int) -> None:
    # A tool call's `}\n</tool_call>` and end of sequence (gateway/openai/tools.py) must fit after the JSON.
    grammar = Grammar("lark", "start: x", "tools", closing_reserve=reserve)
    request = Request(
        "r", [1, 2], SamplingParams(max_tokens=400, grammar=grammar), RequestMeta(tenant_id="t")
    )
    start = 400 - closing_budget(400) - reserve  # output tokens before the stretch
    request.output_token_ids.extend([3] * (start - 1))
    assert not is_closing(request, 4096)
    request.output_token_ids.append(3)
    assert is_closing(request, 4096)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("max_tokens", [40, 120, 400])
def test_an_unbounded_schema_ends_in_json_that_validates(
    llm: LLM, temperature: float, max_tokens: int
) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=7, grammar=GRAMMAR)
    out = llm.generate(["Describe a person."], params)[0]
    assert out.finish_reason == FinishReason.STOP, out.text
    Person.model_validate_json(out.text)
