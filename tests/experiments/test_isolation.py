"""experiments.isolation's heavy neighbour is exactly the heaviest request the caps allow, and parses at the edge."""

from __future__ import annotations

import pytest

from engine.core.errors import InvalidRequestError
from engine.core.limits import RequestCaps, RequestLimits
from experiments.isolation import heavy_parameters
from gateway.openai.schemas import CompletionRequest


def test_the_heavy_neighbour_sits_exactly_at_the_caps() -> None:
    caps = RequestCaps()
    heavy = heavy_parameters(caps, vocab_size=262)
    body = CompletionRequest.model_validate({"model": "m", "prompt": "x", **heavy})
    params = body.sampling(8)
    limits = RequestLimits(vocab_size=262, max_model_len=2048, block_size=16, num_kv_blocks=1024, caps=caps)
    limits.validate([1, 2, 3], params)  # accepted
    assert len(params.stop) == caps.max_stop_strings and max(map(len, params.stop)) == caps.max_stop_chars
    assert len(params.stop_token_ids) == caps.max_stop_token_ids
    one_more = RequestCaps(max_stop_strings=caps.max_stop_strings - 1)
    with pytest.raises(InvalidRequestError):
        RequestLimits(262, 2048, 16, 1024, one_more).validate([1, 2, 3], params)
