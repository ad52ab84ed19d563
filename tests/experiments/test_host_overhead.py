"""experiments.host_overhead: the engine's own trace carries the per-phase split, and the benchmark reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.loader import write_seeded_llama
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
    for t in traces:  # every phase ran and was timed, the forward too
        assert t.forward_s > 0 and all(getattr(t, f"{p}_s") > 0 for p in PHASES)
    assert row.batch == 8 and row.steps == 4 and row.forward_ms > 0 and row.front > 0


def test_main_prints_one_row_per_batch_size_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.json"
    assert (
        main(
            [
                "--batches",
                "4,8",
                "--steps",
                "2",
                "--rounds",
                "1",
                "--warmup",
                "1",
                "--overlap",
                "4",
                "--overlap-seconds",
                "0.3",
                "--async-ab",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert (
        "| 4 |" in table
        and "| 8 |" in table
        and "overlap_publish off" in table
        and "async scheduling off / on" in table
    )
    figures = json.loads(out.read_text())
    assert [r["batch"] for r in figures["rows"]] == [4, 8] and all(r["host"] > 0 for r in figures["rows"])
    assert all(
        len(figures["overlap"][mode]) == 1 and figures["overlap"][mode][0] > 0 for mode in ("off", "on")
    )
    for batch in (
        "4",
        "8",
    ):  # one round each way; only the overlapped engine hides host work and waits for samples
        off, on = figures["async_ab"][batch]["off"][0], figures["async_ab"][batch]["on"][0]
        assert off["step_ms"] > 0 and on["step_ms"] > 0 and off["overlapped"] == off["wait_ms"] == 0
        assert on["overlapped"] > 0 and on["wait_ms"] > 0


def test_an_overlapped_probe_reports_the_host_work_its_forward_hid(tiny: Path) -> None:
    probe = Probe(tiny, 8, 6, stop=[], overlap=True)
    try:
        row = probe.round(4)
        traces = list(probe.engine.traces)[-4:]
    finally:
        probe.close()
    assert all(
        t.decode_tokens == 8 and t.discarded_tokens == 0 for t in traces
    )  # nothing ends: nothing discarded
    # The next step was scheduled (and its inputs prepared) while this one's forward ran.
    assert all(
        t.schedule_s > 0 and t.prepare_s > 0 and t.forward_s > 0 and t.overlapped_s > 0 for t in traces
    )
    assert row.overlapped > 0 and row.wait_ms > 0
