"""Adapters named at run time by (name, path): loaded off the loop while the request waits outside the
scheduler, a broken directory refusing only its own requests, and the load charged to its causer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine import LLM, LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.core.errors import InvalidRequestError
from engine.core.request import RequestMeta
from engine.core.sampling_params import Grammar
from tests.engine.worker.lora.adapters import Adapted, build
from tests.engine.worker.lora.runtime import gate, held_for_adapter, run_checked

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> Adapted:
    specs = {"a": (4, ["q_proj", "v_proj", "down_proj"], False), "b": (8, ["o_proj", "up_proj"], True)}
    return build(tmp_path_factory.mktemp("llama"), "llama", specs)


def engine(adapted: Adapted, **config: object) -> LLMEngine:
    """An engine over the base model with no `--lora` entries: every adapter comes by path."""
    return LLM(str(adapted.base), dtype="float32", **config).engine


def by_path(adapted: Adapted, name: str, tenant: str = "default") -> RequestMeta:
    return RequestMeta(tenant_id=tenant, lora=name, lora_path=str(adapted.adapters[name]))


def merged(adapted: Adapted, name: str, prompt: list[int]) -> list[int]:
    return LLM(str(adapted.merged[name]), dtype="float32").generate(prompt, PARAMS)[0].token_ids


def broken_dir(root: Path) -> Path:
    broken = root / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    return broken


def test_a_request_waits_for_its_load_outside_the_scheduler_then_runs_the_adapter(adapted: Adapted) -> None:
    llm_engine = engine(adapted, num_kv_blocks=64, block_size=4)
    loader = gate(llm_engine)
    prompt = list(range(30, 50))
    llm_engine.add_request("adapted", prompt, PARAMS, by_path(adapted, "a"))
    llm_engine.add_request("base", prompt, PARAMS, RequestMeta())
    assert loader.entered.wait(timeout=60)  # the load is under way on its thread, held open by the test
    held = None
    while "base" in llm_engine.scheduler.requests:  # the base request runs to its end meanwhile
        llm_engine.step()
        assert [r.request_id for r in held_for_adapter(llm_engine)] == ["adapted"]
        adapted_request = llm_engine.scheduler.requests["adapted"]  # live, but no seat
        assert adapted_request not in llm_engine.scheduler.running
        assert llm_engine.policy.peek(time.time()) is not adapted_request  # and no place in the fair order
        assert not llm_engine.pool.block_ids("adapted")  # and no KV block
        held = held or len(llm_engine.pool.block_ids("base"))
    assert held and llm_engine.has_unfinished()
    loader.gate.set()
    out = run_checked(llm_engine)
    assert out.tokens["adapted"] == merged(adapted, "a", prompt)
    assert loader.calls == ["a"]


def test_a_name_without_a_path_must_be_a_startup_entry(adapted: Adapted) -> None:
    llm_engine = engine(adapted)
    with pytest.raises(InvalidRequestError, match="unknown LoRA adapter 'a'") as info:
        llm_engine.add_request("r", [1, 2, 3], PARAMS, RequestMeta(lora="a"))
    assert info.value.field_name == "model"
    assert not llm_engine.has_unfinished()


def test_a_broken_directory_fails_only_its_requests_and_is_not_read_again(
    adapted: Adapted, tmp_path: Path
) -> None:
    llm_engine = engine(adapted)
    loader = gate(llm_engine)
    bad = RequestMeta(tenant_id="t", lora="bad", lora_path=str(broken_dir(tmp_path)))
    llm_engine.add_request("bad-1", [1, 2, 3], PARAMS, bad)
    llm_engine.add_request("good", [1, 2, 3], PARAMS, by_path(adapted, "b"))
    llm_engine.add_request("bad-2", [4, 5, 6], PARAMS, bad)  # parked on the load already under way
    llm_engine.add_request("plain", [4, 5, 6], PARAMS, RequestMeta())
    loader.gate.set()
    out = run_checked(llm_engine)
    assert sorted(out.refused) == ["bad-1", "bad-2"]
    for exc in out.refused.values():
        assert exc.field_name == "model" and "adapter 'bad': cannot read adapter_model" in str(exc)
    assert len(out.tokens["good"]) == len(out.tokens["plain"]) == 6
    assert sorted(loader.calls) == ["b", "bad"]  # one read of the broken directory for both requests
    with pytest.raises(InvalidRequestError, match="adapter 'bad'"):  # remembered: refused at once
        llm_engine.add_request("bad-3", [1], PARAMS, bad)
    assert sorted(loader.calls) == ["b", "bad"] and not llm_engine.has_unfinished()


def test_an_aborted_waiting_request_ends_cancelled_and_the_adapter_still_loads(adapted: Adapted) -> None:
    llm_engine = engine(adapted)
    loader = gate(llm_engine)
    llm_engine.add_request("gone", [1, 2, 3], PARAMS, by_path(adapted, "a"))
    assert llm_engine.abort_request("gone")
    loader.gate.set()
    finished = {o.request_id: o for o in llm_engine.step()}
    assert finished["gone"].finish_reason == "cancelled" and not finished["gone"].token_ids
    while llm_engine.lora.host.loading(("a", str(adapted.adapters["a"]))):
        llm_engine.step()  # (the load finishes on its thread; each step polls it)
    assert ("a", str(adapted.adapters["a"])) in llm_engine.lora.host.keys


@pytest.mark.parametrize("async_scheduling", ["off", "on"])
def test_the_load_is_charged_to_the_tenant_whose_request_caused_it(
    adapted: Adapted, async_scheduling: str
) -> None:
    rate = 1024
    llm_engine = engine(adapted, lora_load_bytes_per_token=rate, async_scheduling=async_scheduling)
    prompt = list(range(60, 80))
    llm_engine.add_request("first", prompt, PARAMS, by_path(adapted, "a", tenant="loader"))
    run_checked(llm_engine)
    llm_engine.add_request("second", prompt, PARAMS, by_path(adapted, "a", tenant="rider"))
    run_checked(llm_engine)  # the adapter is cached: no load, no load charge
    adapter = llm_engine.lora.host.get(("a", str(adapted.adapters["a"])))
    assert adapter is not None and adapter.load_bytes > rate
    load_tokens = -(-adapter.load_bytes // rate)
    service = llm_engine.policy.service()
    w_in = llm_engine.config.fairness.w_in
    # Prefix caching is per tenant, so both computed the same prompt and decodes: the difference is the load.
    assert service["loader"] - service["rider"] == pytest.approx(w_in * load_tokens)


def test_max_cpu_loras_below_max_loras_is_refused() -> None:
    with pytest.raises(ValueError, match=r"max_cpu_loras \(2\) must be >= max_loras \(4\)"):
        EngineConfig(max_loras=4, max_cpu_loras=2)


def test_n_choices_wait_for_the_load_together_and_each_equal_the_single_request(adapted: Adapted) -> None:
    llm_engine = engine(adapted, enable_prefix_caching=False)
    loader = gate(llm_engine)
    prompt = list(range(40, 61))
    llm_engine.add_request(
        "n3",
        prompt,
        SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, n=3),
        by_path(adapted, "b"),
    )
    assert [r.request_id for r in held_for_adapter(llm_engine)] == ["n3"]
    loader.gate.set()
    choices: dict[int, list[int]] = {}
    while llm_engine.has_unfinished():
        for delta in llm_engine.step_deltas():
            choices.setdefault(delta.index, []).extend(delta.new_token_ids)
    single = merged(adapted, "b", prompt)[:5]
    assert choices == {0: single, 1: single, 2: single}


def test_a_grammar_request_waits_for_its_adapter_then_for_its_grammar(adapted: Adapted) -> None:
    llm_engine = engine(adapted)
    loader = gate(llm_engine)
    params = SamplingParams(max_tokens=16, temperature=0.0, grammar=Grammar("json_object"))
    llm_engine.add_request("json", [1, 2, 3], params, by_path(adapted, "a"))
    assert llm_engine.lora.waiting == 1 and llm_engine.grammar.waiting == 0
    loader.gate.set()
    out = run_checked(llm_engine)
    assert not out.refused
    assert llm_engine.tokenizer.decode(out.tokens["json"]).lstrip().startswith("{")


def test_a_request_refused_for_its_grammar_lets_go_of_its_adapter(adapted: Adapted) -> None:
    llm_engine = engine(adapted)
    broken = Grammar("json_schema", json.dumps({"type": "array", "uniqueItems": True}))
    params = SamplingParams(max_tokens=4, grammar=broken)
    llm_engine.add_request("bad-grammar", [1, 2, 3], params, by_path(adapted, "a"))
    assert llm_engine.lora.waiting == 1
    out = run_checked(llm_engine)
    assert list(out.refused) == ["bad-grammar"] and out.refused["bad-grammar"].field_name == "response_format"
    assert llm_engine.lora.in_use() == set()  # its adapter may be evicted again
