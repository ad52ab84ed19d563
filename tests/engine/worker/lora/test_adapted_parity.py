"""Greedy output under an adapter equals the base model with that adapter merged into its weights."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.core.errors import InvalidRequestError
from engine.core.request import RequestMeta
from tests.engine.worker.lora.adapters import ALL_MODULES, ATTENTION_MODULES, CONFIGS, Adapted, build

SPECS = {"a": (8, ALL_MODULES, False), "b": (8, ["q_proj", "v_proj", "down_proj"], True)}
# Qwen3-MoE's MLPs are routed experts, which adapters do not target (engine/worker/lora/adapter.py refuses them).
MOE_SPECS = {"a": (8, ATTENTION_MODULES, False), "b": (8, ["q_proj", "v_proj"], True)}


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(5, 40))] for _ in range(n)]


def greedy(llm: LLM, items: list[list[int]], adapters: list[str | None], tokens: int = 8) -> list[list[int]]:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    metas = [RequestMeta(lora=name) for name in adapters]
    return [o.token_ids for o in llm.generate(items, [params] * len(items), metas)]


@pytest.fixture(scope="module", params=list(CONFIGS))
def adapted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Adapted:
    specs = MOE_SPECS if request.param == "qwen3_moe" else SPECS
    return build(tmp_path_factory.mktemp(request.param), request.param, specs)


def serving(adapted: Adapted, **config: object) -> LLM:
    lora = {name: str(path) for name, path in adapted.adapters.items()}
    return LLM(str(adapted.base), dtype="float32", lora=lora, **config)


def merged(path: Path, items: list[list[int]]) -> list[list[int]]:
    return greedy(LLM(str(path), dtype="float32"), items, [None] * len(items))


def test_adapter_matches_merged_weights(adapted: Adapted) -> None:
    items = prompts(3, seed=1)
    llm = serving(adapted, max_num_batched_tokens=16)  # chunked prefill too
    base = greedy(llm, items, [None] * 3)
    for name, path in adapted.merged.items():
        got = greedy(llm, items, [name] * 3)
        assert got == merged(path, items)
        assert got != base  # the adapter changed the output: the comparison can fail


@pytest.mark.parametrize("scheduling", ["off", "on"])
def test_mixed_batch_gives_each_request_its_own_output(adapted: Adapted, scheduling: str) -> None:
    items = prompts(6, seed=2)
    names: list[str | None] = ["a", None, "b", "b", None, "a"]
    llm = serving(adapted, max_num_seqs=8, async_scheduling=scheduling)
    together = greedy(llm, items, names)
    alone = [greedy(llm, [p], [n])[0] for p, n in zip(items, names, strict=True)]
    assert together == alone
    base = greedy(LLM(str(adapted.base), dtype="float32"), items, [None] * 6)
    assert [t for t, n in zip(together, names, strict=True) if n is None] == [base[1], base[4]]


def test_an_adapter_on_routed_experts_is_refused_naming_the_module(tmp_path: Path) -> None:
    """Adapters do not reach Qwen3-MoE's experts: one that targets their projections is refused at load, by
    name, rather than served without them."""
    built = build(tmp_path, "qwen3_moe", {"experts": (4, ["q_proj", "down_proj"], False)})
    llm = LLM(str(built.base), dtype="float32", lora={"experts": str(built.adapters["experts"])})
    with pytest.raises(
        InvalidRequestError, match=r"mlp\.experts\..*targets no projection this engine adapts"
    ) as refused:
        greedy(llm, prompts(1, seed=2), ["experts"])
    assert refused.value.field_name == "model"
