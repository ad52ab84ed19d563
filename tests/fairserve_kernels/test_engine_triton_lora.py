"""End to end: adapted requests on the Triton backend (SGMV interpreted on CPU) give the torch twins' tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import engine
import engine.worker.kernels
import fairserve_kernels.triton_lora as triton_lora
from engine.core.request import RequestMeta

# The adapters are written with peft, which the GPU machine's bare image lacks (bench/gpu_wheels.txt).
pytest.importorskip("peft", reason="peft writes the test adapters; not in the GPU check's wheels")
from tests.engine.worker.lora.adapters import ALL_MODULES, build  # noqa: E402


def test_a_mixed_adapter_batch_on_triton_matches_torch(
    device: torch.device, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ranks 4 and 16 (padded to the stack's 16), all modules and q/v only, and a request without one.
    adapted = build(tmp_path, "llama", {"a": (4, ALL_MODULES, False), "b": (16, ["q_proj", "v_proj"], True)})
    launches: list[int] = []
    shrink = triton_lora.sgmv_shrink

    def counting(x: torch.Tensor, a: torch.Tensor, *args: Any) -> torch.Tensor:
        launches.append(int(args[2].numel()))  # segments (adapters) in the launch
        return shrink(x, a, *args)

    monkeypatch.setattr(triton_lora, "sgmv_shrink", counting)
    engine.worker.kernels.clear_cache()
    prompts = [list(range(5, 25)), list(range(40, 47)), list(range(60, 90))]
    metas = [RequestMeta(lora="a"), RequestMeta(), RequestMeta(lora="b")]
    params = engine.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    def run(backend: str) -> list[list[int]]:
        llm = engine.LLM(
            str(adapted.base),
            attention_backend=backend,
            device=device.type,
            dtype="float32",
            lora={name: str(path) for name, path in adapted.adapters.items()},
            max_num_seqs=4,
        )
        return [list(o.token_ids) for o in llm.generate(prompts, [params] * 3, metas)]

    expected = run("torch")
    assert not launches, "the torch backend must not launch the SGMV kernel"
    got = run("triton")
    engine.worker.kernels.clear_cache()
    assert launches and max(launches) == 2, "one launch served both adapters of a step"
    assert got == expected
