"""Co-located against disaggregated pools of simulated engines on one virtual clock (DistServe, on paper).

A pool of N engines (each the real Scheduler under the simulator's cost model, sim/simulator.py)
serves a workload in one of two ways:

- **co-located**: every engine runs whole requests (the router sends each to the engine with the least
  outstanding work). A long prompt's prefill chunk shares an iteration with the decodes running there,
  so their next tokens wait for it: the interference DistServe removes.
- **disaggregated** (`prefill` + `decode` = N): a request runs on a prefill engine until its first token
  (max_tokens 1 there); its KV then travels to a decode engine, taking `blocks · bytes_per_block /
  link_bytes_per_s + link_latency_s` (the KV-transfer cost), and enters the decode engine's scheduler as
  a swapped-out request whose KV is already there, as the real decode engine does (engine/serving/disagg.py).
  Each token is charged once: the prompt and the first token on the prefill engine, the rest on the
  decode engine (its prompt is marked charged). Simplification: the prefill engine frees the blocks at
  the hand-off (the real one holds them until they are pulled, a few milliseconds more).

Per request: TTFT = first token - arrival; TPOT = (finish - first token) / (output tokens - 1), so a
transfer counts in TPOT as a user sees it; goodput counts requests meeting both SLO targets.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.request import RequestState
from sim.simulator import Completion, SimConfig, SimRequest, SimResult, Simulator


@dataclass(frozen=True)
class Link:
    """The KV-transfer link between a prefill and a decode engine."""

    bytes_per_s: float = 10e9  # e.g. 100 Gb/s RDMA; NVLink is ~50x more, TCP over 10 GbE ~10x less
    latency_s: float = 0.0005

    def seconds(self, blocks: int, bytes_per_block: int) -> float:
        """Time to move `blocks` KV blocks."""
        return self.latency_s + blocks * bytes_per_block / self.bytes_per_s


@dataclass
class Served:
    """One request's latencies in a pool run."""

    arrival: float
    first_token: float | None
    finished: float
    output_tokens: int
    charged: float
    transfer_s: float = 0.0

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for one-token outputs)."""
        if self.first_token is None or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


@dataclass
class PoolResult:
    """What a pool run served, request by request."""

    served: dict[str, Served] = field(default_factory=dict)
    clock: float = 0.0

    def goodput(self, ttft_s: float, tpot_s: float, duration_s: float) -> float:
        """Requests per second that met both targets."""
        met = sum(
            1
            for s in self.served.values()
            if s.ttft is not None and s.ttft <= ttft_s and (s.tpot is None or s.tpot <= tpot_s)
        )
        return met / duration_s

    def attainment(self, ttft_s: float, tpot_s: float) -> float:
        """Share of requests that met both targets."""
        n = len(self.served)
        return self.goodput(ttft_s, tpot_s, 1.0) / n if n else 0.0


class Pool:
    """N simulated engines, co-located (`prefill == 0`) or split into prefill and decode engines."""

    def __init__(self, engines: int, prefill: int, config: SimConfig, link: Link | None = None) -> None:
        if engines < 1 or not 0 <= prefill < engines:
            raise ValueError(f"prefill engines must be in [0, {engines}): got {prefill}")
        self.config = config
        self.link = link or Link()
        self.sims = [Simulator(config) for _ in range(engines)]
        self.prefill = list(range(prefill))
        self.decode = list(range(prefill, engines)) if prefill else list(range(engines))
        self._work = [0] * engines  # outstanding tokens routed to each engine
        self._results = [SimResult() for _ in range(engines)]
        self._transfers: list[tuple[float, int, SimRequest]] = []
        self._seq = itertools.count()
        self._specs: dict[str, SimRequest] = {}
        self.result = PoolResult()
        for i, sim in enumerate(self.sims):
            sim.on_complete = self._on_complete(i)

    def _least_loaded(self, engines: list[int]) -> int:
        return min(engines, key=lambda i: self._work[i])

    def _send(self, engine: int, spec: SimRequest, at: float) -> None:
        sim = self.sims[engine]
        sim.clock = max(sim.clock, at) if not sim.scheduler.has_unfinished() else sim.clock
        self._work[engine] += spec.prompt_tokens + spec.output_tokens
        sim.submit(spec)

    def _arrive(self, spec: SimRequest) -> None:
        self._specs[spec.name] = spec
        if not self.prefill or spec.output_tokens < 2:
            self._send(self._least_loaded(self.prefill or self.decode), spec, spec.arrival)
            return
        first = SimRequest(
            f"{spec.name}/p", spec.tenant, spec.arrival, spec.prompt_tokens, 1, weight=spec.weight
        )
        self._send(self._least_loaded(self.prefill), first, spec.arrival)

    def _on_complete(self, engine: int) -> Callable[[Completion], None]:
        def done(c: Completion) -> None:
            spec = self._specs[c.name.removesuffix("/p").removesuffix("/d")]
            self._work[engine] -= spec.prompt_tokens + (1 if c.name.endswith("/p") else spec.output_tokens)
            if c.name.endswith("/p"):
                blocks = -(-spec.prompt_tokens // self.config.block_size)
                arrive = c.finished + self.link.seconds(blocks, self.config.bytes_per_block)
                heapq.heappush(self._transfers, (arrive, next(self._seq), spec))
                self.result.served[spec.name] = Served(spec.arrival, c.first_token, c.finished, 1, c.charged)
                return
            served = self.result.served.get(spec.name)
            if served is None:  # whole on one engine
                self.result.served[spec.name] = Served(
                    spec.arrival, c.first_token, c.finished, c.output_tokens, c.charged
                )
            else:
                served.finished, served.charged = c.finished, served.charged + c.charged
                served.output_tokens += c.output_tokens

        return done

    def _land(self, at: float, spec: SimRequest) -> None:
        """The KV arrived at a decode engine: queue the rest as a swapped-out request."""
        served = self.result.served[spec.name]
        served.transfer_s = at - served.finished
        rest = SimRequest(
            f"{spec.name}/d",
            spec.tenant,
            at,
            spec.prompt_tokens + 1,
            spec.output_tokens - 1,
            weight=spec.weight,
        )
        engine = self._least_loaded(self.decode)
        sim = self.sims[engine]
        sim.clock = max(sim.clock, at) if not sim.scheduler.has_unfinished() else sim.clock
        self._work[engine] += rest.prompt_tokens + rest.output_tokens
        request = sim.submit(rest)
        request.num_computed_tokens = spec.prompt_tokens
        request.num_charged_prompt_tokens = rest.prompt_tokens
        request.state = RequestState.SWAPPED  # admission "swaps it in": the simulator's swap-in is free

    def run(self, workload: list[SimRequest]) -> PoolResult:
        """Serve every request; returns per-request latencies."""
        arrivals = sorted(workload, key=lambda r: r.arrival)
        i = 0
        while True:
            busy = [(s.clock, n) for n, s in enumerate(self.sims) if s.scheduler.has_unfinished()]
            step_at = min(busy)[0] if busy else float("inf")
            next_arrival = arrivals[i].arrival if i < len(arrivals) else float("inf")
            next_transfer = self._transfers[0][0] if self._transfers else float("inf")
            if min(step_at, next_arrival, next_transfer) == float("inf"):
                break
            if next_arrival <= min(step_at, next_transfer):
                self._arrive(arrivals[i])
                i += 1
            elif next_transfer <= step_at:
                at, _, spec = heapq.heappop(self._transfers)
                self._land(at, spec)
            else:
                n = min(busy)[1]
                self.sims[n].step(self._results[n])
        self.result.clock = max(s.clock for s in self.sims)
        return self.result
