"""TokenCost and weight validation."""

from __future__ import annotations

import dataclasses

import pytest

from fairness import InvalidChargeError, InvalidWeightError, TokenCost
from fairness.cost import check_weight
from tests.defaults import COST


def test_cost_is_the_weighted_token_sum() -> None:
    assert COST(10, 3, 7) == 10 + 2 * 3
    assert TokenCost(0.5, 4.0, 0.25)(10, 3, 8) == 5 + 12 + 2


@pytest.mark.parametrize("prefill, decode, cached", [(-1, 0, 0), (0, 1.5, 0), (0, 0, True)])
def test_bad_token_counts_are_refused(prefill: object, decode: object, cached: object) -> None:
    with pytest.raises(InvalidChargeError, match="integer"):
        COST(prefill, decode, cached)  # type: ignore[arg-type]


@pytest.mark.parametrize("fields", [{"w_in": -1.0}, {"w_out": float("inf")}, {"w_in": 0.0, "w_out": 0.0}])
def test_bad_prices_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(InvalidChargeError):
        dataclasses.replace(COST, **fields)


@pytest.mark.parametrize("weight", [0, -2.0, float("nan"), float("inf"), "3", True])
def test_weights_must_be_positive_finite_numbers(weight: object) -> None:
    with pytest.raises(InvalidWeightError, match="acme"):
        check_weight("acme", weight)
    assert check_weight("acme", 2) == 2.0
