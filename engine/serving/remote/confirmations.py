"""A gateway's recent confirmations (`Billed`) to one engine, kept to be said again.

A `Billed` is sent without an answer. One the engine never read is lost: the connection was down when it
went (ZMQ_IMMEDIATE drops it), or the engine was killed with it unread. The engine then keeps that
request's record forever: its owner, this gateway, is connected, so no gateway bills it as a dead
gateway's; and when the gateway billed fewer tokens than the engine produced (it had lost the engine, which
went on), the difference is never billed (the chaos benchmark caught one such token). So every
confirmation of the last `KEEP_S` is said again each time the engine comes back (a new process or a
connection regained). Saying one twice is harmless: the engine ignores ids it no longer holds, and a
supplement record is settled only by the count-less confirmation of the gateway that bills it
(engine/serving/remote/accounting.py).
"""

from __future__ import annotations

import time
from collections import deque

KEEP_S = 120.0  # longer than an engine restart takes; a record older than this stays for reconcile
MAX_KEPT = 200_000  # ids: bounded memory whatever the request rate


class RecentConfirmations:
    """Confirmations with counts sent in the last KEEP_S, oldest first, at most MAX_KEPT ids.

    Count-less ones (a dead gateway's records billed, a foreign peer's refused) are not kept: if one is
    lost, the record is offered again as an orphan and the ledger skips the duplicate row.
    """

    def __init__(self) -> None:
        self._sent: deque[tuple[float, str, int]] = deque(maxlen=MAX_KEPT)

    def keep(self, request_ids: list[str], completion_tokens: list[int]) -> None:
        """Remember one confirmation (counts aligned with ids)."""
        now = time.monotonic()
        self._sent.extend(
            (now, rid, count) for rid, count in zip(request_ids, completion_tokens, strict=True)
        )

    def recent(self) -> tuple[list[str], list[int]] | None:
        """The confirmations of the last KEEP_S as one message's ids and counts (None if there are none)."""
        cutoff = time.monotonic() - KEEP_S
        while self._sent and self._sent[0][0] < cutoff:
            self._sent.popleft()
        if not self._sent:
            return None
        return [rid for _, rid, _ in self._sent], [count for _, _, count in self._sent]
