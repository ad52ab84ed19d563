"""uvicorn's httptools protocol with two per-connection services its ASGI interface lacks, both for CPU:

- **A hang-up watch without a task.** ASGI learns of a client that went away only by awaiting `receive()`,
  so a reply that waits for the engine needed a second task per request just to await it (a task
  created, stepped, cancelled with an exception through three frames). `watch_hangup` in the scope
  calls a plain callback from the protocol's `connection_lost` instead.
- **A reply in one write.** uvicorn writes a response's head when `http.response.start` is sent and the
  body on the next `send`: two syscalls and two wake-ups of the client for a reply that is ready as a
  whole. After `hold_head` in the scope, the head waits for the body's first write and goes out with it.

An app that finds neither key in the scope (another server, a test client) falls back to plain ASGI
(gateway/openai/responses.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, MutableMapping
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Scope keys: `watch_hangup(callback)` returns a function that stops the watch, or None when the client
# is gone already; `hold_head()` makes the next response head wait for the body's first write.
WATCH_HANGUP_KEY = "fairserve.watch_hangup"
HOLD_HEAD_KEY = "fairserve.hold_head"

Hangup = Callable[[], None]


class HeadHoldingTransport:
    """The connection's transport as uvicorn's request cycle writes to it: passes everything through,
    except that after `hold` the next write (a response's head) waits to be joined to the one after.

    A wrapper rather than a change to uvicorn's cycle, which builds and writes the head in one method.
    """

    __slots__ = ("_held", "_holding", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._holding = False
        self._held: bytes | None = None

    def hold(self) -> None:
        """Keep the next write until the one after it, and send both as one."""
        self._holding = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write `data`, or keep it (a held head), or send the held head and `data` in one write."""
        if not self._holding:
            self.transport.write(data)
        elif self._held is None:
            self._held = bytes(data)
        else:
            held, self._held, self._holding = self._held, None, False
            self.transport.write(held + data)

    def _flush(self) -> None:
        held, self._held, self._holding = self._held, None, False
        if held is not None and not self.transport.is_closing():
            self.transport.write(held)

    def close(self) -> None:
        """Close after writing a held head (a reply ended with nothing after its head)."""
        self._flush()
        self.transport.close()

    def is_closing(self) -> bool:
        """The transport's own answer."""
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)  # the rest of the Transport API, unchanged


class LeanHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol offering `watch_hangup` and `hold_head` in every request's scope."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        self._hangup_watchers: list[Hangup] = []
        super().connection_made(transport)
        self._writer = HeadHoldingTransport(transport)
        self.transport = cast(asyncio.Transport, self._writer)  # what each request cycle writes to
        self._watch, self._hold = self.watch_hangup, self._writer.hold  # bound once, put in every scope

    def on_message_begin(self) -> None:
        super().on_message_begin()
        scope = cast(MutableMapping[str, Any], self.scope)
        scope[WATCH_HANGUP_KEY] = self._watch
        scope[HOLD_HEAD_KEY] = self._hold

    def watch_hangup(self, callback: Hangup) -> Callable[[], None] | None:
        """Call `callback` (once) when the client closes the connection; returns the function that stops
        watching, or None when it is closed already."""
        if self.transport.is_closing():
            return None
        self.flow.resume_reading()  # as uvicorn's receive() does: a paused transport would miss the hang-up
        self._hangup_watchers.append(callback)
        return lambda: self._unwatch(callback)

    def _unwatch(self, callback: Hangup) -> None:
        if callback in self._hangup_watchers:
            self._hangup_watchers.remove(callback)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        watchers, self._hangup_watchers = self._hangup_watchers, []
        for callback in watchers:
            callback()
