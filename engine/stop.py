"""Stop strings on streamed text: cut at the first match and hold back a possible match in progress."""

from __future__ import annotations


class StopChecker:
    """Tracks a request's output text against its stop strings."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.text = ""
        self.emitted = 0  # characters already released to the stream
        self.matched = False

    def push(self, delta: str) -> tuple[str, bool]:
        """Add decoded text; returns (text safe to release now, stopped)."""
        if self.matched:
            return "", True
        start = max(0, len(self.text) - max((len(s) for s in self.stops), default=0))
        self.text += delta
        if self.stops:
            hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.matched = True
                self.text = self.text[: min(hits)]
                return self._release(len(self.text)), True
        return self._release(len(self.text) - self._held_back()), False

    def flush(self) -> str:
        """Release whatever was held back (the request ended without a stop match)."""
        return self._release(len(self.text))

    def _held_back(self) -> int:
        # The longest tail of text that is a proper prefix of some stop string may still become a match.
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _release(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted : upto]
        self.emitted = upto
        return out
