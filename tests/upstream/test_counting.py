"""What a request to an upstream model is billed: the engine's usage when it sends one, the gateway's count
(never 0, and marked as the gateway's) when it does not (upstream/pending.py)."""

from __future__ import annotations

from engine.core.request import RequestMeta
from engine.core.sampling_params import SamplingParams
from upstream.call import Chunk, Usage
from upstream.pending import Pending


def pending() -> Pending:
    return Pending("r", RequestMeta(tenant_id="A"), [1, 2, 3, 4], SamplingParams(max_tokens=8), "abcd")


def test_running_usage_counts_each_chunks_tokens_as_the_engine_does() -> None:
    p = pending()
    assert p.new_output_tokens(Chunk("ab", None, Usage(4, 2)), local_count=1, continuous=True) == 2
    assert p.new_output_tokens(Chunk("c", None, Usage(4, 3)), local_count=1, continuous=True) == 1
    assert p.new_output_tokens(Chunk("", "length", Usage(4, 5)), local_count=0, continuous=True) == 2
    p.text = "abc"
    assert p.final_counts(local_total=3) == (4, 5, False)


def test_without_usage_the_gateways_count_stands_and_says_so() -> None:
    p = pending()
    for text in ("a", "b", "c"):
        p.new_output_tokens(Chunk(text, None, None), local_count=1, continuous=False)
        p.text += text
    prompt, completion, by_gateway = p.final_counts(local_total=3)
    assert (prompt, completion, by_gateway) == (4, 3, True)
    p.counted_by_gateway = by_gateway
    assert p.metrics(completion, finished=True).counted_by_gateway


def test_a_final_usage_from_an_engine_that_sends_no_running_usage_is_the_bill() -> None:
    p = pending()
    p.new_output_tokens(Chunk("abc", None, None), local_count=2, continuous=False)  # the gateway's guess
    p.new_output_tokens(Chunk("", None, Usage(5, 3)), local_count=0, continuous=False)
    p.text = "abc"
    assert p.final_counts(local_total=2) == (5, 3, False)
