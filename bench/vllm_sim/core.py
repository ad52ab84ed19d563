"""The simulated engine: a fixed batch of slots, FIFO admission, one token per running request per step.

It serves requests, not tenants: whoever is queued first gets the next free slot, so on its own it splits
the batch by request count, as vLLM's default FCFS scheduler does. That is the behaviour a fair-share
gateway in front of it has to correct, and what makes its tests exact: the step clock is the only cost.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

# The text of output token i: one lowercase letter, so a byte tokenizer counts exactly one token per
# streamed token (a gateway that counts streamed tokens itself gets the engine's count back).
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class State(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"  # reached max_tokens: finish_reason "length"
    ABORTED = "aborted"  # the client went away, or the server shut down


@dataclass
class SimRequest:
    """One request inside the engine, and the engine's own record of what it computed for it."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrived_at: float
    state: State = State.WAITING
    completion_tokens: int = 0
    admitted_at: float | None = None
    ended_at: float | None = None
    # Token indices as they are produced, then None once the request ends (finished or aborted).
    outbox: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)

    @property
    def ended(self) -> bool:
        return self.state in (State.FINISHED, State.ABORTED)

    def record(self) -> dict[str, object]:
        """The engine's ground truth for this request (GET /sim/requests)."""
        return {
            "id": self.request_id,
            "state": self.state.value,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "max_tokens": self.max_tokens,
            "arrived_at": self.arrived_at,
            "admitted_at": self.admitted_at,
            "ended_at": self.ended_at,
        }


@dataclass
class Totals:
    """Monotonic counters for /metrics (vLLM's names are given in bench/vllm_sim/app.py)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    steps: int = 0


class BatchEngine:
    """`slots` seats; every `step_s` the FIFO queue fills free seats, then each seated request gets one token.

    Pacing is by absolute step times, so the timer's own lateness does not slow the engine down; with no
    request it sleeps on an event, not on a timer.
    """

    def __init__(self, slots: int, step_s: float, kv_tokens: int) -> None:
        if slots < 1 or step_s <= 0 or kv_tokens < 1:
            raise ValueError("slots and kv_tokens must be >= 1 and step_s > 0")
        self.slots, self.step_s, self.kv_tokens = slots, step_s, kv_tokens
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.requests: dict[str, SimRequest] = {}  # every request seen, for /sim/requests
        self.totals = Totals()
        self._ids = itertools.count()
        self._arrival = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="vllm-sim-engine")

    async def stop(self) -> None:
        """Stop stepping and end every request still inside (their streams end as aborted)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for req in [*self.waiting, *self.running]:
            self._end(req, State.ABORTED)
        self.waiting.clear()
        self.running.clear()

    def submit(self, prompt_tokens: int, max_tokens: int, request_id: str | None = None) -> SimRequest:
        """Queue a request at the back (FIFO)."""
        rid = request_id or f"sim-{next(self._ids)}"
        if rid in self.requests and not self.requests[rid].ended:
            rid = f"{rid}-{next(self._ids)}"  # vLLM also refuses to share a live id; keep both requests
        req = SimRequest(rid, prompt_tokens, max_tokens, time.monotonic())
        self.requests[rid] = req
        self.waiting.append(req)
        self._arrival.set()
        return req

    def abort(self, req: SimRequest) -> None:
        """End `req` now, wherever it is; the tokens it already got stay counted."""
        if req.ended:
            return
        if req.state is State.WAITING:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
        self._end(req, State.ABORTED)

    def kv_usage(self) -> float:
        """The share of the KV budget the seated requests hold (vllm:kv_cache_usage_perc, 0..1)."""
        held = sum(r.prompt_tokens + r.completion_tokens for r in self.running)
        return min(1.0, held / self.kv_tokens)

    def _end(self, req: SimRequest, state: State) -> None:
        req.state, req.ended_at = state, time.monotonic()
        if state is State.ABORTED:
            self.totals.aborted += 1
        else:
            self.totals.finished += 1
        req.outbox.put_nowait(None)

    def step(self) -> None:
        """One engine iteration: admit FIFO into free seats, one token each, retire the finished."""
        now = time.monotonic()
        while self.waiting and len(self.running) < self.slots:
            req = self.waiting.popleft()
            req.state, req.admitted_at = State.RUNNING, now
            self.totals.prompt_tokens += req.prompt_tokens
            self.running.append(req)
        for req in self.running:
            req.outbox.put_nowait(req.completion_tokens)
            req.completion_tokens += 1
        self.totals.generation_tokens += len(self.running)
        self.totals.steps += 1
        done = [r for r in self.running if r.completion_tokens >= r.max_tokens]
        for req in done:
            self.running.remove(req)
            self._end(req, State.FINISHED)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at: float | None = None
        while True:
            if not self.waiting and not self.running:
                self._arrival.clear()
                await self._arrival.wait()
                next_at = None
            next_at = loop.time() if next_at is None else next_at
            self.step()
            # Steps at start + k·step_s: a late wake-up is made up on the next step, but never by a burst
            # of more than one (a machine that stalls makes a slower engine, not a faster one later).
            next_at = max(next_at + self.step_s, loop.time())
            await asyncio.sleep(next_at - loop.time())
