"""The shared-prefix bench's distinguisher score."""

from __future__ import annotations

import pytest

from bench.shared_prefix import auc


def test_auc_is_the_chance_a_positive_probe_is_faster() -> None:
    assert auc([1.0, 2.0], [3.0, 4.0]) == 1.0  # every probe after the victim is faster: a perfect oracle
    assert auc([3.0, 4.0], [1.0, 2.0]) == 0.0
    assert auc([1.0, 3.0], [2.0, 2.0]) == 0.5
    assert auc([2.0], [2.0]) == pytest.approx(0.5)  # ties count half
