"""experiments.gateway_segments, run tiny against a real `fairserve serve`: every request is counted in the
loop thread's segments, the other threads are named, and `--detail` times the pipeline's stages (no timing
is asserted: times belong to the experiment)."""

from __future__ import annotations

import argparse

import pytest
import uvloop

from experiments.gateway_segments import SEGMENTS, run


def test_a_tiny_run_splits_the_loop_threads_cpu_and_names_the_other_threads() -> None:
    args = argparse.Namespace(requests=24, concurrency=2, stream=False, detail=False, idle_s=0.2)
    report = uvloop.run(run(args))
    loop_thread = report["loop thread, µs"]
    assert set(SEGMENTS) | {"loop"} == set(loop_thread)
    # Every request ran its ASGI task, was parsed by uvicorn and answered from a report: none is free.
    assert loop_thread["request"] > 0 and loop_thread["http_in"] > 0 and loop_thread["report"] > 0
    assert "fairserve-ledger" in report["other threads, µs"]  # Python's name, not the kernel's `python`
    assert "stages (inclusive, instrumented), µs" not in report


def test_detail_times_the_pipeline_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRSERVE_SEGMENTS_DETAIL", "1")  # what `--detail` sets for the server it starts
    args = argparse.Namespace(requests=16, concurrency=2, stream=True, detail=True, idle_s=0.2)
    stages = uvloop.run(run(args))["stages (inclusive, instrumented), µs"]
    assert stages["Tokenizer.encode"] > 0 and stages["RunFeed.__call__"] > 0
    assert stages["EdgeMiddleware.__call__"] >= stages["GenerationRoutes.__call__"]  # one inside the other
