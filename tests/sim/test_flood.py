"""Issue 45 in the simulator: a short request beside another tenant's flood of long prompts (sim/flood.py)."""

from __future__ import annotations

from sim.flood import FloodSetup, main, run

SETUP = FloodSetup(iterations=600)


def test_beside_the_flood_a_waits_no_more_steps_than_beside_one_loop() -> None:
    one, flood = run(1, SETUP), run(62, SETUP)
    # A's prompt runs in the step after it arrives, however deep B's queue: the flood's depth never reaches A.
    assert flood["a_ttft_steps_max"] <= 2 and one["a_ttft_steps_max"] <= 2
    assert flood["a_ttft_steps_p50"] == one["a_ttft_steps_p50"] == 1
    # ... and B is still served: the step budget stays full (B's answers as beside A's single loop).
    assert flood["b_answers"] >= 0.9 * one["b_answers"] > 0


def test_the_bench_prints_one_row_per_flood_size(capsys: object) -> None:
    assert main(["--loops", "0,3", "--iterations", "50"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert '"b_loops": 0' in out and '"b_loops": 3' in out
