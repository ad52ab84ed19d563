"""Connections over real HTTP (uvicorn, the guarded protocol, the suite's engine): a header read timeout, a
per-address cap on connections without a valid key, bounded keep-alive, and X-Forwarded-For trusted only
from a named proxy (the per-address failure budget keys on the trusted address)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable

import httpx

from gateway.edge.connections import ConnectionGuard
from tests.gateway.conftest import Server, wait_for


def _guard(srv: Server) -> ConnectionGuard:
    guard = srv.app.state.connection_guard
    assert isinstance(guard, ConnectionGuard)
    return guard


def _connect(srv: Server) -> socket.socket:
    host, port = srv.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=20)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed `sock` (EOF or reset); reads up to the socket's timeout."""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_headers_that_never_finish_are_cut_off(gateway: Callable[..., Server]) -> None:
    srv = gateway(header_timeout_s=0.5)
    silent, slow = _connect(srv), _connect(srv)
    try:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        for _ in range(3):  # more header bytes keep arriving, but the headers never end
            slow.sendall(b"a")
        assert _closed_by_server(silent) and _closed_by_server(slow)
    finally:
        silent.close()
        slow.close()
    assert _guard(srv).timed_out >= 2
    assert httpx.get(srv.url + "/v1/models", headers=srv.headers("alice")).status_code == 200


def test_a_later_request_on_a_kept_alive_connection_has_a_header_deadline_too(
    gateway: Callable[..., Server],
) -> None:
    """The deadline starts again with each request: a second request whose headers never end is cut off,
    although the first one's headers arrived whole in one read (then no deadline was left running)."""
    srv = gateway(header_timeout_s=0.5, keep_alive_timeout_s=30)
    sock = _connect(srv)
    try:
        key = srv.keys["alice"]
        sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        before = _guard(srv).timed_out
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        for _ in range(3):
            sock.sendall(b"a")
        assert _closed_by_server(sock)  # long before the keep-alive bound of 30 s
    finally:
        sock.close()
    assert _guard(srv).timed_out == before + 1


def test_connections_without_a_key_are_capped_per_address(gateway: Callable[..., Server]) -> None:
    srv = gateway(max_unkeyed_connections_per_address=3, header_timeout_s=30)
    guard = _guard(srv)
    held = [_connect(srv) for _ in range(3)]
    try:
        wait_for(lambda: guard.unkeyed("127.0.0.1") == 3, 10, "three unkeyed connections counted")
        extra = _connect(srv)
        assert _closed_by_server(extra) and guard.refused == 1
        extra.close()
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: guard.unkeyed("127.0.0.1") == 0, 10, "closed connections uncounted")
    # A connection that carried a valid key no longer counts, though it stays open (keep-alive).
    with httpx.Client(base_url=srv.url, timeout=30) as keyed:
        assert keyed.get("/v1/models", headers=srv.headers("alice")).status_code == 200
        assert guard.unkeyed("127.0.0.1") == 0
        held = [_connect(srv) for _ in range(3)]
        wait_for(lambda: guard.unkeyed("127.0.0.1") == 3, 10, "three more counted")
        assert keyed.get("/v1/models", headers=srv.headers("alice")).status_code == 200
        for sock in held:
            sock.close()


def test_keep_alive_is_bounded(gateway: Callable[..., Server]) -> None:
    srv = gateway(keep_alive_timeout_s=1)
    sock = _connect(srv)
    try:
        key = srv.keys["alice"]
        sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:100]
        assert _closed_by_server(sock)  # idle after its answer: closed by the keep-alive bound
    finally:
        sock.close()


def _bad_keys(srv: Server, n: int, forwarded: Callable[[int], str]) -> list[int]:
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        return [
            c.get(
                "/v1/models",
                headers={"Authorization": "Bearer fs-bad", "X-Forwarded-For": forwarded(i)},
            ).status_code
            for i in range(n)
        ]


def test_forwarded_for_is_ignored_unless_the_peer_is_a_named_proxy(gateway: Callable[..., Server]) -> None:
    budget = {"auth_failure_burst": 5, "auth_failure_rate_per_s": 0.2}
    plain = gateway(**budget)  # default: no proxy trusted, the TCP peer is the address
    spoofed = _bad_keys(plain, 12, lambda i: f"10.0.{i // 250}.{i % 250}")
    assert spoofed.count(401) == 5 and spoofed.count(429) == 7
    proxied = gateway(forwarded_allow_ips="127.0.0.1", **budget)
    # Behind a named proxy each forwarded address has its own budget...
    assert set(_bad_keys(proxied, 12, lambda i: f"10.1.0.{i}")) == {401}
    # ...and one forwarded address that keeps failing is refused, keyed on that address.
    client = f"10.2.0.{uuid.uuid4().int % 250}"
    repeated = _bad_keys(proxied, 8, lambda i: client)
    assert repeated.count(401) == 5 and repeated[5:] == [429, 429, 429]
