"""`fairserve bench` flag handling: bad options exit 2 with a message naming the problem, no traceback."""

from __future__ import annotations

import pytest

from bench.cli import options
from gateway.cli import build_parser, main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--url", "http://127.0.0.1:9"], "--url needs --api-key"),
        (["--duration", "0"], "durations must be > 0"),
    ],
)
def test_bad_options_exit_2_with_a_message(
    argv: list[str], message: str, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FAIRSERVE_API_KEY", raising=False)
    assert main(["bench", *argv]) == 2
    err = capfd.readouterr().err
    assert message in err and "Traceback" not in err


def test_fairserve_dispatcher_knows_bench_and_the_report_hides_the_key() -> None:
    # Registered through the fairserve.commands entry point: needs `pip install -e .` after pyproject changes.
    args = build_parser().parse_args(
        [
            "bench",
            "--quick",
            "--url",
            "http://h:1",
            "--api-key",
            "sk-secret",
            "--workload",
            "chat",
            "agent",
            "--sweep-rates",
            "8.5",
            "2",
            "--no-comparisons",
        ]
    )
    opts = options(args)
    assert (opts.url, opts.api_key, opts.workloads, opts.sweep_rates) == (
        "http://h:1",
        "sk-secret",
        ["chat", "agent"],
        [2.0, 8.5],
    )
    assert opts.quick and not opts.comparisons
    assert "sk-secret" not in opts.command and "--api-key $FAIRSERVE_API_KEY" in opts.command
    assert opts.command.startswith("fairserve bench --quick --url http://h:1")
