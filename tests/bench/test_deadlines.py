"""The deadline bench's verdicts: an answer counts as good only when it is what its headers claim and arrives
in time; the plan is the same for every policy."""

from __future__ import annotations

from typing import Any

import httpx

from bench.deadlines import GOOD, plan, summary, verdict

REQ = {"at": 0.0, "prompt": 40, "max_tokens": 20, "deadline_ms": 1000}


def answer(model: str, tokens: int, finish: str = "length", degraded: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {
        "model": model,
        "choices": [{"finish_reason": finish}],
        "usage": {"completion_tokens": tokens},
    }
    return httpx.Response(200, json=body, headers={"X-Degraded": degraded} if degraded else {})


def test_each_answer_is_checked_against_what_it_claims() -> None:
    assert verdict(answer("slow", 20), REQ, 0.5) == "full"
    assert verdict(answer("slow", 20), REQ, 1.5) == "missed"  # in full, but late
    assert verdict(answer("fast", 20, degraded="fallback; model=fast"), REQ, 0.2) == "fallback"
    assert verdict(answer("slow", 20, degraded="fallback; model=fast"), REQ, 0.2) == "error"
    assert verdict(answer("slow", 7, degraded="partial"), REQ, 0.9) == "partial"
    assert verdict(answer("slow", 7, finish="stop", degraded="partial"), REQ, 0.9) == "error"
    assert verdict(answer("fast", 20), REQ, 0.2) == "error"  # another model, unannounced
    assert verdict(answer("slow", 7), REQ, 0.9) == "partial"  # cut though its estimate fit: `length` says so
    assert verdict(answer("slow", 7, finish="stop"), REQ, 0.9) == "error"
    assert verdict(httpx.Response(503, json={}, headers={"Retry-After": "1"}), REQ, 0.0) == "rejected"
    assert verdict(httpx.Response(503, json={}), REQ, 0.0) == "error"  # a refusal must say when to retry
    assert verdict(httpx.Response(504, json={}), REQ, 1.0) == "missed"
    assert verdict(None, REQ, 0.0) == "error"


def test_the_plan_is_reproducible_and_goodput_counts_only_good_answers() -> None:
    assert plan(3.0, 10.0, seed=1) == plan(3.0, 10.0, seed=1)
    assert all(0 < r["at"] < 10.0 for r in plan(3.0, 10.0, seed=1))
    counts = {"full": 2, "fallback": 3, "partial": 1, "rejected": 3, "missed": 1, "error": 0}
    s = summary(counts, duration_s=2.0)
    assert set(GOOD) == {"full", "fallback", "partial"}
    assert (s["offered"], s["good"], s["goodput_rps"], s["good_share"]) == (10, 6, 3.0, 0.6)
