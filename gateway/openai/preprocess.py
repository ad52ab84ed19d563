"""PreprocessGate: a request's preprocessing CPU is its tenant's own, bounded, and served in fair-share order.

Validating a large body, rendering a chat template and tokenising cost the gateway CPU before a request
reaches the engine (2,048 one-part content lists about 40 ms; issue 54). That work runs off the event loop,
on this gate's threads, under three bounds:

- **Slots**: at most `slots` jobs run at once (`--preprocess-slots`, by default the cores less one, at
  least one), and one tenant holds at most `per_tenant` of them (`--tokenize-concurrency-per-tenant`).
- **A CPU rate**: the jobs together may spend `cpu_share` of one core (a token bucket of CPU seconds,
  `burst_s` deep). Every job runs under the one interpreter lock beside the event loop, which answers every
  tenant's requests and streams every tenant's tokens: a job holding the lock delays them all, so the
  bound is on the lock's time, whatever the cores.
- **Fair order**: a free slot goes to the waiting tenant that has spent the least preprocessing CPU, by
  weight: fairness/vtc.py's policy, its counters charged in microseconds of thread CPU time
  (`time.thread_time` around each job, and `charge` for the work done inline on the loop). A tenant that
  has spent its share waits behind the others.

A request that would wait longer than `max_wait_s` (or past its deadline) is refused 429
`preprocessing_busy` with Retry-After, before any of its work runs. Every job's CPU seconds go back to the
caller, which sends them, less `FREE_CPU_S` per request, to the engine as `RequestMeta.preprocess_cpu_s`:
charged as service there, as grammar CPU is (engine/worker/grammar/intake.py), so they show in the ledger's
`charged_service`.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fairness import TokenCost
from fairness.vtc import VTCPolicy
from gateway.edge.errors import APIError

_T = TypeVar("_T")
# Preprocessing CPU a request is not charged for: an ordinary request's parse and tokenising (a fraction of
# a millisecond) is priced into its tokens. Charging it too made every bill vary with host time: at a 1 ms
# allowance a collection pause or a cold cache still charged one of two identical requests 60% more. What a
# tenant's body, chat or schema costs beyond it (2,048 messages: 20-30 ms) is the tenant's own.
FREE_CPU_S = 0.005


def billable_cpu(cpu_s: float) -> float:
    """The preprocessing CPU seconds charged as service: what `cpu_s` spent beyond `FREE_CPU_S`."""
    return max(0.0, cpu_s - FREE_CPU_S)


# A returning tenant keeps at most this much unspent preprocessing CPU (microseconds) over the least
# served waiting one: fairness/vtc.py's `lift_allowance`, here one large chat's rendering.
LIFT_ALLOWANCE_US = 50_000.0


@dataclass(frozen=True)
class _Meta:
    """What the fairness policy reads of a waiting job: its tenant and that tenant's weight."""

    tenant_id: str
    weight: float
    arrival_time: float
    api_key_id: str | None = None
    user: str | None = None
    priority: int = 0
    deadline: float | None = None


@dataclass(eq=False)
class _Waiter:
    """A job in the fair order (or a charge for work done inline: then nothing is granted)."""

    request_id: str
    meta: _Meta
    granted: asyncio.Future[None] | None = field(default=None, repr=False)


@dataclass
class Timed(Generic[_T]):
    """A job's result and the thread CPU seconds it took."""

    value: _T
    cpu_s: float


class PreprocessGate:
    """Slots, a CPU-rate bucket and a fair order for preprocessing jobs (see the module)."""

    def __init__(
        self, slots: int, per_tenant: int, cpu_share: float, burst_s: float, max_wait_s: float
    ) -> None:
        if slots < 1 or per_tenant < 1 or not 0 < cpu_share <= slots or burst_s <= 0 or max_wait_s <= 0:
            raise ValueError("preprocessing needs a slot, a positive CPU share and burst, and a wait bound")
        self.slots, self.per_tenant, self.max_wait_s = slots, per_tenant, max_wait_s
        self.cpu_share, self.burst_s = cpu_share, burst_s
        self._executor = ThreadPoolExecutor(slots, thread_name_prefix="fairserve-preprocess")
        self._order: VTCPolicy[_Waiter] = VTCPolicy(
            TokenCost(1.0, 1.0, 0.0), lift_allowance=LIFT_ALLOWANCE_US
        )
        self._ids = itertools.count()
        self._running = 0
        self._bucket, self._refilled = burst_s, time.monotonic()  # CPU seconds the jobs may still spend
        self._wake: asyncio.TimerHandle | None = None
        self._gates: dict[str, tuple[asyncio.Semaphore, int]] = {}  # tenant -> (its slots, users)

    async def run(
        self, tenant_id: str, weight: float, work: Callable[[], _T], deadline: float | None = None
    ) -> Timed[_T]:
        """`work()` on a preprocessing thread once the tenant's turn comes; 429 `preprocessing_busy` when the
        turn would come after `max_wait_s` or the deadline (a `time.time()`), before the work starts."""
        wait_s = self.max_wait_s if deadline is None else min(self.max_wait_s, deadline - time.time())
        until = time.monotonic() + wait_s
        async with self._tenant_slot(tenant_id, until):
            waiter = await self._turn(tenant_id, weight, until)
            spent = [0.0]
            job = asyncio.get_running_loop().run_in_executor(self._executor, _timed, work, spent)
            try:
                value = await asyncio.shield(job)
            except asyncio.CancelledError:  # the client left: the thread runs on, and is charged when done
                job.add_done_callback(lambda ended: self._ended(ended, waiter, spent))
                raise
            except BaseException:
                self._done(waiter, spent[0])
                raise
            self._done(waiter, spent[0])
        return Timed(value, spent[0])

    def charge(self, tenant_id: str, weight: float, cpu_s: float) -> None:
        """Charge CPU spent on the loop itself (a small body, a short prompt) to the tenant's order."""
        if cpu_s > 0:
            self._order.charge(self._waiter(tenant_id, weight, None), int(cpu_s * 1e6), 0, 0)

    def spent_s(self, tenant_id: str) -> float:
        """The tenant's preprocessing CPU seconds charged so far (unweighted)."""
        return self._order.service().get(tenant_id, 0.0) / 1e6

    def tokenizing_now(self, tenant_id: str) -> int:
        """The tenant's jobs holding or waiting for a slot."""
        return self._gates.get(tenant_id, (None, 0))[1]

    def close(self) -> None:
        """Stop the threads (work already started finishes)."""
        if self._wake is not None:
            self._wake.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    @asynccontextmanager
    async def _tenant_slot(self, tenant_id: str, until: float) -> AsyncIterator[None]:
        """One of the tenant's `per_tenant` slots, waited for until `until` at most."""
        gate, users = self._gates.get(tenant_id) or (asyncio.Semaphore(self.per_tenant), 0)
        self._gates[tenant_id] = (gate, users + 1)
        try:
            await _within(gate.acquire(), until, self._retry_after)
            try:
                yield
            finally:
                gate.release()
        finally:
            gate, users = self._gates[tenant_id]
            if users > 1:
                self._gates[tenant_id] = (gate, users - 1)
            else:  # nobody holds or waits for it: forget the tenant's gate (the map stays bounded)
                del self._gates[tenant_id]

    async def _turn(self, tenant_id: str, weight: float, until: float) -> _Waiter:
        """Queue for a global slot in fair order; the waiter holding it once granted."""
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = self._waiter(tenant_id, weight, granted)
        self._order.add(waiter, time.time())
        self._dispatch()
        try:
            await _within(asyncio.shield(granted), until, self._retry_after)
        except BaseException:
            if granted.done():  # granted as it timed out or was cancelled: give the slot back
                self._done(waiter, 0.0)
            else:
                self._order.remove(waiter)
                granted.cancel()
            raise
        return waiter

    def _waiter(self, tenant_id: str, weight: float, granted: asyncio.Future[None] | None) -> _Waiter:
        return _Waiter(f"preprocess-{next(self._ids)}", _Meta(tenant_id, weight, time.time()), granted)

    def _done(self, waiter: _Waiter, cpu_s: float) -> None:
        """A job ended (or gave up its slot): charge its CPU, refill the slot, serve the next."""
        self._running -= 1
        self._bucket -= cpu_s
        if cpu_s > 0:
            self._order.charge(waiter, max(1, int(cpu_s * 1e6)), 0, 0)
        self._dispatch()

    def _ended(self, job: asyncio.Future[Any], waiter: _Waiter, spent: list[float]) -> None:
        """A job whose request was cancelled finished on its thread: its slot and CPU, as `_done`."""
        if not job.cancelled():
            job.exception()  # retrieved: a refusal nobody awaits any more is not an unhandled error
        self._done(waiter, spent[0])

    def _dispatch(self) -> None:
        """Grant free slots to waiters in fair order while the CPU bucket holds; else wake when it will."""
        now = time.monotonic()
        self._bucket = min(self.burst_s, self._bucket + (now - self._refilled) * self.cpu_share)
        self._refilled = now
        while self._running < self.slots and self._bucket > 0:
            head = self._order.peek(time.time())
            if head is None:
                return
            self._order.pop(head)
            self._running += 1
            if head.granted is not None:
                head.granted.set_result(None)
        if self._bucket <= 0 and len(self._order) and self._wake is None:
            delay = -self._bucket / self.cpu_share + 1e-3
            self._wake = asyncio.get_running_loop().call_later(delay, self._woken)

    def _woken(self) -> None:
        self._wake = None
        self._dispatch()

    def _retry_after(self) -> int:
        """Seconds a refused tenant should wait: the bucket's deficit and one wait bound, at least 1."""
        return max(1, math.ceil(max(0.0, -self._bucket) / self.cpu_share + self.max_wait_s))


def _timed(work: Callable[[], _T], spent: list[float]) -> _T:
    """On a preprocessing thread: `work()`, its thread CPU seconds left in `spent` even when it raises."""
    t0 = time.thread_time()
    try:
        return work()
    finally:
        spent[0] = time.thread_time() - t0


async def _within(waiting: Awaitable[object], until: float, retry_after: Callable[[], int]) -> None:
    """Await `waiting` until monotonic `until`; past it, 429 `preprocessing_busy` with Retry-After."""
    try:
        await asyncio.wait_for(waiting, max(0.0, until - time.monotonic()))
    except TimeoutError:
        raise APIError(
            429,
            "this tenant's preprocessing (validating, rendering, tokenising) would wait past its bound; retry later",
            "preprocessing_busy",
            headers={"Retry-After": str(retry_after())},
        ) from None
