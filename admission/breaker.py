"""A circuit breaker for one backend the edge can live without (Redis): fail fast while it is down.

Every call runs under a short deadline. A connection error or a timeout opens the breaker: from then
on calls fail at once with `BackendUnavailable` (carrying how long until the next try, for
`Retry-After`) instead of each request waiting out a timeout on a dead or frozen server. While open,
a background task probes the backend (a PING) with exponential, jittered back-off (tenacity's
`wait_exponential_jitter`); the first probe that answers closes the breaker again.

Hand-written rather than pybreaker, aiobreaker or purgatory: pybreaker's asynchronous support is
Tornado's, aiobreaker is unmaintained (last release 2021), purgatory brings its own unit-of-work storage,
and all three let a *caller's* request be the half-open trial. With a frozen Redis that trial waits the
whole timeout, so one request per back-off period would stall; probing from a task of our own means no
request ever waits on a backend that is known to be down. The state machine is ~60 lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_never,
    wait_exponential_jitter,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class BackendUnavailable(Exception):
    """The backend did not answer in time, refused, or its breaker is open; `retry_after_s` until the next try."""

    def __init__(self, name: str, retry_after_s: float, detail: str = "") -> None:
        super().__init__(f"{name} unavailable{': ' + detail if detail else ''}")
        self.name = name
        self.retry_after_s = retry_after_s


class CircuitBreaker:
    """Closed: calls go through under `timeout_s`. Open: calls fail at once; a background probe closes it."""

    def __init__(
        self,
        name: str,
        probe: Callable[[], Awaitable[Any]],
        *,
        timeout_s: float,
        failures: tuple[type[BaseException], ...],
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        on_change: Callable[[bool], None] | None = None,
        before_probe: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.trips = 0
        self.last_error = ""
        self._probe = probe
        self._failures: tuple[type[BaseException], ...] = (*failures, TimeoutError)
        self._initial = backoff_initial_s
        self._max = backoff_max_s
        self._on_change = on_change
        self._before_probe = before_probe  # e.g. drop pooled connections the outage left dead
        self._opened_at: float | None = None
        self._next_try_at = 0.0
        self._recovery: asyncio.Task[None] | None = None
        self._closed: asyncio.Event | None = None  # set when a probe closes the breaker; made on the loop

    @property
    def is_open(self) -> bool:
        """True while calls fail fast."""
        return self._opened_at is not None

    def retry_after_s(self) -> float:
        """Seconds until the next probe (0 when closed)."""
        return max(0.0, self._next_try_at - time.monotonic()) if self.is_open else 0.0

    def snapshot(self) -> dict[str, Any]:
        """State for /readyz: no tenant data, only the backend's health."""
        if self._opened_at is None:
            return {"state": "closed", "trips": self.trips}
        return {
            "state": "open",
            "trips": self.trips,
            "open_for_s": round(time.monotonic() - self._opened_at, 3),
            "next_probe_in_s": round(self.retry_after_s(), 3),
            "last_error": self.last_error,
        }

    async def call(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run `op` under the deadline; raise `BackendUnavailable` when open or when it fails or times out."""
        if self._opened_at is not None:
            raise BackendUnavailable(self.name, self.retry_after_s(), "circuit open")
        try:
            async with asyncio.timeout(self.timeout_s):
                return await op()
        except self._failures as exc:
            self._trip(exc)
            raise BackendUnavailable(self.name, self.retry_after_s(), type(exc).__name__) from exc

    async def wait_closed(self) -> None:
        """Return once the breaker is closed (at once if it is)."""
        if self._opened_at is not None and self._closed is not None:
            await self._closed.wait()

    async def check(self) -> bool:
        """Closed and answering a probe now (bounded by the timeout); never waits while open."""
        if self._opened_at is not None:
            return False
        try:
            await self.call(self._probe)
        except BackendUnavailable:
            return False
        return True

    def _trip(self, exc: BaseException) -> None:
        self.last_error = type(exc).__name__
        if self._opened_at is not None:
            return
        self.trips += 1
        self._opened_at = time.monotonic()
        self._next_try_at = self._opened_at + self._initial
        self._closed = asyncio.Event()
        log.warning(
            "%s unavailable (%s): failing fast, probing in the background", self.name, self.last_error
        )
        if self._on_change is not None:
            self._on_change(True)
        self._recovery = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        await asyncio.sleep(self._initial)
        retrying = AsyncRetrying(
            wait=wait_exponential_jitter(initial=self._initial * 2, max=self._max, jitter=self._initial),
            retry=retry_if_exception_type(Exception),
            stop=stop_never,
            before_sleep=self._scheduled,
            reraise=True,
        )
        await retrying(self._probe_once)
        self._opened_at = None
        self._recovery = None
        if self._closed is not None:
            self._closed.set()
        log.warning("%s answers again: circuit closed", self.name)
        if self._on_change is not None:
            self._on_change(False)

    async def _probe_once(self) -> None:
        self._next_try_at = time.monotonic() + self.timeout_s
        async with asyncio.timeout(self.timeout_s):
            if self._before_probe is not None:
                await self._before_probe()
            await self._probe()

    def _scheduled(self, state: RetryCallState) -> None:
        wait = state.next_action.sleep if state.next_action is not None else self._initial
        self._next_try_at = time.monotonic() + wait

    async def close(self) -> None:
        """Stop probing (shutdown)."""
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._recovery
            self._recovery = None


def breaker_metrics(registry: CollectorRegistry, backend: str) -> Callable[[bool], None]:
    """`fairserve_backend_circuit_open{backend}` (1 while failing fast) and `..._trips_total`, as an on_change."""
    is_open = Gauge(
        "fairserve_backend_circuit_open",
        "1 while calls to the backend fail fast (breaker open).",
        ["backend"],
        registry=registry,
    ).labels(backend=backend)
    trips = Counter(
        "fairserve_backend_circuit_trips",
        "Times the backend's breaker opened.",
        ["backend"],
        registry=registry,
    ).labels(backend=backend)

    def changed(opened: bool) -> None:
        is_open.set(1 if opened else 0)
        if opened:
            trips.inc()

    return changed
