"""A slotted sliding-window token counter: the arithmetic both quota backends share.

`MemoryQuota` runs this class; `RedisQuota` runs the same steps in Lua (admission/quota_redis.py), so
the two mean the same thing. A window of W seconds is cut into n slots of g = W / n seconds; a
reservation adds its tokens to the slot of the moment it was taken. At time t the window counts
every slot that overlaps (t - W, t], i.e. slot indices s - n .. s with s = floor(t / g), so every token
reserved in the last W seconds is counted. A reservation is admitted only when count + tokens <= limit,
which keeps **any** W-second window at or under the limit (settling can only give tokens back).

Why slots rather than a log of every request: bounded work and memory per tenant (at most n + 1
counters, each expired once) whatever the request rate. The price: a token keeps counting for between
W and W + g seconds, so a tenant at its limit may wait up to g longer than an exact log would make it.
Why not GCRA or a token bucket: with a burst as large as the limit both let 2x the limit through some
W-second window, which is the behaviour users reading "tokens per minute" do not expect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WindowSpec:
    """A window length and how many slots it is cut into."""

    seconds: float
    slots: int

    @property
    def slot_s(self) -> float:
        """Width g of one slot."""
        return self.seconds / self.slots


MINUTE = WindowSpec(60.0, 60)  # 1 s slots: tokens count for 60-61 s
DAY = WindowSpec(86_400.0, 144)  # 10 min slots: tokens count for 24 h to 24 h 10 min


class SlidingWindow:
    """One tenant's counter for one window: slot index -> tokens, oldest first (insertion order)."""

    def __init__(self, spec: WindowSpec) -> None:
        self.spec = spec
        self.slots: dict[int, int] = {}
        self.used = 0

    def advance(self, now: float) -> int:
        """Drop slots that no longer overlap the window ending at `now`; returns the current slot index."""
        s = math.floor(now / self.spec.slot_s)
        if self.slots:
            s = max(s, next(reversed(self.slots)))  # never insert behind the newest slot
        cutoff = s - self.spec.slots
        while self.slots:
            k = next(iter(self.slots))
            if k >= cutoff and self.slots[k] > 0:
                break
            self.used -= self.slots.pop(k)
        return s

    def add(self, slot: int, tokens: int) -> None:
        """Count `tokens` in `slot` (the current one: the dict stays ordered by index)."""
        if tokens > 0:
            self.slots[slot] = self.slots.get(slot, 0) + tokens
            self.used += tokens

    def refund(self, slot: int, tokens: int) -> None:
        """Give back up to `tokens` from `slot` if it still counts; tokens already out of the window stay out."""
        have = self.slots.get(slot, 0)
        take = min(tokens, have)
        if take > 0:
            self.slots[slot] = have - take
            self.used -= take

    def wait_s(self, need: int, now: float) -> float:
        """Seconds until at least `need` of the counted tokens have left the window (0 when need <= 0)."""
        if need <= 0:
            return 0.0
        freed = 0
        for k, n in self.slots.items():
            freed += n
            if freed >= need:
                return self._leaves_at(k) - now
        return math.inf

    def next_free_s(self, now: float) -> float:
        """Seconds until the oldest counted tokens leave (when the remaining allowance next grows)."""
        for k, n in self.slots.items():
            if n > 0:
                return max(0.0, self._leaves_at(k) - now)
        return 0.0

    def _leaves_at(self, slot: int) -> float:
        # Slot k stops overlapping (t - W, t] once floor(t / g) > k + n.
        return (slot + self.spec.slots + 1) * self.spec.slot_s
