"""The settings tree: one field gives a flag, a FAIRSERVE_* variable and a TOML key; sources and defaults."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from engine import EngineConfig
from engine.config import CUDA_MAX_NUM_BATCHED_TOKENS, budget_by_device
from fairness import POLICIES, FCFSPolicy, PolicyEntry
from gateway.cli import build_parser, main
from gateway.cli.engine import _ALIASES
from gateway.engine_server_settings import EngineServerSettings
from gateway.settings import GatewaySettings
from gateway.settings_flags import add_knob_flags, knobs, load_from_args


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = action.choices[name]
    return sub


def _show(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, tuple[str, str]]:
    assert main(["config", "show", "--json", *argv]) == 0
    return {row["key"]: (row["value"], row["source"]) for row in json.loads(capsys.readouterr().out)}


def test_serve_help_lists_every_knob_of_the_tree() -> None:
    text = _subparser("serve").format_help()
    leaves = list(knobs())
    assert len(leaves) >= 40  # gateway, admission, engine and fairness knobs
    for knob in leaves:
        if knob.path == ("engine", "model"):  # `--model DIR` once is the engine's model: one name shown
            assert "--engine-model" not in text and "--model DIR" in text
            continue
        assert knob.flags[0] in text, knob.path
        assert knob.env in text, knob.path
    for flag in (
        "--device",
        "--dtype",
        "--max-num-batched-tokens",
        "--block-size",
        "--max-model-len",
        "--attention-backend",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--preemption-mode",
        "--kv-cache-memory-fraction",
        "--policy",
        "--config",
    ):
        assert flag in text


def test_flag_over_env_over_file_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fairserve.toml"
    config.write_text(
        "port = 9100\nmax_queued_requests = 7\n[engine]\nmax_num_seqs = 3\nblock_size = 32\n"
        '[engine.fairness]\npolicy = "fcfs"\nw_out = 4.0\n'
    )
    monkeypatch.setenv("FAIRSERVE_ENGINE__MAX_NUM_SEQS", "5")
    monkeypatch.setenv("FAIRSERVE_ENGINE__FAIRNESS__W_OUT", "3.0")
    monkeypatch.setenv("FAIRSERVE_PORT", "9200")
    rows = _show(capsys, "--config", str(config), "--port", "9300", "--max-num-seqs", "6")
    assert rows["port"] == ("9300", "flag --port")
    assert rows["engine.max_num_seqs"] == ("6", "flag --max-num-seqs")
    assert rows["engine.fairness.w_out"] == ("3.0", "env FAIRSERVE_ENGINE__FAIRNESS__W_OUT")
    assert rows["engine.block_size"] == ("32", f"file {config}")
    assert rows["engine.fairness.policy"] == ("fcfs", f"file {config}")
    assert rows["max_queued_requests"] == ("7", f"file {config}")
    assert rows["engine.max_num_batched_tokens"] == ("256", "default")
    settings = GatewaySettings.load({"port": 9300}, config)
    assert (settings.port, settings.engine.max_num_seqs, settings.engine.block_size) == (9300, 5, 32)
    assert settings.admission_settings().fair_policy is False  # fcfs, from the registry entry


def test_enforce_eager_reaches_the_engine_of_serve_and_of_fairserve_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _show(capsys, "--enforce-eager")["engine.enforce_eager"] == ("True", "flag --enforce-eager")
    assert _show(capsys)["engine.enforce_eager"] == ("False", "default")
    parser = argparse.ArgumentParser()
    add_knob_flags(parser, EngineServerSettings, _ALIASES)
    settings = load_from_args(parser.parse_args(["--enforce-eager"]), EngineServerSettings)
    assert settings.engine.enforce_eager is True


def test_tensor_parallel_size_reaches_serve_and_fairserve_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flag = ("2", "flag --tensor-parallel-size")
    assert _show(capsys, "--tensor-parallel-size", "2")["engine.tensor_parallel_size"] == flag
    assert _show(capsys)["engine.tensor_parallel_size"] == ("1", "default")
    parser = argparse.ArgumentParser()
    add_knob_flags(parser, EngineServerSettings, _ALIASES)
    settings = load_from_args(parser.parse_args(["--tensor-parallel-size", "2"]), EngineServerSettings)
    assert settings.engine.tensor_parallel_size == 2


def test_bad_values_name_the_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--block-size", "24", "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "engine.block_size: block_size must be a power of two" in err
    assert "engine.model:" in err and "is not a directory" in err
    assert main(["config", "show", "--device", "tpu"]) == 2
    assert "engine: device 'tpu': use cpu, cuda or cuda:N" in capsys.readouterr().err
    typo = tmp_path / "typo.toml"
    typo.write_text("[engine]\nmax_num_seq = 3\n")
    assert main(["config", "show", "--config", str(typo)]) == 2
    assert "engine.max_num_seq: Extra inputs are not permitted" in capsys.readouterr().err
    assert main(["config", "show", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["config", "show", "--policy", "lottery"])  # argparse: not a registered choice
    config = EngineConfig()
    with pytest.raises(ValidationError, match="max_num_seqs"):
        config.max_num_seqs = 0  # assignment is validated too


def test_cuda_is_validated_and_gets_the_gpu_kv_default(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["config", "show", "--json", "--device", "cuda", "--dtype", "bfloat16"]
    if not torch.cuda.is_available():
        assert main(argv) == 2
        assert "engine: device 'cuda' asked for, but CUDA is not available" in capsys.readouterr().err
        return
    rows = {r["key"]: r for r in (json.loads(capsys.readouterr().out) if main(argv) == 0 else [])}
    assert rows["engine.device"]["value"] == "cuda"
    assert rows["engine.kv_cache_memory_fraction"]["value"] == "0.9"


def test_cpu_default_kv_fraction_and_an_explicit_one(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _show(capsys)
    assert rows["engine.kv_cache_memory_fraction"] == ("0.05", "default for device cpu")
    assert EngineConfig(kv_cache_memory_fraction=0.5).kv_fraction() == 0.5


def test_a_registered_policy_reaches_the_cli_and_admission(monkeypatch: pytest.MonkeyPatch) -> None:
    policy_flag = next(a for a in _subparser("serve")._actions if "--policy" in a.option_strings)
    assert list(policy_flag.choices or []) == list(POLICIES)
    monkeypatch.setitem(POLICIES, "lottery", PolicyEntry("lottery", FCFSPolicy, True, "test"))
    policy_flag = next(a for a in _subparser("serve")._actions if "--policy" in a.option_strings)
    assert "lottery" in (policy_flag.choices or [])
    settings = GatewaySettings.load({"engine": {"fairness": {"policy": "lottery"}}})
    assert settings.admission_settings().fair_policy is True
    monkeypatch.setitem(POLICIES, "lottery", PolicyEntry("lottery", FCFSPolicy, False, "test"))
    assert settings.admission_settings().fair_policy is False


def test_the_step_budget_defaults_by_device_kind_and_a_given_one_stands() -> None:
    assert EngineConfig().max_num_batched_tokens == 256  # cpu
    assert EngineConfig(max_num_batched_tokens=1000).max_num_batched_tokens == 1000
    # CUDA cannot be validated on a machine without it: the device rule itself, on the raw input.
    cuda = budget_by_device({"device": "cuda:1"})
    assert cuda["max_num_batched_tokens"] == CUDA_MAX_NUM_BATCHED_TOKENS == 512
    given = {"device": "cuda", "max_num_batched_tokens": 2048}
    assert budget_by_device(given)["max_num_batched_tokens"] == 2048
