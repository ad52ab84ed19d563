"""An adapter's requests are charged its rank-aware factor per token (docs/fairness.md)."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.core.request import RequestMeta
from engine.worker.lora.cost import base_linear_flops
from tests.engine.test_choices import _run
from tests.engine.worker.lora.adapters import Adapted, build


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> Adapted:
    return build(tmp_path_factory.mktemp("llama"), "llama", {"a": (8, ["q_proj", "down_proj"], False)})


def _scale(llm: LLM, adapted: Adapted) -> float:
    """The service factor of adapter `a`, loaded at engine start."""
    loaded = llm.engine.lora.host.get(("a", str(adapted.adapters["a"])))
    assert loaded is not None
    return loaded.service_scale


def test_the_factor_counts_rank_and_targeted_shapes(adapted: Adapted) -> None:
    llm = LLM(str(adapted.base), dtype="float32", lora={"a": str(adapted.adapters["a"])})
    cfg = llm.engine.loaded.config
    # hidden 64, 4 heads of 16, 2 KV heads, intermediate 128, vocab 300, 2 layers.
    assert base_linear_flops(cfg) == 2 * (64 * 300 + 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128))
    extra = 2 * 2 * 8 * ((64 + 64) + (128 + 64))  # two layers of q_proj and down_proj at rank 8
    loaded = llm.engine.lora.host.get(("a", str(adapted.adapters["a"])))
    assert loaded is not None and loaded.service_scale == 1 + extra / base_linear_flops(cfg)


@pytest.mark.parametrize("async_scheduling", ["off", "on"])
def test_an_adapted_tenant_is_charged_the_factor(adapted: Adapted, async_scheduling: str) -> None:
    llm = LLM(
        str(adapted.base),
        dtype="float32",
        lora={"a": str(adapted.adapters["a"])},
        async_scheduling=async_scheduling,
    )
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    metas = [RequestMeta(tenant_id="adapted", lora="a"), RequestMeta(tenant_id="plain")]
    llm.generate([list(range(20, 40))] * 2, params, metas)
    service = llm.engine.policy.service()
    scale = _scale(llm, adapted)
    assert scale > 1
    assert service["adapted"] == pytest.approx(scale * service["plain"])


def test_n_choices_under_an_adapter_each_equal_the_single_request_and_are_charged_the_factor(
    adapted: Adapted,
) -> None:
    # Prefix caching off: the single request's blocks would otherwise make the n = 3 prompt a cache hit.
    llm = LLM(
        str(adapted.base),
        dtype="float32",
        lora={"a": str(adapted.adapters["a"])},
        block_size=4,
        enable_prefix_caching=False,
        step_cost_charge=False,  # the token formula alone: the step's work is tests/engine/core/test_step_cost.py's
    )
    engine, meta = llm.engine, RequestMeta(lora="a")
    prompt = list(range(50, 71))  # 21 tokens: the choices fork after 5 full blocks and own the partial one
    single = llm.generate(prompt, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True), [meta])[0]
    before = engine.policy.service()["default"]
    engine.add_request("r", prompt, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, n=3), meta)
    choices, metrics = _run(engine)
    assert [tokens for tokens, _, _ in choices.values()] == [single.token_ids] * 3
    w_in, w_out = engine.config.fairness.w_in, engine.config.fairness.w_out
    charged = _scale(llm, adapted) * (w_in * len(prompt) + w_out * 3 * 5)
    assert engine.policy.service()["default"] - before == pytest.approx(charged)
    assert metrics.charged_service == pytest.approx(charged)
