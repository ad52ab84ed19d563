"""`[models]` settings: `--model` once is the engine's model, several are local engines; fallback chains
without loops; cost factors; each bad value exits naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.cli import main
from gateway.settings import GatewaySettings


def test_one_model_flag_is_the_engines_model_and_several_stay_local_models(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    one = GatewaySettings.load({"models": {"local_models": [str(a)]}})
    assert one.engine.model == str(a) and one.models.local_models == []
    two = GatewaySettings.load({"models": {"local_models": [str(a), str(b)]}})
    assert two.models.local_models == [str(a), str(b)]


def test_fallback_chains_and_cost_factors() -> None:
    models = GatewaySettings.load(
        {"models": {"fallback_models": ["big=mid", "mid=small"], "model_costs": ["big=4", "small=0.5"]}}
    ).models
    assert models.fallback_chain("big") == ["big", "mid", "small"]
    assert models.fallback_chain("small") == ["small"]
    assert (models.cost_factor("big"), models.cost_factor("small"), models.cost_factor("mid")) == (
        4.0,
        0.5,
        1.0,
    )
    assert models.on_infeasible == "reject"


@pytest.mark.parametrize(
    ("models", "words"),
    [
        ({"fallback_models": ["a=b", "b=a"]}, "loops back"),
        ({"fallback_models": ["a=b", "a=c"]}, "two fallbacks"),
        ({"fallback_models": ["a"]}, "BIG=SMALL"),
        ({"model_costs": ["a=free"]}, "must be a number"),
        ({"model_costs": ["a=0"]}, "> 0"),
        ({"model_costs": ["a=inf"]}, "> 0"),
        ({"on_infeasible": "pray"}, "on_infeasible"),
        ({"local_models": ["/nonexistent/model"]}, "is not a directory"),
    ],
)
def test_bad_model_settings_name_the_setting(models: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        GatewaySettings.load({"models": models})


def test_the_flags_repeat(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["config", "show", "--fallback-model", "a=b", "--fallback-model", "b=c", "--model-cost", "a=2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "models.fallback_models" in out and "a=b" in out and "b=c" in out
    assert main(["config", "show", "--fallback-model", "a=b", "--fallback-model", "b=a"]) == 2
    assert "models: Value error" not in capsys.readouterr().err


def test_an_engine_serves_under_the_name_it_is_given(tmp_path: Path) -> None:
    import argparse

    from engine import EngineConfig, LLMEngine
    from gateway.cli.engine import _ALIASES
    from gateway.engine_server_settings import EngineServerSettings
    from gateway.settings_flags import add_knob_flags, load_from_args

    parser = argparse.ArgumentParser()
    add_knob_flags(parser, EngineServerSettings, _ALIASES)
    args = parser.parse_args(["--model", str(tmp_path), "--served-model-name", "house"])
    settings = load_from_args(
        args, EngineServerSettings
    )  # `fairserve engine --model DIR --served-model-name`
    assert (settings.engine.model, settings.engine.served_model_name) == (str(tmp_path), "house")
    engine = LLMEngine(EngineConfig(served_model_name="house", num_kv_blocks=16, cache_dir=str(tmp_path)))
    assert engine.model_name == "house"
