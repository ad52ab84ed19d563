"""Adapters at engine start: a broken directory fails only the requests naming it; KV is keyed per adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.core.errors import InvalidRequestError
from engine.core.request import RequestMeta
from tests.engine.worker.lora.adapters import ALL_MODULES, Adapted, build
from tests.engine.worker.lora.test_adapted_parity import greedy, merged, prompts


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> Adapted:
    return build(tmp_path_factory.mktemp("llama"), "llama", {"a": (4, ["q_proj", "v_proj"], False)})


def test_a_broken_adapter_fails_only_requests_naming_it(adapted: Adapted, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    llm = LLM(str(adapted.base), dtype="float32", lora={"a": str(adapted.adapters["a"]), "bad": str(broken)})
    params = SamplingParams(max_tokens=2, temperature=0.0)
    with pytest.raises(InvalidRequestError, match="adapter 'bad': cannot read adapter_model") as info:
        llm.engine.add_request("r1", [1, 2, 3], params, RequestMeta(lora="bad"))
    assert info.value.field_name == "model"
    with pytest.raises(InvalidRequestError, match="unknown LoRA adapter 'nope'"):
        llm.engine.add_request("r2", [1, 2, 3], params, RequestMeta(lora="nope"))
    served = llm.generate([[1, 2, 3]] * 2, params, [RequestMeta(lora="a"), RequestMeta()])
    assert [len(o.token_ids) for o in served] == [2, 2]


def test_a_rank_over_the_limit_is_refused_by_name(adapted: Adapted) -> None:
    llm = LLM(str(adapted.base), dtype="float32", lora={"a": str(adapted.adapters["a"])}, max_lora_rank=2)
    assert llm.engine.lora.failed == {"a": "adapter 'a': rank 4 exceeds max_lora_rank 2"}


def test_prefix_cache_is_not_shared_across_adapters(adapted: Adapted) -> None:
    llm = LLM(str(adapted.base), dtype="float32", lora={"a": str(adapted.adapters["a"])}, block_size=4)
    prompt = list(range(10, 40))
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    base_alone = LLM(str(adapted.base), dtype="float32", block_size=4).generate(prompt, params)[0]
    first = llm.generate(prompt, params, [RequestMeta(lora="a")])[0]
    base = llm.generate(prompt, params, [RequestMeta()])[0]
    again = llm.generate(prompt, params, [RequestMeta(lora="a")])[0]
    assert base.cached_tokens == 0  # the adapter's blocks were not reused for the base model
    assert base.token_ids == base_alone.token_ids
    assert again.cached_tokens > 0 and again.token_ids == first.token_ids  # but the adapter's own were


def test_adapters_of_different_ranks_share_one_stack_padded_to_the_largest(tmp_path: Path) -> None:
    """Rank 4 on every projection and rank 16 on q/v in one stack of r_max 16: each equals its merged model."""
    mixed = build(
        tmp_path, "llama", {"small": (4, ALL_MODULES, False), "large": (16, ["q_proj", "v_proj"], True)}
    )
    llm = LLM(
        str(mixed.base), dtype="float32", lora={name: str(path) for name, path in mixed.adapters.items()}
    )
    items = prompts(2, seed=3)
    together = greedy(llm, items + items, ["small", "small", "large", "large"])
    assert together == merged(mixed.merged["small"], items) + merged(mixed.merged["large"], items)
    assert llm.engine.lora is not None
    stack = llm.engine.lora.stack.stack
    assert stack is not None and stack.max_rank == 16
    assert sorted(name for name in stack.resident if name) == ["large", "small"]
