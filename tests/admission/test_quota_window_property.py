"""Property: the in-memory limiter keeps every sliding window within its limit, is no stricter than documented,
and its Retry-After is enough (hypothesis drives the clock, reservations and settles)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from admission.quota import MemoryQuota, QuotaLimits
from admission.sliding_window import DAY, MINUTE, WindowSpec

LIMITS = QuotaLimits(tokens_per_minute=1_000, tokens_per_day=4_000)
WINDOWS: list[tuple[int, WindowSpec]] = [(1_000, MINUTE), (4_000, DAY)]


class Clock:
    def __init__(self) -> None:
        self.now = 5_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Taken:
    at: float
    tokens: int  # reserved, then what settle left


def _max_in_any_window(log: list[Taken], seconds: float) -> int:
    """The most tokens any window [a, a + seconds) holds; the maximum is at a window starting at an entry."""
    return max((sum(t.tokens for t in log if a.at <= t.at < a.at + seconds) for a in log), default=0)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("advance"), st.one_of(st.floats(0, 5), st.floats(0, 70), st.floats(0, 90_000))),
        st.tuples(st.just("reserve"), st.integers(0, 1_100)),
        st.tuples(st.just("settle"), st.integers(0, 1_000), st.floats(0, 1)),
        st.tuples(st.just("retry"), st.integers(1, 1_000)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_no_window_exceeds_its_limit(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    clock = Clock()
    quota = MemoryQuota(clock=clock)
    log: list[Taken] = []
    open_: list[tuple[str, Taken]] = []
    for step in steps:
        if step[0] == "advance":
            clock.now += step[1]
        elif step[0] == "settle" and open_:
            rid, taken = open_.pop(step[1] % len(open_))
            actual = int(taken.tokens * step[2])
            quota.settle_now("t", rid, actual)
            taken.tokens = actual
        elif step[0] in ("reserve", "retry"):
            tokens = step[1]
            decision = quota.reserve_now("t", tokens, LIMITS)
            if not decision.allowed:
                _check_denial_is_justified(log, clock.now, tokens, decision.reason)
                if step[0] == "retry" and decision.reason == "insufficient_tokens":
                    clock.now += decision.retry_after_s + 1e-6  # Retry-After must be enough on its own
                    decision = quota.reserve_now("t", tokens, LIMITS)
                    assert decision.allowed, decision
            if decision.allowed and tokens > 0:
                assert decision.reservation_id is not None
                taken = Taken(clock.now, tokens)
                log.append(taken)
                open_.append((decision.reservation_id, taken))
        for limit, spec in WINDOWS:
            assert _max_in_any_window(log, spec.seconds) <= limit


def _check_denial_is_justified(log: list[Taken], now: float, tokens: int, reason: str | None) -> None:
    """A denial needs a window whose limit the request would break, counting tokens up to W + g old."""
    if reason == "exceeds_limit":
        assert any(tokens > limit for limit, _ in WINDOWS)
        return
    assert reason == "insufficient_tokens"
    assert any(
        sum(t.tokens for t in log if t.at > now - spec.seconds - spec.slot_s) + tokens > limit
        for limit, spec in WINDOWS
    ), (now, tokens)
