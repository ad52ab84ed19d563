"""`fairserve engine` and `serve --engine`: what they refuse before anything starts, and the engine's flags."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.cli import build_parser, main
from gateway.engine_server_settings import EngineServerSettings
from gateway.settings import GatewaySettings


def test_engine_takes_every_engine_knob_and_its_own() -> None:
    args = build_parser().parse_args(
        [
            "engine",
            "--listen",
            "tcp://127.0.0.1:0",
            "--max-num-seqs",
            "3",
            "--policy",
            "fcfs",
            "--gateway-timeout",
            "2",
            "--max-stop-strings",
            "4",
        ]
    )
    assert args.knob__listen == "tcp://127.0.0.1:0" and args.knob__gateway_timeout_s == 2.0
    assert args.knob__engine__max_num_seqs == 3 and args.knob__engine__fairness__policy == "fcfs"
    assert args.knob__engine__caps__max_stop_strings == 4


def test_serve_engine_flag_repeats() -> None:
    args = build_parser().parse_args(
        ["serve", "--engine", "tcp://127.0.0.1:7001", "--engine", "tcp://127.0.0.1:7002"]
    )
    assert args.knob__engines == ["tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--engine", "tcp://127.0.0.1:7001", "--engine", "tcp://127.0.0.1:7001"], "given twice"),
        (["serve", "--engine", "http://127.0.0.1:7001"], "use tcp://HOST:PORT"),
        (["serve", "--engine", "tcp://127.0.0.1:0"], "real port"),
        (["engine", "--listen", "127.0.0.1:7001"], "listen: engine address"),
    ],
)
def test_bad_addresses_are_refused_before_anything_starts(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--data-dir", str(tmp_path)]) == 2
    assert says in capsys.readouterr().err


def test_engine_on_a_taken_port_exits_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["engine", "--listen", f"tcp://127.0.0.1:{port}", "--data-dir", str(tmp_path)]) == 1
    assert f"cannot listen on tcp://127.0.0.1:{port}" in capsys.readouterr().err


def test_engine_settings_read_the_same_environment_and_file_as_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRSERVE_ENGINE__MAX_NUM_SEQS", "5")
    engine_toml = tmp_path / "engine.toml"
    engine_toml.write_text('listen = "tcp://127.0.0.1:0"\n[engine]\nblock_size = 32\n')
    engine = EngineServerSettings.load({"data_dir": str(tmp_path)}, engine_toml)
    assert engine.listen == "tcp://127.0.0.1:0" and engine.engine.block_size == 32
    assert engine.engine.max_num_seqs == 5 and engine.engine.cache_dir == str(tmp_path / "models")
    serve_toml = tmp_path / "serve.toml"
    serve_toml.write_text('engines = ["tcp://127.0.0.1:7001"]\n')
    serve = GatewaySettings.load({"data_dir": str(tmp_path)}, serve_toml)
    assert serve.engines == ["tcp://127.0.0.1:7001"] and serve.engine.max_num_seqs == 5


@pytest.mark.parametrize("listen", ["tcp://0.0.0.0:0", "tcp://*:0", "tcp://10.1.2.3:7001", "tcp://[::]:0"])
def test_a_non_loopback_port_without_a_cluster_key_is_refused(
    listen: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["engine", "--listen", listen, "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--cluster-key" in err and "--insecure-no-cluster-key" in err
    allowed = EngineServerSettings.load({"listen": listen, "insecure_no_cluster_key": True})
    keyed = EngineServerSettings.load({"listen": listen, "cluster_key_file": tmp_path / "key"})
    assert allowed.listen == keyed.listen == listen


def test_loopback_without_a_cluster_key_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:  # a taken port: the command stops right after the warning
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["engine", "--listen", f"tcp://127.0.0.1:{port}", "--data-dir", str(tmp_path)]) == 1
    assert any("no --cluster-key" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
