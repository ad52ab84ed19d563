"""GrammarCompiler: grammars compile on worker threads, never on the engine loop, cached by hash, bounded per tenant.

A request whose grammar is not cached waits here (engine/worker/grammar/intake.py), holding no batch seat and no
KV block. Compiles start only while a compile thread is free, the tenants with work taking turns, and each
tenant has at most `max_compiles_per_tenant` running: one tenant's flood of hard schemas queues behind its
own compiles, not in front of another tenant's. A request waits at most `compile_timeout_s` for its grammar
and then fails alone with a 400; the compile itself runs on (its thread cannot be interrupted) and still
counts against its tenant's bound until llguidance's own limits end it, and its result is cached.

The cache is keyed by the request's prefix-cache root (tenant, cache group, salt: engine/core/kv_cache.py) and the
grammar's hash: a tenant cannot learn from a fast answer that another tenant compiled the same schema, as
prefix caching keeps the same line.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.core.request import Request
from engine.core.sampling_params import Grammar
from engine.worker.grammar.backend import Backend, GrammarError
from engine.worker.grammar.config import GrammarConfig

if TYPE_CHECKING:
    import llguidance

CacheKey = tuple[bytes, str]


@dataclass(frozen=True)
class Compiled:
    """A compile's result: a fresh matcher to copy for each request, or the reason it failed."""

    matcher: llguidance.LLMatcher | None
    error: str | None
    cpu_s: float  # compile thread CPU time


@dataclass
class _Waiter:
    request: Request
    since: float  # monotonic seconds it began waiting


@dataclass
class _Job:
    key: CacheKey
    tenant: str
    future: Future[Compiled]
    waiters: deque[_Waiter] = field(default_factory=deque)
    charged: bool = False  # the compile's CPU went to its first waiter


Ready = tuple[Request, "llguidance.LLMatcher", float]  # request, its own matcher, compile CPU to charge it


class GrammarCompiler:
    """Compiles on `compile_slots` threads; the engine loop calls `request`, `poll` and `drop`."""

    def __init__(self, backend: Backend, config: GrammarConfig, clock: Callable[[], float] = time.monotonic):
        self.backend = backend
        self.config = config
        self._clock = clock
        self._pool = ThreadPoolExecutor(config.compile_slots, "fairserve-grammar")
        self._cache: OrderedDict[CacheKey, Compiled] = OrderedDict()
        self._queued: dict[str, deque[_Waiter]] = {}  # per tenant, compiles not started
        self._running: dict[str, int] = {}  # per tenant, compiles on a thread (timed out or not)
        self._jobs: dict[CacheKey, _Job] = {}
        self.compiles = 0  # compiles started, since the engine started
        self.compile_seconds: deque[float] = deque(maxlen=1_000)  # CPU seconds of the last compiles

    @staticmethod
    def key(request: Request) -> CacheKey:
        """Where a request's grammar is cached: its prefix-cache root and the grammar's hash."""
        grammar = request.sampling.grammar
        assert grammar is not None
        return request.prefix_root, grammar.key

    def cached(self, request: Request) -> Compiled | None:
        """The cached compile of this request's grammar, if any (refreshing its place in the LRU)."""
        key = self.key(request)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
        return hit

    def request(self, request: Request) -> None:
        """Queue `request` for its grammar: it joins a running compile of the same grammar, or its tenant's queue."""
        waiter = _Waiter(request, self._clock())
        job = self._jobs.get(self.key(request))
        if job is not None:
            job.waiters.append(waiter)
            return
        self._queued.setdefault(request.meta.tenant_id, deque()).append(waiter)
        self._start_compiles()

    def drop(self, request_id: str) -> bool:
        """Forget a waiting request (aborted); True if it was waiting."""
        for waiters in [*self._queued.values(), *(j.waiters for j in self._jobs.values())]:
            for w in waiters:
                if w.request.request_id == request_id:
                    waiters.remove(w)
                    return True
        return False

    @property
    def waiting(self) -> int:
        """Requests waiting for a grammar."""
        return sum(map(len, self._queued.values())) + sum(len(j.waiters) for j in self._jobs.values())

    def poll(self) -> tuple[list[Ready], list[tuple[Request, str]]]:
        """Requests whose grammar is ready, and those that failed (a compile error, or their wait timed out)."""
        ready: list[Ready] = []
        failed: list[tuple[Request, str]] = []
        for key, job in list(self._jobs.items()):
            if job.future.done():
                del self._jobs[key]
                self._running[job.tenant] -= 1
                compiled = self._store(key, job.future)
                for w in job.waiters:
                    self._hand_out(w.request, compiled, job, ready, failed)
        now, limit = self._clock(), self.config.compile_timeout_s
        timed_out = f"the grammar did not compile within {limit:g} s"
        for waiters in [*self._queued.values(), *(j.waiters for j in self._jobs.values())]:
            for late in [w for w in waiters if now - w.since > limit]:
                waiters.remove(late)
                failed.append((late.request, timed_out))
        for tenant in [t for t, q in self._queued.items() if not q]:
            del self._queued[tenant]
        self._start_compiles()
        return ready, failed

    def _hand_out(
        self,
        request: Request,
        compiled: Compiled,
        job: _Job,
        ready: list[Ready],
        failed: list[tuple[Request, str]],
    ) -> None:
        if compiled.matcher is None:
            failed.append((request, compiled.error or "the grammar failed to compile"))
            return
        cpu = 0.0 if job.charged else compiled.cpu_s
        job.charged = True
        ready.append((request, compiled.matcher.deep_copy(), cpu))

    def _store(self, key: CacheKey, future: Future[Compiled]) -> Compiled:
        try:
            compiled = future.result()
        except (
            Exception
        ) as exc:  # llguidance raising (an API misuse, not a grammar error): that grammar fails
            compiled = Compiled(None, f"the grammar failed to compile: {type(exc).__name__}", 0.0)
        self._cache[key] = compiled
        while len(self._cache) > self.config.cache_entries:
            self._cache.popitem(last=False)
        return compiled

    def _start_compiles(self) -> None:
        """Start compiles while a thread is free, one per tenant in turn, each tenant under its bound."""
        bound = self.config.max_compiles_per_tenant
        while sum(self._running.values()) < self.config.compile_slots:
            started = False
            for tenant in list(self._queued):
                queue = self._queued[tenant]
                if not queue:  # its last waiter left (aborted)
                    del self._queued[tenant]
                    continue
                if self._running.get(tenant, 0) >= bound:
                    continue
                waiter = queue.popleft()
                if not queue:
                    del self._queued[tenant]
                else:  # to the back: the next tenant goes first
                    self._queued[tenant] = self._queued.pop(tenant)
                self._start(waiter)
                started = True
                break
            if not started:
                return

    def _start(self, waiter: _Waiter) -> None:
        request = waiter.request
        key = self.key(request)
        job = self._jobs.get(key)
        if job is not None:  # the same grammar began compiling meanwhile
            job.waiters.append(waiter)
            return
        grammar = request.sampling.grammar
        assert grammar is not None
        tenant = request.meta.tenant_id
        self._running[tenant] = self._running.get(tenant, 0) + 1
        self.compiles += 1
        self._jobs[key] = _Job(key, tenant, self._pool.submit(self._compile, grammar), deque([waiter]))

    def _compile(self, grammar: Grammar) -> Compiled:
        """On a compile thread: the matcher, or the reason there is none, and the thread CPU it took."""
        self.backend.tokenizer()  # built once per engine, on the first grammar: not this request's cost
        t0 = time.thread_time()
        try:
            matcher = self.backend.compile(grammar)
        except GrammarError as exc:
            return Compiled(None, str(exc), time.thread_time() - t0)
        cpu = time.thread_time() - t0
        self.compile_seconds.append(cpu)
        return Compiled(matcher, None, cpu)

    def close(self) -> None:
        """Stop taking compiles; running ones finish on their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)
