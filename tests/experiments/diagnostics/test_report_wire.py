"""experiments.diagnostics.report_wire: deltas keep a report's size independent of context; the whole form grows with it."""

from __future__ import annotations

import json

import pytest

from experiments.diagnostics.report_wire import main, measure


def test_delta_reports_do_not_grow_with_context() -> None:
    short, long = measure(16, 4, 8, repeat=1), measure(2000, 300, 8, repeat=1)
    assert (
        long["whole"].bytes > 20 * short["whole"].bytes
    )  # prompt and tokens so far, every stream, every report
    assert long["delta"].bytes < 1.2 * short["delta"].bytes
    assert long["delta"].bytes < long["whole"].bytes / 40


def test_json_rows_cover_every_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    shapes = [(64, 16, 8), (1000, 128, 32), (4000, 512, 64), (256, 8000, 32)]
    assert [(r["prompt"], r["so_far"], r["batch"]) for r in rows] == shapes
    assert all(
        r["delta_bytes"] < r["whole_bytes"] and r["delta_receive_us"] > 0 and r["whole_build_us"] > 0
        for r in rows
    )
