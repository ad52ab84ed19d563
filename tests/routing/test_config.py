"""Routing weights are settings: a `fairserve serve` flag, a FAIRSERVE_ROUTING__* variable and a [routing] key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.settings import GatewaySettings
from routing import RoutingSettings


def test_routing_weights_come_from_flags_env_and_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fairserve.toml"
    config.write_text("[routing]\nkv_weight = 0.25\naffinity_blocks = 4\n")
    monkeypatch.setenv("FAIRSERVE_ROUTING__QUEUE_WEIGHT", "2.0")
    assert main(["config", "show", "--json", "--config", str(config), "--affinity-weight", "1.5"]) == 0
    rows = {row["key"]: (row["value"], row["source"]) for row in json.loads(capsys.readouterr().out)}
    assert rows["routing.affinity_weight"] == ("1.5", "flag --affinity-weight")
    assert rows["routing.queue_weight"] == ("2.0", "env FAIRSERVE_ROUTING__QUEUE_WEIGHT")
    assert rows["routing.kv_weight"] == ("0.25", f"file {config}")
    assert rows["routing.running_weight"] == ("0.5", "default")
    settings = GatewaySettings.load({"routing": {"affinity_weight": 1.5}}, config)
    assert settings.routing == RoutingSettings(
        affinity_weight=1.5, queue_weight=2.0, kv_weight=0.25, affinity_blocks=4
    )


def test_a_bad_weight_is_refused_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--affinity-weight", "-1"]) != 0
    assert "routing.affinity_weight" in capsys.readouterr().err
