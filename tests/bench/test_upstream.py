"""bench.upstream: its window arithmetic on known outcomes, and a quick run against the vLLM simulator alone,
which serves requests, not tenants, so the report must show B's flood taking the larger share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import upstream
from bench.loadgen import LoadResult, Outcome
from bench.upstream_report import client_usage, ledger_against_clients, token_times, window_shares, within


def outcome(tenant: str, first: float, end: float, tokens: int, status: int = 200) -> Outcome:
    o = Outcome("r", tenant, 0.0, status=status, first_token_at=first, end_at=end, finish_reason="length")
    o.text_chunks = o.text_bytes = o.completion_tokens = tokens
    return o


def test_a_requests_tokens_run_from_its_first_token_to_its_end() -> None:
    assert token_times(outcome("A", 1.0, 3.0, 5), 100.0) == [101.0, 101.5, 102.0, 102.5, 103.0]
    assert token_times(outcome("A", 1.0, 1.0, 1), 0.0) == [1.0]
    assert token_times(outcome("A", 1.0, 2.0, 3, status=429), 0.0) == []


def test_without_usage_a_requests_tokens_are_its_texts_bytes_not_its_chunks() -> None:
    o = outcome("A", 0.0, 2.0, 0)
    o.text_chunks, o.text_bytes = 2, 3  # one chunk carried two tokens, as transformers serve sometimes sends
    assert token_times(o, 0.0) == [0.0, 1.0, 2.0]


def test_windows_count_each_tenants_tokens_and_compare_with_the_weights() -> None:
    results = {
        "A": LoadResult([outcome("A", 0.0, 9.0, 10), outcome("A", 10.0, 19.0, 10)], started=1000.0),
        "B": LoadResult([outcome("B", 0.0, 19.0, 20)], started=1000.0),
    }
    windows = window_shares(results, 1000.0, 1020.0, 10.0, {"A": 4.0, "B": 1.0})
    assert [w["tokens"] for w in windows] == [{"A": 10, "B": 10}, {"A": 10, "B": 10}]
    assert windows[0]["share"] == {"A": 0.5, "B": 0.5} and windows[0]["ratio_over_weights"] == 0.25
    assert within(windows, 0.05) is False and within([], 0.05) is None
    assert window_shares(results, 1000.0, 1015.0, 10.0, {"A": 1.0, "B": 1.0})[0]["ratio"] == 1.0
    assert len(window_shares(results, 1000.0, 1015.0, 10.0, {"A": 1.0, "B": 1.0})) == 1  # whole windows only


def test_the_ledger_is_compared_with_the_usage_and_the_streamed_count() -> None:
    clients = client_usage({"A": LoadResult([outcome("A", 0, 1, 4), outcome("A", 0, 1, 2, status=503)])})
    assert clients["A"] == {"requests": 1, "prompt_tokens": 0, "completion_tokens": 4, "streamed_tokens": 4}
    rows = ledger_against_clients({"A": {"requests": 1, "prompt_tokens": 0, "completion_tokens": 5}}, clients)
    assert rows["A"]["completion_equal_to_usage"] is False and rows["A"]["completion_over_streamed"] == 1.25


def test_a_quick_run_against_the_simulator_alone_splits_by_request_count(tmp_path: Path) -> None:
    out = tmp_path / "upstream.json"
    assert upstream.main(["--quick", "--setups", "sim-alone", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    sim = report["setups"]["sim-alone"]
    assert sim["measured"] and sim["failed"] == {"A": 0, "B": 0} and "ledger" not in sim
    whole = sim["whole_flood"]
    # 3 streams of A beside 6 of B in 8 FIFO slots: about one token of A to two of B, whatever the weights.
    assert whole["ratio"] == pytest.approx(0.5, rel=0.35)
    assert sim["a_ttft_alone_s"]["n"] > 0 and sim["a_ttft_beside_flood_s"]["n"] > 0
    assert report["throughput_fairserve_over_engine_alone"] == {}  # no fairserve setup in this run


def test_behind_fairserve_the_simulators_own_count_equals_the_ledger(tmp_path: Path) -> None:
    """The ledger against the engine's usage, where the engine keeps its own count: every token the
    simulator computed for A and B is in the ledger, and nothing else."""
    out = tmp_path / "upstream.json"
    assert upstream.main(["--quick", "--setups", "sim-behind-fairserve", "--out", str(out)]) == 0
    sim = json.loads(out.read_text())["setups"]["sim-behind-fairserve"]
    assert sim["measured"], sim.get("note")
    assert sim["ledger_against_engine"]["ledger"] == sim["ledger_against_engine"]["engine"]
    assert all(row["completion_equal_to_usage"] and row["requests_equal"] for row in sim["ledger"].values())
