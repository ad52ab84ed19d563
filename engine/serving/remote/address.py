"""The one spelling of an engine server's address, checked where it is configured, not when a socket opens."""

from __future__ import annotations

import ipaddress


def check_address(address: str, bind: bool = False) -> str:
    """Raise ValueError unless `address` is tcp://HOST:PORT (port 0 only where binding: any free port)."""
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if not address.startswith("tcp://") or not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"engine address {address!r}: use tcp://HOST:PORT")
    if port == "0" and not bind:
        raise ValueError(f"engine address {address!r}: a gateway needs the engine's real port, not 0")
    return address


def bindable(listen: str) -> str:
    """ZeroMQ spells "any free port" as `*`; accept the usual `:0` for it."""
    check_address(listen, bind=True)
    host, _, port = listen.rpartition(":")
    return f"{host}:{'*' if port == '0' else port}"


def is_loopback(address: str) -> bool:
    """True when tcp://HOST:PORT binds only this host's loopback (a name other than localhost, `*` or a
    wildcard address may be reachable from elsewhere)."""
    host = address.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
