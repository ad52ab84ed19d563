"""experiments/sampler_ab: its pieces run tiny (the A/B itself is a measurement, run by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.small_models import write_small_model
from experiments.sampler_ab import MIXES, engine_rate, sampler_cost


@pytest.mark.parametrize("mix", MIXES)
def test_every_mix_samples(mix: str) -> None:
    assert sampler_cost(mix, 262, calls=2) > 0


def test_the_engine_rate_counts_cpu_time(tmp_path: Path) -> None:
    write_small_model(tmp_path)
    assert engine_rate(tmp_path, "sampled", tokens=2) > 0
