from __future__ import annotations

import random

from admission.backoff import CAP_SLACK_S, RETRY_AFTER_CAP_S, ratelimit_headers, retry_after_seconds


def test_retry_after_never_shorter_than_estimate_and_at_least_one() -> None:
    rng = random.Random(1)
    for estimate in (0.0, 0.2, 1.0, 3.7, 59.9):
        values = [retry_after_seconds(estimate, 0.25, rng) for _ in range(200)]
        assert min(values) >= max(1, estimate)
        assert max(values) <= estimate * 1.25 + 2


def test_retry_after_jitter_spreads_clients() -> None:
    rng = random.Random(2)
    values = {retry_after_seconds(4.0, 0.5, rng) for _ in range(200)}
    assert len(values) >= 2


def test_retry_after_without_jitter_is_ceiling() -> None:
    rng = random.Random(3)
    assert retry_after_seconds(2.1, 0.0, rng) == 3
    assert retry_after_seconds(float("nan"), 0.0, rng) == 1


def test_ratelimit_headers_for_binding_window() -> None:
    headers = ratelimit_headers("1000;w=60, 50000;w=86400", 1000, -3, 12.2)
    assert headers["RateLimit-Policy"] == "1000;w=60, 50000;w=86400"
    assert headers["RateLimit"] == "limit=1000, remaining=0, reset=13"


def test_jitter_never_pushes_an_estimate_within_the_cap_over_it() -> None:
    rng = random.Random(3)
    assert max(retry_after_seconds(59.5, 0.5, rng) for _ in range(200)) == RETRY_AFTER_CAP_S
    assert min(retry_after_seconds(61.5, 0.5, rng) for _ in range(200)) >= 62


def test_a_per_minute_windows_slot_of_rounding_is_still_capped_a_longer_wait_is_not() -> None:
    rng = random.Random(1)
    assert (
        max(retry_after_seconds(RETRY_AFTER_CAP_S + CAP_SLACK_S, 0.25, rng) for _ in range(200))
        == RETRY_AFTER_CAP_S
    )
    assert (
        min(retry_after_seconds(RETRY_AFTER_CAP_S + CAP_SLACK_S + 0.5, 0.0, rng) for _ in range(20))
        > RETRY_AFTER_CAP_S
    )
