"""A fault a request brings into the step fails that request alone (issue 54, point 1): its adapter (weights
that overflow in the forward, a scale its device slot cannot hold), its grammar's mask, its sampling
parameters. The poisoned request ends with finish_reason "error" and a RequestFault naming its field; the
healthy requests of other tenants in the same steps produce exactly the tokens they produce without it; a
faulty adapter is refused at once on its next use until it is registered again."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, FinishReason, InvalidRequestError, LLMEngine, RequestMeta, SamplingParams
from engine.core.sampling_params import Grammar
from engine.worker.lora.intake import load_to_host
from tests.engine.worker.lora.adapters import Adapted, build

PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = {"a": list(range(10, 30)), "b": list(range(40, 47)), "c": list(range(60, 75))}
POISON_PROMPT = list(range(80, 95))


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> Adapted:
    root = tmp_path_factory.mktemp("llama")
    adapted = build(root, "llama", {"good": (4, ["q_proj", "v_proj", "down_proj"], False)})
    hot = root / "adapter-hot"  # finite weights (it passes every load check) that overflow in the forward
    shutil.copytree(adapted.adapters["good"], hot)
    tensors = load_file(str(hot / "adapter_model.safetensors"))
    save_file({k: v * 1e30 for k, v in tensors.items()}, str(hot / "adapter_model.safetensors"))
    adapted.adapters["hot"] = hot
    return adapted


def _engine(adapted: Adapted, async_scheduling: str) -> LLMEngine:
    return LLM(
        str(adapted.base), dtype="float32", num_kv_blocks=96, block_size=4, async_scheduling=async_scheduling
    ).engine


def _healthy(engine: LLMEngine, adapted: Adapted) -> None:
    """Three tenants: two on the base model, one on a good adapter."""
    good = RequestMeta(tenant_id="c", lora="good", lora_path=str(adapted.adapters["good"]))
    engine.add_request("a", PROMPTS["a"], PARAMS, RequestMeta(tenant_id="a"))
    engine.add_request("b", PROMPTS["b"], PARAMS, RequestMeta(tenant_id="b"))
    engine.add_request("c", PROMPTS["c"], PARAMS, good)


@dataclass
class Seen:
    """What stepping an engine to the end produced: tokens by request, and each end (reason, fault or error)."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    ends: dict[str, tuple[FinishReason | str | None, Any]] = field(default_factory=dict)


def _run(engine: LLMEngine) -> Seen:
    """Step to the end."""
    seen = Seen()
    while engine.has_unfinished():
        for out in engine.step():
            seen.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                seen.ends[out.request_id] = (out.finish_reason, out.fault)
        for request_id, exc in engine.take_refused():
            seen.ends[request_id] = ("refused", exc)
    return seen


def _hot(adapted: Adapted, engine: LLMEngine) -> tuple[RequestMeta, SamplingParams, str]:
    meta = RequestMeta(tenant_id="p", lora="hot", lora_path=str(adapted.adapters["hot"]), lora_registered="1")
    return meta, PARAMS, "model"


def _overflowing_scale(adapted: Adapted, engine: LLMEngine) -> tuple[RequestMeta, SamplingParams, str]:
    """An adapter in host memory whose scale the float32 slot cannot take (what `lora_alpha: 1e308` was
    before the load checks refused it): the slot copy raises inside the scheduler's admission."""
    path = str(adapted.adapters["good"]) + "/."  # its own key: the good adapter stays usable
    adapter = load_to_host(engine.loaded.config, 64, engine.loaded.dtype, "huge", path)
    adapter.scale = 1e308
    engine.lora.host.put(("huge", path), adapter)
    return RequestMeta(tenant_id="p", lora="huge", lora_path=path, lora_registered="1"), PARAMS, "model"


def _grammar(adapted: Adapted, engine: LLMEngine) -> tuple[RequestMeta, SamplingParams, str]:
    grammar = Grammar("json_schema", json.dumps({"type": "object"}))
    params = SamplingParams(max_tokens=8, temperature=0.0, grammar=grammar)
    engine.add_request("warm", POISON_PROMPT, params, RequestMeta(tenant_id="p"))
    _run(engine)  # compiled and cached: the poisoned request gets its matcher as it is added
    return RequestMeta(tenant_id="p"), params, "response_format"


def _logit_bias(adapted: Adapted, engine: LLMEngine) -> tuple[RequestMeta, SamplingParams, str]:
    return RequestMeta(tenant_id="p"), SamplingParams(max_tokens=8, temperature=0.5, seed=3), "logit_bias"


def _break_matcher(engine: LLMEngine) -> None:
    """The grammar fault: the poisoned request's real matcher driven into its error state (a control
    character, which no JSON allows anywhere), as a mask over llguidance's limits leaves it."""
    masks = engine.runner.grammar
    assert masks is not None
    matcher = masks._matchers["poison"]
    assert not matcher.consume_token(engine.tokenizer.encode("\x01")[-1]) and matcher.is_error()


def _break_bias(engine: LLMEngine) -> None:
    """The sampling fault: a bias outside the vocabulary, which validation would have refused."""
    engine.scheduler.requests["poison"].sampling.logit_bias = {10**6: 1.0}


FAULTS = {
    "adapter weights": (_hot, None),
    "adapter scale": (_overflowing_scale, None),
    "grammar mask": (_grammar, _break_matcher),
    "logit_bias": (_logit_bias, _break_bias),
}


@pytest.mark.parametrize("async_scheduling", ["off", "on"])
@pytest.mark.parametrize("kind", list(FAULTS))
def test_a_poisoned_request_fails_alone_and_the_others_tokens_are_unchanged(
    adapted: Adapted, kind: str, async_scheduling: str
) -> None:
    alone = _engine(adapted, async_scheduling)
    _healthy(alone, adapted)
    expected = _run(alone).tokens
    assert {k: len(v) for k, v in expected.items()} == {"a": 8, "b": 8, "c": 8}

    engine = _engine(adapted, async_scheduling)
    make, breaker = FAULTS[kind]
    meta, params, named = make(adapted, engine)
    engine.add_request("poison", POISON_PROMPT, params, meta)
    if breaker is not None:  # before any step: no forward is in flight to race with
        breaker(engine)
    _healthy(engine, adapted)
    seen = _run(engine)
    tokens, ends = seen.tokens, seen.ends
    assert {k: tokens[k] for k in ("a", "b", "c")} == expected
    reason, fault = ends["poison"]
    assert reason is FinishReason.ERROR and fault is not None and fault.field_name == named, ends["poison"]
    assert all(ends[k][0] is FinishReason.LENGTH for k in ("a", "b", "c"))
    # The engine goes on: the same healthy requests again, after the fault, as they were.
    _healthy(engine, adapted)
    assert _run(engine).tokens == expected
    if named == "model":  # a faulty adapter is refused at once until it is registered again
        with pytest.raises(InvalidRequestError) as info:
            engine.add_request("again", POISON_PROMPT, params, meta)
        assert info.value.field_name == "model"
        engine.add_request(
            "new", POISON_PROMPT, params, RequestMeta(**{**meta.__dict__, "lora_registered": "2"})
        )
        engine.abort_request("new")
        _run(engine)


def test_the_scale_and_weights_are_checked_on_load(adapted: Adapted, tmp_path: Path) -> None:
    """`lora_alpha: 1e308`, a weight that is not finite, and `embed_tokens` or `lm_head` targets are each
    refused on load, naming the adapter (and the module): a 400 naming `model`, nothing in a slot."""
    engine = _engine(adapted, "off")
    good = adapted.adapters["good"]

    def variant(
        name: str, config: dict[str, object], tensors: Callable[[dict[str, torch.Tensor]], None]
    ) -> str:
        path = tmp_path / name
        shutil.copytree(good, path)
        cfg = json.loads((good / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps({**cfg, **config}))
        weights = load_file(str(good / "adapter_model.safetensors"))
        tensors(weights)
        save_file(weights, str(path / "adapter_model.safetensors"))
        return str(path)

    def nan(weights: dict[str, torch.Tensor]) -> None:
        first = next(iter(weights))
        weights[first] = weights[first].clone()
        weights[first][0, 0] = float("nan")

    def embed(weights: dict[str, torch.Tensor]) -> None:
        weights["base_model.model.model.embed_tokens.lora_A.weight"] = torch.zeros(4, 8)

    cases = {
        "alpha": (variant("alpha", {"lora_alpha": 1e308}, lambda w: None), "beyond"),
        "nan": (variant("nan", {}, nan), "not finite"),
        "embed": (
            variant("embed", {"target_modules": ["q_proj", "embed_tokens"]}, lambda w: None),
            "embed_tokens",
        ),
        "head": (variant("head", {"target_modules": ["lm_head"]}, lambda w: None), "lm_head"),
        "embed-tensor": (variant("embed-tensor", {}, embed), "embed_tokens"),
    }
    for name, (path, _) in cases.items():
        engine.add_request(name, POISON_PROMPT, PARAMS, RequestMeta(tenant_id="p", lora=name, lora_path=path))
    _healthy(engine, adapted)
    ends = _run(engine).ends
    for name, (_, said) in cases.items():
        verdict, exc = ends[name]
        assert verdict == "refused" and exc.field_name == "model" and said in str(exc), (name, exc)
    assert all(ends[k][0] is FinishReason.LENGTH for k in ("a", "b", "c"))


def test_a_fault_of_one_choice_ends_every_choice_of_its_request(adapted: Adapted) -> None:
    """n = 3 under the overflowing adapter: the request is refused as a whole, no choice runs on."""
    alone = _engine(adapted, "off")
    _healthy(alone, adapted)
    expected = _run(alone).tokens
    engine = _engine(adapted, "off")
    meta, _, _ = _hot(adapted, engine)
    engine.add_request(
        "poison", POISON_PROMPT, SamplingParams(max_tokens=8, temperature=1.0, seed=1, n=3), meta
    )
    _healthy(engine, adapted)
    seen = _run(engine)
    assert {k: seen.tokens[k] for k in ("a", "b", "c")} == expected
    reason, fault = seen.ends["poison"]
    assert reason is FinishReason.ERROR and fault is not None and fault.field_name == "model"
    assert not engine.scheduler.requests and not engine.has_unfinished()
