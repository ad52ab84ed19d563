"""What a request may wait for before it is queued for a seat, as states of the request in the scheduler.

A request that names an adapter not yet in host memory waits for its load (`WAITING_FOR_ADAPTER`); one
whose grammar is not compiled yet waits for the compile (`WAITING_FOR_GRAMMAR`); on a decode engine one
waits for its prompt's KV from the prefill engine (`WAITING_FOR_KV`). Each is a state of a live request
in the scheduler (`SchedulerState.requests`), as vLLM keeps `WAITING_FOR_FSM` and `WAITING_FOR_REMOTE_KVS`
in its waiting queue: abort, cancel, deadlines and refusals look in one place. A request in such a state
holds no batch seat, no KV block and no place in the fairness order; the scheduler passes it through its
waits in order (the adapter before the grammar) and queues it when the last lets it go.

The adapter and the grammar are `Wait`s the scheduler polls at every step start (engine/worker/lora/intake.py,
engine/worker/grammar/intake.py). The KV pull is driven from outside, by the decode engine's loop
(engine/serving/disagg.py), through `SchedulerState.hold` and `queue_held`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.core.errors import InvalidRequestError
from engine.core.request import Request, RequestState

# The states of a request that waits outside the fairness queue.
HELD_STATES = frozenset(
    {RequestState.WAITING_FOR_ADAPTER, RequestState.WAITING_FOR_GRAMMAR, RequestState.WAITING_FOR_KV}
)


class Wait(Protocol):
    """Something a request may need before it is queued, polled by the scheduler at every step start."""

    @property
    def state(self) -> RequestState:
        """The state of a request this wait holds."""

    def hold(self, request: Request, members: Sequence[Request]) -> bool:
        """True when `request` must wait here (its wait starts now); False when it may go on at once (what
        it needed is ready and attached to each of `members`: the choices of n > 1, else the request).
        Raises InvalidRequestError naming the field when what it needs is known to fail."""

    def admit(self) -> list[Request]:
        """The held requests whose wait is over since the last call."""

    def take_refused(self) -> list[tuple[Request, InvalidRequestError]]:
        """The held requests whose wait failed since the last call, each with its 400."""

    def release(self, request_id: str) -> Request | None:
        """Stop holding a request (it was aborted or expired); None if it is not held here."""

    def forget(self, request_id: str) -> None:
        """A request (or a choice) ended or was refused: what this wait keeps for it goes."""
