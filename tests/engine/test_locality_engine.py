"""vtc-locality in the real engine (embedded model, real KV pool): with two tenants level, the one whose
head request's public prefix is cached is admitted first; plain VTC admits in backlog order."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, RequestMeta, SamplingParams
from engine.worker.loader import LoadedModel, load_model
from fairness import FairnessConfig

SYSTEM = list(range(40, 104))  # four blocks of 16, registered public


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, dtype="auto", device="cpu")


def _first_admitted(loaded: LoadedModel, policy: str) -> str:
    config = EngineConfig(
        max_num_seqs=1,
        num_kv_blocks=64,
        max_num_batched_tokens=128,
        fairness=FairnessConfig(policy=policy, priority_classes=False),
    )
    engine = LLMEngine(config, loaded=loaded)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    public = len(SYSTEM)
    engine.add_request(
        "warm", SYSTEM + [1, 2, 3], params, RequestMeta(tenant_id="c", public_prefix_tokens=public)
    )
    while engine.has_unfinished():
        engine.step()
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)  # still running after a step
    engine.add_request("cold", list(range(150, 217)), params, RequestMeta(tenant_id="a"))
    engine.add_request(
        "hot", SYSTEM + [7, 8, 9], params, RequestMeta(tenant_id="b", public_prefix_tokens=public)
    )
    engine.step()
    (running,) = engine.scheduler.running
    return running.request_id


def test_locality_admits_the_cached_head_and_vtc_the_first_backlogged(loaded: LoadedModel) -> None:
    assert _first_admitted(loaded, "vtc-locality") == "hot"
    assert _first_admitted(loaded, "vtc") == "cold"
