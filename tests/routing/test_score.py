"""The routing scorer over plain numbers: health, load against affinity, ties; a property over random engines."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.config import RoutingSettings
from routing.score import Candidate, choose, load, rank, score

SEATS = 8
KV = 64


def engine(
    waiting: int = 0,
    running: int = 0,
    kv: int = 0,
    affinity: float = 0.0,
    healthy: bool = True,
    waiting_tokens: int = 0,
    in_flight: int = 0,
    tenant_in_flight: int = 0,
) -> Candidate:
    return Candidate(
        healthy=healthy,
        waiting=waiting,
        waiting_tokens=waiting_tokens,
        running=running,
        kv_blocks_used=kv,
        kv_blocks_total=KV,
        max_num_seqs=SEATS,
        kv_capacity_tokens=KV * 16,
        affinity=affinity,
        in_flight=in_flight,
        tenant_in_flight=tenant_in_flight,
    )


def test_no_healthy_engine_means_no_choice() -> None:
    assert choose([], RoutingSettings()) is None
    assert choose([engine(healthy=False), engine(healthy=False)], RoutingSettings()) is None


def test_a_dead_engine_is_never_chosen_however_idle() -> None:
    assert choose([engine(healthy=False), engine(waiting=50, running=SEATS, kv=KV)], RoutingSettings()) == 1


def test_affinity_wins_between_equally_loaded_engines() -> None:
    w = RoutingSettings()
    assert choose([engine(running=2), engine(running=2, affinity=1.0)], w) == 1
    assert choose([engine(running=2, affinity=0.25), engine(running=2, affinity=0.75)], w) == 1


def test_load_outweighs_affinity_once_the_queue_is_deep_enough() -> None:
    """Affinity is bounded by its weight, load is not: a tenant's prefix engine stops drawing its requests
    when it is that much busier, so one engine cannot hold a tenant below its share."""
    w = RoutingSettings(affinity_weight=0.5, queue_weight=1.0)
    # Half a batch of waiting requests more than the other engine is where the pull ends.
    assert choose([engine(), engine(waiting=SEATS // 2 - 1, affinity=1.0)], w) == 1
    assert choose([engine(), engine(waiting=SEATS // 2 + 1, affinity=1.0)], w) == 0
    # A heavier affinity weight moves that point, as the setting says.
    assert (
        choose([engine(), engine(waiting=SEATS // 2 + 1, affinity=1.0)], RoutingSettings(affinity_weight=2.0))
        == 1
    )


def test_each_load_term_counts_with_its_weight() -> None:
    only = {"queue_weight": 0.0, "waiting_token_weight": 0.0, "running_weight": 0.0, "kv_weight": 0.0}
    for name, busy in (
        ("queue_weight", engine(waiting=4)),
        ("waiting_token_weight", engine(waiting_tokens=512)),
        ("running_weight", engine(running=4)),
        ("kv_weight", engine(kv=32)),
    ):
        w = RoutingSettings.model_validate({**only, name: 1.0})
        assert load(busy, w) == 0.5, name
        assert choose([busy, engine()], w) == 1, name
        assert load(busy, RoutingSettings.model_validate(only)) == 0.0


def test_ties_go_to_the_engine_with_fewer_of_our_requests() -> None:
    assert rank([engine(in_flight=3), engine(in_flight=1), engine(in_flight=2)], RoutingSettings()) == [
        1,
        2,
        0,
    ]


def test_a_tenant_spreads_to_the_engine_the_other_gateways_tenant_fills() -> None:
    """Two gateways, one tenant each: B's requests on engine 0 are load to A's router, A's own on engine 1
    are too. By load alone A's next request goes where B is lightest; the spread term sends it where A is
    scarce, so each tenant stays on both engines and per-engine fairness is global fairness."""
    by_b = engine(waiting=6, running=SEATS, tenant_in_flight=0)  # engine 0: B's requests (other gateway)
    by_a = engine(waiting=5, running=SEATS, tenant_in_flight=13)  # engine 1: A's own requests
    assert choose([by_b, by_a], RoutingSettings(tenant_spread_weight=0)) == 1
    assert choose([by_b, by_a], RoutingSettings()) == 0


candidates = st.builds(
    engine,
    waiting=st.integers(0, 200),
    running=st.integers(0, SEATS),
    kv=st.integers(0, KV),
    affinity=st.floats(0, 1),
    healthy=st.booleans(),
    waiting_tokens=st.integers(0, 10_000),
    in_flight=st.integers(0, 50),
)
weights = st.builds(
    RoutingSettings,
    affinity_weight=st.floats(0, 5),
    queue_weight=st.floats(0, 5),
    waiting_token_weight=st.floats(0, 5),
    running_weight=st.floats(0, 5),
    kv_weight=st.floats(0, 5),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(candidates, max_size=8), weights)
def test_the_choice_is_healthy_and_the_best_scored(engines: list[Candidate], w: RoutingSettings) -> None:
    chosen = choose(engines, w)
    healthy = [i for i, c in enumerate(engines) if c.healthy]
    if not healthy:
        assert chosen is None
        return
    assert chosen is not None and engines[chosen].healthy
    assert score(engines[chosen], w) == max(score(engines[i], w) for i in healthy)
    assert sorted(rank(engines, w)) == healthy  # every healthy engine is ranked, no unhealthy one


@settings(max_examples=300, deadline=None)
@given(st.lists(candidates, min_size=1, max_size=8), weights)
def test_without_affinity_weight_the_choice_is_the_least_loaded(
    engines: list[Candidate], w: RoutingSettings
) -> None:
    w = w.model_copy(update={"affinity_weight": 0.0})
    chosen = choose(engines, w)
    healthy = [c for c in engines if c.healthy]
    if chosen is None:
        assert not healthy
        return
    assert load(engines[chosen], w) == min(load(c, w) for c in healthy)
