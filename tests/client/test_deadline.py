"""The client's deadline arithmetic, without a server: fixed instants, and when a retry could still start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai._constants import MAX_RETRY_AFTER_DELAY, MAX_RETRY_DELAY

from fairserve_client.deadline import DeadlinePolicy, epoch_of, header_deadline, longest_backoff, next_start


def test_deadline_forms_name_the_same_instant() -> None:
    at = datetime(2030, 1, 1, 12, tzinfo=UTC)
    assert epoch_of(at) == epoch_of(at.astimezone(timezone(timedelta(hours=-5)))) == epoch_of(at.timestamp())
    assert header_deadline({"x-deadline": "2030-01-01T12:00:00Z"}) == at.timestamp()
    assert header_deadline({"x-deadline": f"{at.timestamp():.3f}"}) == at.timestamp()
    assert header_deadline({"x-deadline": "soon"}) is None and header_deadline({}) is None
    with pytest.raises(ValueError):
        epoch_of(float("nan"))


@given(
    now=st.floats(1e9, 2e9),
    at=st.one_of(st.none(), st.floats(1e9, 2e9)),
    within=st.one_of(st.none(), st.floats(0.001, 1e5)),
)
def test_the_earlier_of_absolute_and_relative_wins(
    now: float, at: float | None, within: float | None
) -> None:
    resolved = DeadlinePolicy(at, within).resolve(now)
    expected = [d for d in (at, None if within is None else now + within) if d is not None]
    assert resolved == (min(expected) if expected else None)


@given(
    retry_after=st.one_of(st.none(), st.floats(-10, 1000)),
    queue_ms=st.integers(0, 600_000),
    retries=st.integers(0, 50),
)
def test_next_start_waits_for_both_the_retry_after_and_the_queue(
    retry_after: float | None, queue_ms: int, retries: int
) -> None:
    start = next_start(1000.0, retry_after, str(queue_ms), retries)
    honoured = retry_after is not None and 0 < retry_after <= MAX_RETRY_AFTER_DELAY
    wait = retry_after if honoured and retry_after is not None else longest_backoff(retries)
    assert start == 1000.0 + max(wait, queue_ms / 1000.0)
    assert longest_backoff(retries) <= MAX_RETRY_DELAY


def test_an_unreadable_estimate_counts_as_no_queue() -> None:
    assert next_start(0.0, 2.0, "not-a-number", 0) == 2.0
    assert next_start(0.0, None, None, 0) == longest_backoff(0)
