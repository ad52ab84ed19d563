"""A comparison reports its effect only when its rounds agree within it (bench/verdict.py)."""

from __future__ import annotations

import pytest

from bench.verdict import difference_verdict, ratio_verdict


def test_rounds_that_disagree_more_than_the_effect_are_inconclusive() -> None:
    # The case: 0.25x on a busy machine, 2.20x alone a minute later.
    verdict = ratio_verdict([0.25, 2.20])
    assert verdict["conclusive"] is False
    assert verdict["text"] == "inconclusive (rounds 0.25-2.20x)"
    assert "median" in verdict and verdict["spread"] == [0.25, 2.20]
    # Rounds that agree: the median, with its spread.
    agree = ratio_verdict([2.1, 2.3, 2.2])
    assert agree["conclusive"] is True and agree["median"] == pytest.approx(2.2)
    assert agree["text"] == "2.20x (rounds 2.10-2.30x)"
    # A slowdown that holds every round is as conclusive as a speed-up.
    assert ratio_verdict([0.5, 0.55, 0.6])["conclusive"] is True
    # No effect at all cannot beat any spread.
    assert ratio_verdict([0.98, 1.03])["conclusive"] is False
    assert ratio_verdict([2.0])["text"] == "inconclusive (fewer than two rounds)"


def test_added_latency_needs_rounds_that_agree() -> None:
    assert difference_verdict([6.0, 6.5, 5.8])["text"] == "+6.0 ms (rounds +5.8 to +6.5 ms)"
    noisy = difference_verdict([-3.0, 12.0, 2.0])
    assert noisy["conclusive"] is False and noisy["text"].startswith("inconclusive (rounds -3.0 to +12.0")
    assert difference_verdict([float("nan")])["conclusive"] is False
