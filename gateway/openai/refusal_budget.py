"""Refused work is charged to its sender: a per-tenant budget of refusals, and a per-tenant bound on the
prompts being tokenised off the event loop at once.

A request that can only be refused (a prompt over the context, a bad field) still costs the server its
body, its parsing and perhaps its tokenisation, and writes no ledger row and spends no quota. Each one
is charged here to its tenant: a token bucket (`burst`, refilled at `rate_per_s`, the same bucket as the
per-address authentication failures, gateway/edge/auth_guard.py) that, once empty, answers the tenant's
next requests 429 + Retry-After before their bodies are parsed. The tokenisation bound keeps one tenant's
large prompts from taking every worker thread (and the GIL time they need) from the others: the work runs
on an executor of its own (`tokenize_workers` threads, shared by nobody else), of which one tenant holds at most
`tokenize_concurrency`, fewer than all (checked by GatewaySettings).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TypeVar

from gateway.edge.auth_guard import FailureBudget

_T = TypeVar("_T")


class RefusalBudget(FailureBudget):
    """Per tenant: refusals allowed (a token bucket, keyed by tenant id) and concurrent off-loop
    tokenisations (a semaphore).

    The bucket is FailureBudget itself (`retry_after`, `charge`), inherited rather than wrapped: every
    generation request asks `retry_after` once or twice, and a wrapper doubled those calls."""

    def __init__(
        self, burst: int, rate_per_s: float, tokenize_concurrency: int, tokenize_workers: int
    ) -> None:
        if not 1 <= tokenize_concurrency <= tokenize_workers:
            raise ValueError("tokenize_concurrency must be between 1 and the tokenising workers")
        super().__init__(burst, rate_per_s)
        self.tokenize_concurrency = tokenize_concurrency
        self._executor = ThreadPoolExecutor(tokenize_workers, thread_name_prefix="fairserve-tokenize")
        self._gates: dict[str, tuple[asyncio.Semaphore, int]] = {}  # tenant -> (semaphore, users)

    async def run(self, tenant_id: str, work: Callable[[], _T]) -> _T:
        """`work()` on the tokenising executor, holding one of the tenant's slots."""
        async with self._slot(tenant_id):
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def close(self) -> None:
        """Stop the executor's threads (work already started finishes)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    @asynccontextmanager
    async def _slot(self, tenant_id: str) -> AsyncIterator[None]:
        gate, users = self._gates.get(tenant_id) or (asyncio.Semaphore(self.tokenize_concurrency), 0)
        self._gates[tenant_id] = (gate, users + 1)
        try:
            async with gate:
                yield
        finally:
            gate, users = self._gates[tenant_id]
            if users > 1:
                self._gates[tenant_id] = (gate, users - 1)
            else:  # nobody holds or waits for it: forget the tenant (the map stays bounded)
                del self._gates[tenant_id]

    def tokenizing_now(self, tenant_id: str) -> int:
        """The tenant's tokenisations holding or waiting for a slot."""
        return self._gates.get(tenant_id, (None, 0))[1]
