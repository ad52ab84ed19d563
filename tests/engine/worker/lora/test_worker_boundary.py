"""A run-time adapter through a worker process: the Submit frame carries `lora_path`, the worker loads the
directory off its loop, streams the adapter's tokens, and a broken directory comes back to the front as
InvalidRequestError naming `model` (what the gateway answers as a 400) while the worker keeps serving."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from engine import LLM, EngineConfig, ProcessEngine, RequestMeta, SamplingParams
from engine.core.errors import InvalidRequestError
from tests.engine.worker.lora.adapters import Adapted, build

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> Adapted:
    return build(
        tmp_path_factory.mktemp("llama"), "llama", {"a": (4, ["q_proj", "v_proj", "up_proj"], False)}
    )


async def tokens(engine: ProcessEngine, prompt: list[int], meta: RequestMeta, request_id: str) -> list[int]:
    return [
        t
        for out in [o async for o in engine.generate(prompt, PARAMS, meta, request_id)]
        for t in out.new_token_ids
    ]


def test_an_adapter_named_by_path_runs_in_the_worker_and_a_broken_one_is_a_model_error(
    adapted: Adapted, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    prompt = list(range(30, 50))
    engine = ProcessEngine(EngineConfig(model=str(adapted.base), dtype="float32", num_kv_blocks=64))
    engine.start()
    try:

        async def scenario() -> tuple[list[int], BaseException | list[int], list[int]]:
            good = RequestMeta(lora="a", lora_path=str(adapted.adapters["a"]))
            bad = RequestMeta(lora="bad", lora_path=str(broken))
            return await asyncio.gather(
                tokens(engine, prompt, good, "good"),
                tokens(engine, prompt, bad, "bad"),
                tokens(engine, prompt, RequestMeta(), "base"),
                return_exceptions=True,
            )  # type: ignore[return-value]

        good, bad, base = asyncio.run(scenario())
    finally:
        engine.shutdown()
    merged = LLM(str(adapted.merged["a"]), dtype="float32").generate(prompt, PARAMS)[0].token_ids
    assert good == merged != base
    assert isinstance(bad, InvalidRequestError) and bad.field_name == "model"
    assert "adapter 'bad': cannot read adapter_model.safetensors" in str(bad)
