"""experiments.cold_code: every piece it times runs, and what it builds is what the gateway sends."""

from __future__ import annotations

import json

from engine.serving.boundary.messages import ReportAsRead
from experiments.cold_code import cold, hot, pieces


def test_every_piece_runs_and_the_two_encoders_write_the_same_json() -> None:
    found = {name: piece() for name, piece in pieces().items()}
    stdlib, fast, body = (found[k] for k in ("completion body, stdlib json", "completion body, msgspec", "Shape.body (what a reply builds)"))  # fmt: skip
    assert isinstance(stdlib, str) and isinstance(fast, str) and isinstance(body, str)
    assert json.loads(stdlib) == json.loads(fast)
    assert (
        json.loads(body)["choices"][0]["text"] == "x y z" and json.loads(body)["usage"]["total_tokens"] == 24
    )
    report = found["engine report decode (8 outputs)"]
    assert isinstance(report, ReportAsRead) and len(report.outputs) == 8
    assert found["tokenizer encode (23 tokens)"]


def test_the_timers_time_a_call() -> None:
    calls: list[int] = []
    assert hot(lambda: calls.append(1), n=10) >= 0 and len(calls) == 10
    assert cold(lambda: calls.append(2), runs=3, evict=False) >= 0 and calls.count(2) == 3
