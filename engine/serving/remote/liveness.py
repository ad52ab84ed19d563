"""How a gateway tells a slow engine from a dead one: suspicion on silence, loss only on a definite sign.

An engine reports stats at least every 50 ms, but a process starved of CPU (a loaded machine, a long GC
pause, a swapping host) can be silent for longer while it is perfectly able to finish its requests.
So silence past `heartbeat_timeout_s` only makes the engine *suspect*: routers send it no new request
while another engine is alive, and its requests in flight keep running. It is *lost* (its requests in
flight fail with the retryable 503) only on a definite sign:

- the TCP connection dropped: a killed process's kernel closes it at once, and ZeroMQ's socket monitor
  reports EVENT_DISCONNECTED (`ConnectionWatch` below);
- the engine said goodbye (WorkerExiting), or announced a new engine_id (it restarted);
- silence past `lost_timeout_s`, the longer bound, for what leaves the connection up: a frozen process
  (SIGSTOP), a hung host, a network cut with no reset.

Either side counts a peer's silence only over time it was running itself (`StallClock`): a gateway or
engine that was stopped for longer than its peer's bound would otherwise, in the moment it wakes and
before ZeroMQ's I/O thread has handed it the messages queued meanwhile, judge a live peer silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from engine.serving.remote.curve import HANDSHAKE_REFUSED


@dataclass(frozen=True)
class SilenceBounds:
    """How long an engine may be silent: suspect past `heartbeat_timeout_s`, lost past `lost_timeout_s`."""

    heartbeat_timeout_s: float
    lost_timeout_s: float

    def __post_init__(self) -> None:
        if self.lost_timeout_s < self.heartbeat_timeout_s:
            raise ValueError(
                f"lost_timeout_s ({self.lost_timeout_s}) is shorter than heartbeat_timeout_s "
                f"({self.heartbeat_timeout_s}): an engine is suspect before it is lost"
            )


# A gap this long between two of a thread's own silence checks (they come every 10-100 ms) is the process
# stopped or starved, not the peer silent. Below the shortest bound a peer is lost on (the engine's 3 s).
STALL_S = 1.0


class StallClock:
    """How long the thread that checks a peer's silence did not run: the gap between two of its checks,
    when over `stall_s`. That time is not the peer's silence: it could not have been heard meanwhile."""

    __slots__ = ("stall_s", "_checked_at")

    def __init__(self, stall_s: float = STALL_S) -> None:
        self.stall_s = stall_s
        self._checked_at: float | None = None

    def stalled(self, now: float) -> float:
        """Seconds this thread was stalled since its last check (0.0 when it was not), noting this check."""
        last, self._checked_at = self._checked_at, now
        gap = 0.0 if last is None else now - last
        return gap if gap > self.stall_s else 0.0


@dataclass
class ConnectionEvents:
    """What the socket monitor reported since it was last read."""

    connected: bool = False
    disconnected: bool = False
    refused: zmq.Event | None = None  # the handshake failure event, when the engine and this side disagreed


class ConnectionWatch:
    """A DEALER's connections as ZeroMQ's socket monitor reports them (read it under the socket's lock).

    Kept for the socket's whole life: during start a refused handshake fails at once and a connection
    shows the engine is reachable; afterwards a disconnection is the first sign of a killed engine.
    """

    _EVENTS = HANDSHAKE_REFUSED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self._mon: zmq.Socket[Any] | None = sock.get_monitor_socket(self._EVENTS)

    def read(self) -> ConnectionEvents:
        """Drain the monitor without waiting (a socket option check when nothing came: the hot path)."""
        seen = ConnectionEvents()
        mon = self._mon
        while mon is not None and int(mon.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            event = recv_monitor_message(mon, zmq.NOBLOCK)["event"]
            if event == zmq.EVENT_CONNECTED:
                seen.connected = True
            elif event == zmq.EVENT_DISCONNECTED:
                seen.disconnected = True
            else:
                seen.refused = zmq.Event(event)
        return seen

    def close(self, sock: zmq.Socket[Any] | None) -> None:
        """Stop monitoring `sock` (None: already closed) and close the monitor's end."""
        mon, self._mon = self._mon, None
        if mon is None:
            return
        if sock is not None:
            sock.disable_monitor()
        mon.close(linger=0)
