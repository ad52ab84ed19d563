"""N simulated engines behind R routers on one virtual clock: fair share across a cluster, on paper.

Each engine is a `Simulator` (the real Scheduler, block pool and VTC policy, sim/simulator.py); the loop
always advances whichever event is earliest: an arrival (a router scores the engines and picks one),
a counter publication tick, or the engine whose clock is smallest (one iteration of it).

Counters (issue #15, deliverable 4, modelled):
- `staleness_s=None`: no sharing. Each engine's VTC sees only its own service, as llm-d and Dynamo
  keep fairness state per replica.
- `staleness_s=S`: every S of virtual time every engine publishes its per-tenant service and reads the
  others' (`sim.shared.others_service`), which `SharedVTC` folds into its counters. `S=0`
  publishes after and reads before every iteration: exact. The routers read the same published table:
  a tenant whose weighted service is below the mean of tenants with work outstanding is "behind" and is
  routed by load alone, so affinity cannot pin it where its share would break.

Ingress: tenant request rates are Zipf-like; each tenant has a home router (routers' shares Zipf-like
too) through which `home_share` of its requests enter. Each router remembers which engine it last sent
a tenant to (its own, partial view of where prefixes are cached: that is what makes ingress matter).
Engines hold an LRU of `prefix_slots` tenant prefixes; a hit skips `prefix_tokens` of prefill.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fairness.config import FairnessConfig
from fairness.cost import TokenCost
from sim.shared import EngineView, RouteWeights, SharedVTC, others_service, pick_engine
from sim.simulator import Completion, SimConfig, SimRequest, SimResult, Simulator


@dataclass(frozen=True)
class TenantSpec:
    """One tenant: its share of the offered requests, its weight, and where its traffic enters."""

    name: str
    rate_share: float
    weight: float = 1.0
    home_router: int = 0
    home_share: float = 0.9  # of its requests enter through home_router; the rest spread over the others


def default_engine() -> SimConfig:
    """One simulated engine, smaller than the single-engine default so 64 of them run in minutes."""
    return SimConfig(
        max_num_seqs=64,
        max_num_batched_tokens=1024,
        num_blocks=1024,
        block_size=16,
        fairness=FairnessConfig(priority_classes=False),
    )


@dataclass
class ClusterConfig:
    """Topology, counter sharing, workload and measurement window of one cluster run."""

    engines: int = 8
    routers: int = 4
    tenants: int = 1000
    staleness_s: float | None = 0.1  # None: no sharing
    duration_s: float = 15.0
    warmup_s: float = 5.0  # the measurement window is [warmup_s, duration_s]
    load: float = 3.0  # offered work / estimated cluster capacity
    initial_backlog_s: float = 2.0  # this many seconds of offered requests arrive at t=0 (no head start)
    zipf_s: float = 1.0  # tenant k's request rate ∝ 1/k^zipf_s
    router_zipf_s: float = 1.0  # router r's share of home tenants ∝ 1/r^router_zipf_s
    home_share: float = 0.9
    weights: tuple[float, ...] = (1.0, 2.0, 4.0)  # tenant k's weight: weights[k % len(weights)]
    prompt: tuple[int, int] = (64, 256)
    output: tuple[int, int] = (32, 160)
    prefix_tokens: int = 48
    prefix_slots: int = 64
    route: RouteWeights = field(default_factory=RouteWeights)
    cluster_lift: bool = True  # sharing: no VTC lift for a tenant with work on another engine
    seed_affinity: bool = False  # routers start out believing router r's tenants' prefixes are on engine r
    tenant_specs: list[TenantSpec] | None = None  # None: `tenants` Zipf tenants
    engine: SimConfig = field(default_factory=default_engine)
    sample_every_s: float = 0.1
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting (the CLI turns it into exit code 2)."""
        for name in ("engines", "routers", "tenants", "prefix_slots"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.staleness_s is not None and not self.staleness_s >= 0:
            raise ValueError("staleness_s must be >= 0 (or None for no sharing)")
        if not 0 <= self.warmup_s < self.duration_s or not self.load > 0 or not self.sample_every_s > 0:
            raise ValueError("need 0 <= warmup_s < duration_s, load > 0 and sample_every_s > 0")
        if not self.initial_backlog_s >= 0:
            raise ValueError("initial_backlog_s must be >= 0")
        if not 1 <= self.prompt[0] <= self.prompt[1] or not 1 <= self.output[0] <= self.output[1]:
            raise ValueError("prompt and output ranges must be 1 <= low <= high")
        if not 0 <= self.prefix_tokens < self.prompt[0]:
            raise ValueError("prefix_tokens must be >= 0 and shorter than the shortest prompt")
        self.engine.validate()

    def tenant_list(self) -> list[TenantSpec]:
        """The explicit tenants, or `tenants` Zipf tenants with Zipf home routers (seeded)."""
        if self.tenant_specs is not None:
            return self.tenant_specs
        rng = random.Random(self.seed + 1)
        router_cum = list(
            itertools.accumulate(1 / (r + 1) ** self.router_zipf_s for r in range(self.routers))
        )
        return [
            TenantSpec(
                f"t{k}",
                1 / (k + 1) ** self.zipf_s,
                self.weights[k % len(self.weights)],
                bisect.bisect(router_cum, rng.random() * router_cum[-1]),
                self.home_share,
            )
            for k in range(self.tenants)
        ]

    def capacity_requests_per_s(self) -> float:
        """Rough requests per virtual second one engine completes with full seats (sets the offered rate)."""
        e, p, o = self.engine, sum(self.prompt) / 2, sum(self.output) / 2
        seats = e.max_num_seqs
        iteration = e.cost.seconds(int(seats * (1 + p / o)), int(seats * (p + o / 2)))
        return seats / (o * iteration)

    def single_engine_bound(self) -> float:
        """VTC's bound 2·max(w_in·L_in, w_out·M) in counter units (divided by the smallest weight)."""
        f, e = self.engine.fairness, self.engine
        w_min = min(t.weight for t in self.tenant_list())
        return 2 * max(f.w_in * self.prompt[1], f.w_out * e.num_blocks * e.block_size) / w_min

    def cluster_bound(self) -> float:
        """The same bound for one engine with the cluster's KV capacity N·M (what S=0 sharing aims at)."""
        f, e = self.engine.fairness, self.engine
        w_min = min(t.weight for t in self.tenant_list())
        return 2 * max(f.w_in * self.prompt[1], f.w_out * self.engines * e.num_blocks * e.block_size) / w_min


@dataclass
class _Engine:
    """One engine of the cluster and the cluster's bookkeeping about it."""

    sim: Simulator
    policy: SharedVTC
    result: SimResult = field(default_factory=SimResult)
    outstanding_tokens: int = 0
    tenant_tokens: dict[str, int] = field(default_factory=dict)  # outstanding tokens by tenant
    busy: bool = False
    published: dict[str, float] = field(default_factory=dict)  # this engine's last publication
    cursor: int = 0  # position in the cluster's publication log
    prefixes: OrderedDict[str, None] = field(default_factory=OrderedDict)


@dataclass
class Sample:
    """Cluster-wide charged service per tenant and the tenants with queued requests, at one instant."""

    t: float
    service: dict[str, float]
    waiting: set[str]


class ClusterSim:
    """Runs one ClusterConfig; `run()` returns the samples and totals that `sim_cluster_report` reduces."""

    def __init__(self, config: ClusterConfig) -> None:
        config.validate()
        self.config = config
        self.tenants = config.tenant_list()
        self.weight = {t.name: t.weight for t in self.tenants}
        self.rng = random.Random(config.seed)
        f = config.engine.fairness
        self.engines: list[_Engine] = []
        self.tenant_tokens: dict[str, int] = {}  # outstanding tokens by tenant, cluster-wide
        for _ in range(config.engines):
            policy = SharedVTC(TokenCost(f.w_in, f.w_out, f.w_cached), f.lift_allowance)
            engine = _Engine(Simulator(config.engine, policy), policy)
            if config.staleness_s is not None and config.cluster_lift:
                policy.busy_elsewhere = self._busy_elsewhere(engine)
            engine.sim.on_complete = self._completed_on(engine)
            self.engines.append(engine)
        self.router_table: list[dict[str, int]] = [{} for _ in range(config.routers)]
        if config.seed_affinity:
            for t in self.tenants:
                self.router_table[t.home_router][t.name] = t.home_router % config.engines
        self.total_published: dict[str, float] = {}
        self.log: list[str] = []  # keys in publication order; engines read from their cursor
        self.outstanding: dict[str, int] = {}  # tenant -> requests routed and not finished
        self._active = 0  # tenants with work outstanding
        self._active_v = 0.0  # sum of published weighted service over tenants with work outstanding
        self._tokens: dict[str, int] = {}  # request -> tokens still counted in its engine's outstanding
        self.samples: list[Sample] = []
        self.prefix_hits = self.routed = 0

    # -- counters ---------------------------------------------------------------------------------
    def publish(self, engine: _Engine) -> None:
        """The engine publishes its service for the keys charged since its last publication."""
        own, total = engine.policy.own_service(), self.total_published
        for key in engine.policy.dirty:
            delta = own[key] - engine.published.get(key, 0.0)
            if delta:
                engine.published[key] = own[key]
                total[key] = total.get(key, 0.0) + delta
                if self.outstanding.get(key):
                    self._active_v += delta / self.weight[key]
                self.log.append(key)
        engine.policy.dirty.clear()

    def read(self, engine: _Engine) -> None:
        """The engine reads the others' last publications for every key published since its last read."""
        keys = set(self.log[engine.cursor :])
        engine.cursor = len(self.log)
        for key, service in others_service(self.total_published, engine.published, keys).items():
            engine.policy.set_remote(key, service, self.weight[key])

    def _tick(self) -> None:
        for engine in self.engines:
            self.publish(engine)
        for engine in self.engines:
            self.read(engine)
        self._trim_log()

    def _trim_log(self) -> None:
        low = min(e.cursor for e in self.engines)
        if low > 200_000:
            del self.log[:low]
            for e in self.engines:
                e.cursor -= low

    # -- routing ----------------------------------------------------------------------------------
    def _behind(self, tenant: str) -> bool:
        """Sharing on: the tenant's published weighted service is below the mean of tenants with work out."""
        if self.config.staleness_s is None or not self._active:
            return False
        return self.total_published.get(tenant, 0.0) / self.weight[tenant] < self._active_v / self._active

    def route(self, spec: SimRequest, router: int) -> int:
        """Score the engines for `spec` as `router` sees them, queue it on the best one."""
        table, cap = self.router_table[router], self.config.engine.num_blocks * self.config.engine.block_size
        home = table.get(spec.tenant)
        views = [
            EngineView(
                e.outstanding_tokens,
                cap,
                e.sim.pool.num_used / e.sim.pool.num_blocks,
                i == home,
                e.tenant_tokens.get(spec.tenant, 0),
            )
            for i, e in enumerate(self.engines)
        ]
        index = pick_engine(views, self.config.route, self._behind(spec.tenant))
        table[spec.tenant] = index
        engine = self.engines[index]
        if spec.tenant in engine.prefixes:
            engine.prefixes.move_to_end(spec.tenant)
            spec.prompt_tokens -= self.config.prefix_tokens  # the shared prefix is a cache hit (w_cached=0)
            self.prefix_hits += 1
        else:
            engine.prefixes[spec.tenant] = None
            if len(engine.prefixes) > self.config.prefix_slots:
                engine.prefixes.popitem(last=False)
        self.routed += 1
        tokens = spec.prompt_tokens + spec.output_tokens
        engine.outstanding_tokens += tokens
        engine.tenant_tokens[spec.tenant] = engine.tenant_tokens.get(spec.tenant, 0) + tokens
        self.tenant_tokens[spec.tenant] = self.tenant_tokens.get(spec.tenant, 0) + tokens
        self._tokens[spec.name] = tokens
        n = self.outstanding.get(spec.tenant, 0)
        if not n:
            self._active += 1
            self._active_v += self.total_published.get(spec.tenant, 0.0) / self.weight[spec.tenant]
        self.outstanding[spec.tenant] = n + 1
        if not engine.busy:
            engine.sim.clock = max(engine.sim.clock, spec.arrival)
        engine.sim.submit(spec)
        return index

    def _busy_elsewhere(self, engine: _Engine) -> Callable[[str], bool]:
        def busy(key: str) -> bool:
            return self.tenant_tokens.get(key, 0) > engine.tenant_tokens.get(key, 0)

        return busy

    def _completed_on(self, engine: _Engine) -> Callable[[Completion], None]:
        def completed(done: Completion) -> None:
            tokens = self._tokens.pop(done.name)
            engine.outstanding_tokens -= tokens
            engine.tenant_tokens[done.tenant] -= tokens
            self.tenant_tokens[done.tenant] -= tokens
            n = self.outstanding[done.tenant] - 1
            self.outstanding[done.tenant] = n
            if not n:
                self._active -= 1
                self._active_v -= self.total_published.get(done.tenant, 0.0) / self.weight[done.tenant]

        return completed

    # -- the loop ---------------------------------------------------------------------------------
    def arrivals(self) -> Iterator[tuple[SimRequest, int]]:
        """Open-loop Poisson arrivals at `load` × the estimated capacity: (request, the router it enters by)."""
        c, rng = self.config, self.rng
        cum = list(itertools.accumulate(t.rate_share for t in self.tenants))
        rate = c.load * c.engines * c.capacity_requests_per_s()
        burst = int(rate * c.initial_backlog_s)  # queued at t=0: every heavy tenant starts backlogged
        t = 0.0
        for i in itertools.count():
            if i >= burst:
                t += rng.expovariate(rate)
            tenant = self.tenants[bisect.bisect(cum, rng.random() * cum[-1])]
            router = tenant.home_router % c.routers
            if c.routers > 1 and rng.random() >= tenant.home_share:
                router = (router + rng.randrange(1, c.routers)) % c.routers
            yield (
                SimRequest(
                    f"r{i}",
                    tenant.name,
                    t,
                    rng.randint(*c.prompt),
                    rng.randint(*c.output),
                    weight=tenant.weight,
                ),
                router,
            )

    def run(self) -> float:
        """Simulate until `duration_s` of virtual time; returns the wall seconds it took."""
        c = self.config
        wall0 = time.perf_counter()
        arrivals = self.arrivals()
        spec, router = next(arrivals)
        heap: list[tuple[float, int]] = []
        stale = c.staleness_s
        next_tick = stale if stale else float("inf")
        next_sample = c.warmup_s
        while True:
            t_engine = heap[0][0] if heap else float("inf")
            now = min(spec.arrival, next_tick, t_engine)
            if now >= next_sample:
                self._sample(next_sample)
                next_sample += c.sample_every_s
            if now >= c.duration_s:
                break
            if spec.arrival <= t_engine and spec.arrival <= next_tick:
                index = self.route(spec, router)
                engine = self.engines[index]
                if not engine.busy:
                    engine.busy = True
                    heapq.heappush(heap, (engine.sim.clock, index))
                spec, router = next(arrivals)
            elif next_tick <= t_engine:
                self._tick()
                next_tick += stale or float("inf")
            else:
                _, index = heapq.heappop(heap)
                self._step(self.engines[index], index, heap)
        return time.perf_counter() - wall0

    def _step(self, engine: _Engine, index: int, heap: list[tuple[float, int]]) -> None:
        exact = self.config.staleness_s == 0
        if exact:
            self.read(engine)
        engine.sim.step(engine.result)
        if exact:
            self.publish(engine)
            if len(self.log) > 400_000:
                self._trim_log()
        if engine.sim.scheduler.has_unfinished():
            heapq.heappush(heap, (engine.sim.clock, index))
        else:
            engine.busy = False

    def _sample(self, t: float) -> None:
        service: dict[str, float] = {}
        waiting: set[str] = set()
        for engine in self.engines:
            for key, value in engine.policy.own_service().items():
                service[key] = service.get(key, 0.0) + value
            waiting.update(engine.policy.waiting())
        self.samples.append(Sample(t, service, waiting))
