"""One replica of an upstream model: its address, kind, dispatch window, breaker and metrics watch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import httpx

from admission.breaker import BackendUnavailable, CircuitBreaker
from upstream.call import RetryableFailure, open_stream
from upstream.config import UpstreamSettings
from upstream.kinds import KINDS, gauge_value
from upstream.probe import ProbeResult
from upstream.window import AdaptiveWindow, WindowReading

log = logging.getLogger("fairserve.upstream")


class Replica:
    """An upstream engine at one URL, with the requests the gateway has in flight there."""

    def __init__(self, found: ProbeResult, settings: UpstreamSettings) -> None:
        self.url = found.url
        self.found = found
        self.traits = KINDS[found.kind]
        self.settings = settings
        self.window = _window(settings, self.watches_metrics)
        self.engine_queue: float | None = None  # the last reading of the engine's waiting-queue gauge
        self.read_at: float | None = None  # monotonic time of that reading
        self.failures = 0
        self.client: httpx.AsyncClient | None = None
        self.breaker: CircuitBreaker | None = None
        self._watch: asyncio.Task[None] | None = None
        self.on_change: Any = None  # called when the window may have room again (the dispatcher's kick)

    @property
    def watches_metrics(self) -> bool:
        """Whether the engine has a waiting-queue gauge this replica reads."""
        return self.found.has_metrics and self.traits.queue_metric is not None

    def bind(self) -> None:
        """Make the client, the breaker and the metrics watch on the running loop (once)."""
        if self.client is not None:
            return
        timeout = httpx.Timeout(None, connect=self.settings.connect_timeout_s)
        # No pool limit: the window bounds the calls in flight, and a limit here would queue them unseen.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self.client = httpx.AsyncClient(timeout=timeout, limits=limits)
        self.breaker = CircuitBreaker(
            f"upstream {self.url}",
            self._probe,
            timeout_s=max(self.settings.connect_timeout_s, 1.0) * 2,
            failures=(RetryableFailure,),
            backoff_initial_s=self.settings.breaker_s,
            on_change=self._breaker_changed,
        )
        self._watch = asyncio.get_running_loop().create_task(self._watch_metrics())

    def available(self) -> bool:
        """Not skipped by its breaker, and its window has room."""
        return self.breaker is not None and not self.breaker.is_open and self.window.has_room()

    async def open(self, body: dict[str, Any], request_id: str) -> httpx.Response:
        """Open a stream under the breaker: BackendUnavailable when it is open or the call fails (which
        opens it); InvalidRequestError when the engine refuses this request."""
        assert self.client is not None and self.breaker is not None
        client = self.client
        return await self.breaker.call(lambda: open_stream(client, self.url, body, request_id))

    async def failed(self, reason: str) -> None:
        """A stream that broke after it opened: the replica is skipped for a while, as for a refusal.

        The breaker opens only on a failure inside its `call`; a stream that dies mid-read is such a
        failure too, so it is handed to the breaker as one (its probe then decides when to try again).
        """
        assert self.breaker is not None

        async def broke() -> None:
            raise RetryableFailure(reason)

        with contextlib.suppress(BackendUnavailable):
            await self.breaker.call(broke)

    async def _probe(self) -> None:
        assert self.client is not None
        response = await self.client.get(f"{self.url}/v1/models", timeout=self.settings.connect_timeout_s)
        response.raise_for_status()

    def _breaker_changed(self, opened: bool) -> None:
        if not opened and self.on_change is not None:
            self.on_change()

    def reading(self, now: float) -> WindowReading:
        """What the window adapts from now: the queue gauge, or stale when the last reading is too old."""
        if not self.watches_metrics:
            return WindowReading(None, False)
        stale = self.read_at is None or now - self.read_at > self.settings.metrics_stale_s
        return WindowReading(self.engine_queue, stale)

    async def _watch_metrics(self) -> None:
        """Every `metrics_interval_s`: read the queue gauge (where there is one) and adapt the window."""
        interval = self.settings.metrics_interval_s
        while True:
            if self.watches_metrics:
                await self._read_queue()
            before = self.window.limit
            self.window.adapt(self.reading(time.monotonic()))
            if self.window.limit > before and self.on_change is not None:
                self.on_change()
            await asyncio.sleep(interval)

    async def _read_queue(self) -> None:
        assert self.client is not None and self.traits.queue_metric is not None
        try:
            page = await self.client.get(f"{self.url}/metrics", timeout=self.settings.metrics_stale_s)
        except httpx.HTTPError:
            return  # the reading ages; past the stale bound the window counts the engine as saturated
        if page.status_code == 200:
            value = gauge_value(page.text, self.traits.queue_metric)
            if value is not None:
                self.engine_queue, self.read_at = value, time.monotonic()

    async def close(self) -> None:
        """Stop the watch and the breaker's probe; close the connections."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self.breaker is not None:
            await self.breaker.close()
        if self.client is not None:
            await self.client.aclose()


def _window(settings: UpstreamSettings, metered: bool) -> AdaptiveWindow:
    """Without a queue gauge the window learns the engine's best time per token from its first requests,
    so it starts at its floor, where that time is the unloaded one, and stays under `window_max_unmetered`
    (upstream/window.py says why)."""
    if metered:
        return AdaptiveWindow(settings.window_min, settings.window_max, settings.window_start)
    high = min(settings.window_max, settings.window_max_unmetered)
    return AdaptiveWindow(settings.window_min, high, settings.window_min)
