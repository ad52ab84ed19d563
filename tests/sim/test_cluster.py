"""The cluster simulator: N real schedulers behind R routers, with and without shared VTC counters."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from engine.core.request import Request, RequestMeta
from engine.core.sampling_params import SamplingParams
from gateway.cli import main
from sim.cluster import ClusterConfig
from sim.cluster_report import cluster_scenario, dynamo_config, jain_index
from sim.shared import EngineView, RouteWeights, SharedVTC, others_service, pick_engine
from tests.defaults import COST, LIFT


@cache
def skewed(engines: int, staleness_s: float | None) -> dict[str, Any]:
    """100 Zipf tenants (weights 1, 2, 4) entering unevenly through 4 routers, 3x overloaded."""
    return cluster_scenario(
        ClusterConfig(
            engines=engines, routers=4, tenants=100, staleness_s=staleness_s, duration_s=9.0, warmup_s=4.0
        )
    )


def test_dynamo_skew_is_one_to_one_per_engine_and_four_to_one_with_shared_counters() -> None:
    # DEP #15187: weights 4:1, each tenant only through its own router, each router's affinity on its engine.
    ratios = {}
    for sharing in (False, True):
        service = cluster_scenario(dynamo_config(sharing), keep_service=True)["service"]
        assert service["A"] > 0 and service["B"] > 0
        ratios[sharing] = service["A"] / service["B"]
    assert ratios[False] == pytest.approx(1.0, rel=0.1)  # Dynamo's finding: the weights are lost
    assert ratios[True] == pytest.approx(4.0, rel=0.1)


def test_exact_sharing_keeps_the_gap_within_the_bound_and_jain_near_one_under_skewed_ingress() -> None:
    shared, alone = skewed(4, 0.0), skewed(4, None)
    assert shared["backlogged"] >= 20  # the measurement covers many tenants, not a lucky pair
    assert shared["max_gap"] <= shared["bound"]
    assert shared["jain"] >= 0.98
    # Per-engine counters on the same workload: the skew shows (otherwise the test above proves nothing).
    assert alone["jain"] < 0.8 and alone["max_gap"] > 5 * shared["max_gap"]


def test_very_stale_counters_lose_what_sharing_gave() -> None:
    stale, exact = skewed(4, 10.0), skewed(4, 0.0)
    assert stale["jain"] < exact["jain"] - 0.1


def test_throughput_grows_with_the_number_of_engines() -> None:
    two, four = skewed(2, 0.0), skewed(4, 0.0)
    assert four["tokens_per_s"] >= 1.8 * two["tokens_per_s"]


def test_others_service_subtracts_this_engines_publication_and_never_goes_negative() -> None:
    total = {"a": 10.0, "b": 4.0}
    assert others_service(total, {"a": 3.0, "b": 5.0}, ["a", "b", "c"]) == {"a": 7.0, "b": 0.0, "c": 0.0}


def _request(name: str, tenant: str, weight: float = 1.0) -> Request:
    return Request(name, [1] * 4, SamplingParams(max_tokens=4), RequestMeta(tenant_id=tenant, weight=weight))


def test_remote_service_reorders_a_shared_vtc_and_is_replaced_not_added_twice() -> None:
    policy = SharedVTC(COST, LIFT)
    policy.add(_request("a0", "A"), 0.0)
    policy.add(_request("b0", "B"), 0.0)
    first = policy.peek(0.0)
    assert first is not None and first.meta.tenant_id == "A"  # tie: A was backlogged first
    policy.set_remote("A", 100.0, 1.0)  # A was served elsewhere
    second = policy.peek(0.0)
    assert second is not None and second.meta.tenant_id == "B"
    policy.set_remote("A", 100.0, 1.0)
    assert policy.counters()["A"] == pytest.approx(100.0)


def test_pick_engine_prefers_affinity_unless_behind_and_never_an_unhealthy_engine() -> None:
    weights = RouteWeights(affinity=1.0, queue=1.0, kv=0.0)
    views = [EngineView(500, 1000, 0.0, True, tenant_tokens=500), EngineView(800, 1000, 0.0, False)]
    assert pick_engine(views, weights) == 0
    assert pick_engine(views, weights, behind=True) == 1  # its own work waits on 0; on 1 it would go first
    sick = [EngineView(0, 1000, 0.0, True, healthy=False), EngineView(900, 1000, 0.9, False)]
    assert pick_engine(sick, weights) == 1
    assert jain_index([1.0, 1.0]) == 1.0 and jain_index([1.0, 0.0]) == 0.5


def test_cli_cluster_prints_json_and_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "sim",
                "--scenario",
                "cluster",
                "--engines",
                "2",
                "--tenants",
                "20",
                "--duration",
                "3",
                "--warmup",
                "1",
                "--staleness-ms",
                "none",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["engines"] == 2 and report["sharing"] is False and report["tokens_per_s"] > 0
    assert main(["sim", "--scenario", "cluster", "--routers", "0"]) == 2
    assert "--routers" in capsys.readouterr().err
