"""Publishing a worker's messages from a thread of its own, so step N's report is encoded and sent while
step N+1 is scheduled and run (its forward releases the GIL for most of its time).

The messages are the same, in the same order, as when the loop sends them itself: one thread sends
them all, and the loop hands over only finished snapshots (each OutputDelta, its metrics, the stats
and traces are fresh objects the engine does not touch again). A small bounded queue keeps the
back-pressure of a full pipe on the loop, as a blocking send did. Opt-in: `EngineConfig.overlap_publish`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


class BackgroundPublisher:
    """A callable like the `send` it wraps; the sending happens on its thread, in call order."""

    def __init__(self, send: Callable[[Any], None], depth: int = 2) -> None:
        self._send = send
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fairserve-publish", daemon=True)
        self._thread.start()

    def __call__(self, msg: Any) -> None:
        """Queue `msg` (blocks while `depth` messages wait); raises what a previous send raised."""
        if self._error is not None:
            raise self._error
        self._queue.put(msg)

    def close(self, timeout_s: float = 30.0) -> None:
        """Send everything queued, stop the thread, and raise what a send raised."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout_s)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            msg = self._queue.get()
            if msg is _STOP:
                return
            try:
                self._send(msg)
            except BaseException as exc:  # handed to the loop at its next publish or at close
                self._error = exc
                while True:  # drain, so a loop blocked on a full queue wakes up and sees the error
                    try:
                        if self._queue.get_nowait() is _STOP:
                            return
                    except queue.Empty:
                        break
                return
