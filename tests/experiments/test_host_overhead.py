"""experiments.host_overhead: the engine's own trace carries the per-phase split, and the benchmark reads it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.worker.loader import write_seeded_llama
from experiments.host_overhead import PHASES, Probe, main, tiny_model_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("host-overhead") / "tiny"
    write_seeded_llama(root, tiny_model_config())
    return root


def test_steady_decode_steps_carry_every_phase_in_their_trace(tiny: Path) -> None:
    probe = Probe(tiny, 8, 6, stop=[])
    try:
        row = probe.round(4)
        traces = list(probe.engine.traces)[-4:]
    finally:
        probe.close()
    assert all(t.decode_tokens == 8 and t.prefill_tokens == 0 for t in traces)
    # Each step's trace is the step just scheduled, and carries a figure for every phase (how large is
    # the benchmark's business, not the test's).
    assert [t.iteration for t in traces] == list(range(traces[0].iteration, traces[0].iteration + 4))
    assert probe.engine.scheduler.iteration == traces[-1].iteration
    for t in traces:
        assert all(math.isfinite(getattr(t, f"{p}_s")) for p in (*PHASES, "forward"))
        assert t.wait_s == t.overlapped_s == 0.0  # nothing runs beside the host without async scheduling
    assert row.batch == 8 and row.steps == 4
    assert all(math.isfinite(getattr(row, field)) for field in (*PHASES, "front", "publish", "host"))


def test_main_prints_one_row_per_batch_size_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.json"
    argv = ["--batches", "4,8", "--steps", "2", "--rounds", "1", "--warmup", "1", "--async-ab", "--json"] + [
        str(out)
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| 4 |" in table and "| 8 |" in table and "async scheduling off / on" in table
    figures = json.loads(out.read_text())
    assert [r["batch"] for r in figures["rows"]] == [4, 8]
    assert all(set(PHASES) <= set(r) for r in figures["rows"])
    for batch in ("4", "8"):  # one round each way; only the overlapped engine has a forward beside the host
        off, on = figures["async_ab"][batch]["off"], figures["async_ab"][batch]["on"]
        assert len(off) == len(on) == 1 and off[0]["steps"] == on[0]["steps"] == 2
        assert off[0]["overlapped"] == off[0]["wait_ms"] == 0


def test_an_overlapped_probe_schedules_each_step_while_the_one_before_runs(tiny: Path) -> None:
    probe = Probe(tiny, 8, 6, stop=[], overlap=True)
    engine = probe.engine
    try:
        in_flight, behind = [], []
        for _ in range(4):
            probe.round(1)
            in_flight.append(engine.executor.in_flight)
            # The trace is of the step that landed: the one before the step just scheduled and now running.
            behind.append(engine.scheduler.iteration - engine.traces[-1].iteration)
        traces = list(engine.traces)[-4:]
    finally:
        probe.close()
    assert all(
        t.decode_tokens == 8 and t.discarded_tokens == 0 for t in traces
    )  # nothing ends: nothing discarded
    assert in_flight == [True] * 4 and behind == [1] * 4
