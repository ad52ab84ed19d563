"""`fairserve serve --lora NAME=PATH` over real HTTP with the official client: `model: NAME` runs the adapter,
/v1/models lists it, and an unknown adapter is the same 404 as an unknown model."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engine import LLM, SamplingParams
from tests.engine.worker.lora.adapters import Adapted, build
from tests.gateway.serve_process import ServeProcess


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> Adapted:
    return build(
        tmp_path_factory.mktemp("llama"), "llama", {"tuned": (4, ["q_proj", "v_proj", "up_proj"], False)}
    )


@pytest.fixture(scope="module")
def serve(adapted: Adapted, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    lora = f"tuned={adapted.adapters['tuned']}"
    process = ServeProcess(
        tmp_path_factory.mktemp("data"),
        "--model",
        str(adapted.base),
        "--lora",
        lora,
        "--num-kv-blocks",
        "128",
    )
    yield process
    process.stop()


@pytest.fixture()
def oa(serve: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=serve.url + "/v1", api_key=serve.banner["api_key"], max_retries=0)


def test_models_lists_the_adapter_over_its_base(oa: openai.OpenAI) -> None:
    listed = {m.id: m for m in oa.models.list()}
    assert list(listed) == ["base", "tuned"]
    assert (listed["tuned"].model_extra or {})["parent"] == "base"


def test_model_name_selects_the_adapter(oa: openai.OpenAI, adapted: Adapted) -> None:
    prompt = [5, 17, 99, 3, 200, 42, 7, 8]
    ask = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}
    tuned = oa.completions.create(model="tuned", **ask)  # type: ignore[call-overload]
    base = oa.completions.create(model="base", **ask)  # type: ignore[call-overload]
    assert tuned.model == "tuned" and base.model == "base"
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    merged = LLM(str(adapted.merged["tuned"]), dtype="float32").generate(prompt, params)[0]
    assert tuned.choices[0].text == merged.text != base.choices[0].text


def test_an_unknown_adapter_is_the_unknown_model_404(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        oa.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert info.value.code == "model_not_found"
    assert "'base', 'tuned'" in str(info.value.message)


@pytest.mark.parametrize("where", ["nonexistent", "broken"])
def test_a_bad_adapter_path_exits_2_at_start_in_one_line(
    tmp_path: Path, adapted: Adapted, where: str
) -> None:
    # Like `--model /nonexistent`: refused before anything starts, not listed and failing every request.
    bad = tmp_path / where
    if where == "broken":
        bad.mkdir()  # a directory, but no adapter_config.json in it
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--data-dir", str(tmp_path / "data")]
    cmd += ["--model", str(adapted.base), "--lora", f"bad={bad}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if f"lora bad={bad}" in line]
    assert len(errors) == 1 and "not a PEFT adapter directory" in errors[0]
    assert "Traceback" not in done.stderr and "url:" not in done.stdout
