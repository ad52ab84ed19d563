"""Connections at the edge: a header read timeout, a per-address cap on connections without a valid key,
bounded keep-alive, and forwarded headers trusted only from the proxies the operator names.

uvicorn offers bounded keep-alive (`timeout_keep_alive`) and trusted proxies (`proxy_headers`,
`forwarded_allow_ips`), used as they are. It has no header read timeout for httptools (its keep-alive
timer is cancelled by the first byte of a request, so a client that sends one header byte every few
seconds holds its connection forever) and no per-address connection count; both live here, in a small
subclass of uvicorn's httptools protocol, because only the protocol sees a connection before the first
request's headers are complete, which is when these must act.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import uvicorn

from gateway.edge.protocol import LeanHttpProtocol

# The scope key under which a request finds its connection's `prove` (gateway/edge/auth.py calls it).
PROVE_KEY = "fairserve.prove_connection"


@dataclass
class ConnectionGuard:
    """Open connections per client address that have not yet carried a request with a valid key.

    A connection counts from its first byte until a request on it authenticates (or it closes); past
    `max_unkeyed_per_address` a new one from that address is closed at once. Trusted proxies are exempt:
    every client behind them shares their address.
    """

    header_timeout_s: float
    max_unkeyed_per_address: int
    trusted_proxies: frozenset[str] = frozenset()
    refused: int = 0  # connections closed at once (the address was at its cap)
    timed_out: int = 0  # connections closed because their headers did not arrive in time

    def __post_init__(self) -> None:
        self._unkeyed: dict[str, int] = {}

    def exempt(self, address: str) -> bool:
        """True for a trusted proxy's address (the cap would count all its clients as one)."""
        return address in self.trusted_proxies or "*" in self.trusted_proxies

    def admit(self, address: str) -> bool:
        """Count a new connection from `address`; False (and counted as refused) when it is at its cap."""
        open_now = self._unkeyed.get(address, 0)
        if open_now >= self.max_unkeyed_per_address:
            self.refused += 1
            return False
        self._unkeyed[address] = open_now + 1
        return True

    def leave(self, address: str) -> None:
        """An unkeyed connection of `address` closed or proved itself."""
        left = self._unkeyed.get(address, 0) - 1
        if left > 0:
            self._unkeyed[address] = left
        else:
            self._unkeyed.pop(address, None)

    def unkeyed(self, address: str) -> int:
        """Open connections of `address` without a valid key yet."""
        return self._unkeyed.get(address, 0)


class GuardedHttpProtocol(LeanHttpProtocol):
    """uvicorn's httptools protocol (gateway/edge/protocol.py) with the guard's cap and a deadline on every request's headers."""

    guard: ConnectionGuard  # set on the subclass `guarded_protocol` makes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        self._in_headers = False  # a request has begun and its headers are not complete yet
        super().connection_made(transport)
        self._prove = self.prove  # bound once: every request's scope carries it
        self._address = self.client[0] if self.client else "unknown"
        self._header_timer: asyncio.TimerHandle | None = None
        self._counted = False
        if not self.guard.exempt(self._address):
            if not self.guard.admit(self._address):
                transport.abort()
                return
            self._counted = True
        self._arm()  # the first request's headers are due from the first moment

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.guard.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        self.guard.timed_out += 1
        self.transport.abort()

    def prove(self) -> None:
        """A request on this connection carried a valid key: it no longer counts against its address."""
        if self._counted:
            self._counted = False
            self.guard.leave(self._address)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # A request began in this data (after keep-alive, or pipelined) and its headers are still incomplete:
        # they are due within the deadline. Armed here rather than at the request's first byte, because
        # the usual request's headers arrive whole in one read, and a timer set and cancelled for each
        # of those was pure cost.
        if self._in_headers:
            self._arm()

    def on_message_begin(self) -> None:
        self._in_headers = True
        super().on_message_begin()
        self.scope[PROVE_KEY] = self._prove  # type: ignore[literal-required]  # a fairserve scope key

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle between requests is keep-alive's to bound

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.prove()  # a closed connection no longer counts either
        super().connection_lost(exc)


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedHttpProtocol]:
    """A protocol class bound to `guard` (uvicorn builds one protocol per connection from the class)."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"guard": guard})


def prove_connection(scope: MutableMapping[str, Any]) -> None:
    """Tell the connection of `scope` that it carried a valid key (no-op outside the guarded protocol)."""
    prove: Callable[[], None] | None = scope.get(PROVE_KEY)
    if prove is not None:
        prove()


def server_config(app: Any, settings: Any, **overrides: Any) -> uvicorn.Config:
    """uvicorn's Config for the gateway: keep-alive, trusted proxies and the guarded protocol from
    `settings` (a GatewaySettings); `overrides` are uvicorn.Config's own arguments (host, port, ...)."""
    trusted = [a.strip() for a in settings.forwarded_allow_ips.split(",") if a.strip()]
    guard = ConnectionGuard(
        settings.header_timeout_s, settings.max_unkeyed_connections_per_address, frozenset(trusted)
    )
    app.state.connection_guard = guard
    # uvicorn builds each response's access-log line (the client address, the quoted path) before asking
    # the logger whether it wants it; `serve` logs at warning, where the access log never prints.
    overrides.setdefault("access_log", False)
    return uvicorn.Config(
        app,
        http=guarded_protocol(guard),
        timeout_keep_alive=max(1, round(settings.keep_alive_timeout_s)),
        proxy_headers=bool(trusted),
        forwarded_allow_ips=trusted or None,
        **overrides,
    )
