from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission.deadline import DeadlineError, parse_deadline

NOW = 1_800_000_000.0


def test_no_headers_means_no_deadline() -> None:
    assert parse_deadline(None, None, NOW) is None


def test_rfc3339_with_offset_and_z_agree() -> None:
    a = parse_deadline("2027-01-15T08:00:00Z", None, NOW)
    b = parse_deadline("2027-01-15T10:00:00+02:00", None, NOW)
    assert a == b
    assert a == pytest.approx(1_484_467_200 + 10 * 365.25 * 86400, abs=86400 * 2)


def test_epoch_seconds_and_fractional() -> None:
    assert parse_deadline("1800000012.5", None, NOW) == 1800000012.5


def test_timeout_is_converted_against_now() -> None:
    assert parse_deadline(None, "250", NOW) == pytest.approx(NOW + 0.25)


def test_earlier_of_both_wins() -> None:
    assert parse_deadline(str(NOW + 10), "1000", NOW) == pytest.approx(NOW + 1)
    assert parse_deadline(str(NOW + 0.5), "1000", NOW) == pytest.approx(NOW + 0.5)


@pytest.mark.parametrize(
    ("deadline", "timeout", "header"),
    [
        ("tomorrow", None, "X-Deadline"),
        ("", None, "X-Deadline"),
        ("2027-01-15T08:00:00", None, "X-Deadline"),  # no offset: ambiguous
        ("2027-01-15", None, "X-Deadline"),
        ("1800000000000", None, "X-Deadline"),  # milliseconds
        ("-5", None, "X-Deadline"),
        ("nan", None, "X-Deadline"),
        (None, "soon", "X-Timeout-Ms"),
        (None, "-1", "X-Timeout-Ms"),
        (None, "inf", "X-Timeout-Ms"),
        (None, "1e12", "X-Timeout-Ms"),
    ],
)
def test_malformed_headers_name_the_header(deadline: str | None, timeout: str | None, header: str) -> None:
    with pytest.raises(DeadlineError) as info:
        parse_deadline(deadline, timeout, NOW)
    assert info.value.header == header


@given(st.text(max_size=40), st.text(max_size=20))
def test_any_text_parses_or_raises_deadline_error(deadline: str, timeout: str) -> None:
    try:
        value = parse_deadline(deadline, timeout, NOW)
    except DeadlineError:
        return
    assert value is not None and value == value  # finite, not NaN
