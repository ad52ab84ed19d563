"""Reservations sized to the cluster (cluster/fit.py), and `ray up` refusing at once what cannot fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.config import ClusterConfig
from cluster.fit import Capacity, DoesNotFit, check_gpus, size
from tests.gateway.marked import run_marked, wait_no_leftovers

TWO_CORES = Capacity(cpus_free=2.0, cpus_total=2.0)


def test_auto_takes_half_the_free_cpus_at_most_one_each() -> None:
    on_two = size(ClusterConfig(), engines=2, gateways=1, capacity=TWO_CORES)
    assert on_two.engine_cpus == on_two.gateway_cpus == 0.33
    big = size(ClusterConfig(), engines=4, gateways=2, capacity=Capacity(64.0, 64.0))
    assert big.engine_cpus == big.gateway_cpus == 1.0


def test_given_reservations_are_kept_and_auto_shares_what_they_leave() -> None:
    sized = size(ClusterConfig(engine_cpus=0.5), engines=2, gateways=2, capacity=TWO_CORES)
    assert sized.engine_cpus == 0.5 and sized.gateway_cpus == 0.25


def test_what_cannot_fit_names_the_numbers_and_the_flags() -> None:
    with pytest.raises(DoesNotFit) as refused:
        size(ClusterConfig(engine_cpus=1.0), engines=3, gateways=1, capacity=TWO_CORES)
    said = str(refused.value)
    assert "ask 3.01 CPUs" in said and "2 CPUs free" in said
    for flag in ("--engines", "--gateways", "--engine-cpus", "--gateway-cpus", "--num-cpus"):
        assert flag in said


def test_tensor_parallel_engines_ask_one_gpu_per_rank() -> None:
    four_gpus = Capacity(cpus_free=8.0, cpus_total=8.0, gpus_free=4.0)
    check_gpus(2, four_gpus, per_engine=2)
    with pytest.raises(DoesNotFit, match="3 CUDA engine\\(s\\) of 2 GPUs .* ask 6 GPUs"):
        check_gpus(3, four_gpus, per_engine=2)


def test_ray_up_that_cannot_fit_fails_before_starting_anything(tmp_path: Path) -> None:
    """Typed as a user would on this machine: it exits 1 with the numbers, and leaves no process (no Ray)."""
    done, mark = run_marked(
        "ray", "up", "--engines", "3", "--engine-cpus", "1", "--num-cpus", "2", "--data-dir", str(tmp_path)
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fairserve ray up: 3 engine(s) and 1 gateway(s) do not fit: they ask 3.01 CPUs" in done.stderr
    assert "the cluster has 2 CPUs free" in done.stderr
    assert "url:" not in done.stdout
    assert wait_no_leftovers(mark, timeout_s=30) == []
