"""The per-replica dispatch window: how many requests the gateway lets into one upstream engine at once.

Inside the engine the engine's own order (requests, not tenants) decides, so every request let in beyond
what keeps its batch full is service handed out without the fairness policy's say: the fairness bound
grows with the window (docs/fairness.md, "In front of an upstream engine"). The window therefore stays
just large enough to keep the engine busy with its own queue near empty:

- the engine's waiting-queue gauge (`vllm:num_requests_waiting`, `sglang:num_queue_reqs`,
  `tgi_queue_size`) above 0 on two readings in a row shrinks it by that queue (the engine holds
  requests it cannot run: they should still be in the gateway's queue, where the policy orders them);
- metrics older than `stale_s` count as a saturated engine (shrink by one per reading), as llm-d does;
- a full window with the engine's queue at 0 grows it by one per reading (additive increase, so it
  probes the batch's capacity slowly); without metrics, only while the time per output token stays
  within 1.5x the best average seen;
- with no metrics at all, the window steps at most once per request that ended (its time per token is
  the only news): a time per output token twice the best of the latest averages (BEST_HORIZON)
  shrinks it, one within 1.5x grows a full window, and a first token later than QUEUE_TPOT_FACTOR
  best token times after dispatch is read as queueing in the engine (shrink). Such a window starts at its floor, so that the best is
  measured on a nearly empty batch, and its ceiling is `window_max_unmetered` (8): an engine that runs
  whatever it is sent (`transformers serve` batches up to its token budget) has no full batch to show,
  and its time per token grows so slowly with the batch on a small model that the window wandered to 21
  for 24 clients (docs/upstream.md), where the engine's order, not the policy's, decided.

Hand-written (about 60 lines): a congestion window over two signals is smaller than any library's
general rate limiter, none of which take an engine's queue gauge.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# A time per output token this many times the best seen means the engine is overloaded (shrink) ...
_SLOW_FACTOR = 2.0
# ... and one within this factor lets a full window grow.
_GROW_FACTOR = 1.5
# A first token this many of the best tokens' time after dispatch means the request waited in the engine.
QUEUE_TPOT_FACTOR = 50.0
_EWMA = 0.2
_WARM = 4  # requests before the average counts as a best
BEST_HORIZON = 64  # the best is the lowest of this many latest averages (`observe_tpot` says why)


@dataclass
class WindowReading:
    """What the window is adapted from at one moment."""

    engine_queue: float | None  # the gauge, or None when the engine has no metrics
    stale: bool  # the engine has metrics and the latest reading is older than the stale bound


class AdaptiveWindow:
    """A congestion window of requests in flight to one replica, between `low` and `high`."""

    def __init__(self, low: int, high: int, start: int) -> None:
        self.low = low
        self.high = high
        self.size = float(start)
        self.in_flight = 0
        self.tpot_best: float | None = None
        self.tpot_ewma: float | None = None
        self._recent: deque[float] = deque(maxlen=BEST_HORIZON)  # the latest averages, for the best
        self.samples = 0
        self._last_queue = 0.0  # the engine's queue at the previous reading
        self._fresh = False  # a request's time per token came in since the window last stepped on one
        self.shrinks = 0
        self.grows = 0

    @property
    def limit(self) -> int:
        """Requests that may be in flight now."""
        return int(self.size)

    def has_room(self) -> bool:
        """Whether one more request may be dispatched to this replica."""
        return self.in_flight < self.limit

    def observe_tpot(self, seconds_per_token: float) -> None:
        """One request's time per output token (first token to last, over its tokens).

        The best is the lowest *average* seen (after `_WARM` requests), not the lowest request's: one
        request alone in a batch is fast, and a best from it would make every average look slow. And it is
        the lowest of the last `BEST_HORIZON` averages, not of all time: a best from a quiet moment of a
        shared host made every later average look slow once the host got busier (the gateway, its clients
        and a CPU engine on two cores: `transformers serve`'s 3.7 ms a token at warm-up, 7.6-10 ms under
        the bench's load at a window of 2), and the window sat at its floor (1-3 in flight, a quarter of
        the engine's throughput alone). Forgetting it, the window can climb one ended request at a time
        while each step costs under `_GROW_FACTOR` of the pace just seen, up to its ceiling, which is what
        bounds the fairness it gives away (docs/fairness.md)."""
        if not seconds_per_token > 0:
            return
        ewma = self.tpot_ewma
        self.tpot_ewma = seconds_per_token if ewma is None else ewma + _EWMA * (seconds_per_token - ewma)
        self.samples += 1
        self._fresh = True
        if self.samples >= _WARM:
            self._recent.append(self.tpot_ewma)
            self.tpot_best = min(self._recent)

    def queued_in_engine(self, first_token_after_s: float) -> bool:
        """Whether a first token this long after dispatch says the request waited in the engine's queue."""
        best = self.tpot_best
        return best is not None and first_token_after_s > QUEUE_TPOT_FACTOR * best

    def adapt(self, reading: WindowReading) -> None:
        """Shrink on the engine's queue (or stale metrics, or slow tokens); grow a full window on none.

        The queue counts only when two readings in a row show it, by the smaller of the two: an engine admits
        at its step boundaries, so a reading often catches requests that arrived within the last step and
        wait for its end with seats free; only a queue that outlasts a reading interval is a full batch."""
        queue = reading.engine_queue
        if queue is None and not reading.stale:
            self._adapt_on_tokens()
            return
        persistent = None if queue is None else min(queue, self._last_queue)
        self._last_queue = 0.0 if queue is None else queue
        if reading.stale:
            self._shrink(1.0)
        elif persistent is not None and persistent > 0:
            self._shrink(persistent)
        elif self.in_flight >= self.limit and queue == 0:
            self._grow()

    def _adapt_on_tokens(self) -> None:
        """An engine without metrics: one step per request that ended since the last (its time per token is
        the only news; stepping every reading would run the window far past what the signal has seen)."""
        if not self._fresh:
            return
        self._fresh = False
        if self._slow():
            self._shrink(1.0)
        elif self.in_flight >= self.limit and self._steady():
            self._grow()

    def engine_queued(self) -> None:
        """A request waited in the engine (inferred from its first token, for engines without metrics)."""
        self._shrink(1.0)

    def _slow(self) -> bool:
        best, ewma = self.tpot_best, self.tpot_ewma
        return best is not None and ewma is not None and ewma > _SLOW_FACTOR * best

    def _steady(self) -> bool:
        """Tokens come about as fast as the best seen (known only once `_WARM` requests have ended): the
        engine without metrics has room, as far as the gateway can tell."""
        best, ewma = self.tpot_best, self.tpot_ewma
        return best is not None and ewma is not None and ewma <= _GROW_FACTOR * best

    def _shrink(self, by: float) -> None:
        new = max(float(self.low), self.size - max(1.0, by))
        if new < self.size:
            self.shrinks += 1
        self.size = new

    def _grow(self) -> None:
        if self.size < self.high:
            self.grows += 1
            self.size = min(float(self.high), self.size + 1.0)
