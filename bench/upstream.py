"""Fair share in front of an engine fairserve does not own: weights 4:1, tenant B flooding, A steady.

    .venv/bin/python -m bench.upstream             # three setups, about 6 minutes on 2 cores
    .venv/bin/python -m bench.upstream --quick     # seconds per phase (the test's run)
    .venv/bin/python -m bench.upstream --duration 600 --alone 60 --out upstream.json   # the docs' run

Three setups, one after another: fairserve's own engine (`fairserve serve --max-num-seqs 8`),
`transformers serve --continuous-batching` behind fairserve (`fairserve serve --upstream MODEL=URL`), and
`transformers serve` alone (tenants told apart only by the client). In each, A's closed-loop streams run
alone, then beside B's flood (more streams than A, weight 1 to A's 4). Reported per setup: each tenant's
share of the streamed tokens in every 10 s and 60 s window, A's TTFT p50/p99 beside the flood over alone,
tokens/s, and the ledger against the usage the clients were sent and the tokens they counted; across
setups, throughput through fairserve over the engine alone. docs/upstream-deploy.md has the figures.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import upstream_report as rep
from bench.door import make_tenant
from bench.harness import parser, table, text
from bench.loadgen import LoadResult, Target, run_load
from bench.transformers_peer import transformers_serve
from bench.vllm_sim.process import running_sim
from bench.workloads import SLO, LengthDist, PlannedRequest, TenantTraffic, Workload
from tests.gateway.serve_process import ServeProcess

WEIGHTS = {"A": 4.0, "B": 1.0}
SETUPS = ("fairserve-engine", "transformers-behind-fairserve", "transformers-alone")


@dataclass
class Front:
    """Where the clients send, and what the setup is."""

    url: str
    model: str
    keys: dict[str, str]  # tenant → API key (none for an engine on its own)
    admin_token: str | None  # fairserve's: its ledger is read through the admin API
    engine: str  # the engine that produced the figures, in words
    ignore_eos: bool  # transformers serve refuses the field
    # The engine's own count of every request it served, where it keeps one (the simulator's
    # /sim/requests): the ledger's totals are compared with it, not only with what the gateway relayed.
    engine_usage: Callable[[], dict[str, int]] | None = None


def _fairserve(
    data_dir: Path,
    engine: str,
    model: str | None,
    *serve_args: str,
    engine_usage: Callable[[], dict[str, int]] | None = None,
) -> Iterator[Front]:
    server = ServeProcess(data_dir, *serve_args, timeout=180)
    try:
        admin = server.banner["admin_token"]
        keys = {
            name: make_tenant(server.url, admin, f"upstream-{name}", weight=w, max_queued_requests=400)
            for name, w in WEIGHTS.items()
        }
        listed = httpx.get(
            f"{server.url}/v1/models", headers={"Authorization": f"Bearer {keys['A']}"}, timeout=30
        )
        name = model or str(listed.json()["data"][0]["id"])
        yield Front(server.url, name, keys, admin, engine, True, engine_usage)
    finally:
        server.stop()


@contextmanager
def fairserve_engine(seats: int, _: str | None) -> Iterator[Front]:
    """`fairserve serve` over its own engine (the embedded model, CPU) with `seats` sequences at once."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = f"fairserve's engine (embedded model, {seats} seats)"
        yield from _fairserve(Path(tmp), engine, None, "--max-num-seqs", str(seats))


@contextmanager
def transformers_behind_fairserve(_: int, model: str | None) -> Iterator[Front]:
    """`transformers serve` behind `fairserve serve --upstream MODEL=URL` (MODEL: the engine's own id)."""
    with transformers_serve() as peer, tempfile.TemporaryDirectory() as tmp:
        name = model or peer.model
        engine = "transformers serve --continuous-batching (embedded model) behind fairserve --upstream"
        yield from _fairserve(Path(tmp), engine, name, "--upstream", f"{name}={peer.url}")


@contextmanager
def transformers_alone(_: int, __: str | None) -> Iterator[Front]:
    """`transformers serve` with nothing in front: tenants are told apart only by the client."""
    with transformers_serve() as peer:
        yield Front(peer.url, peer.model, {}, None, "transformers serve --continuous-batching alone", False)


@contextmanager
def sim_behind_fairserve(seats: int, model: str | None) -> Iterator[Front]:
    """The vLLM simulator (bench/vllm_sim, `seats` slots) behind `fairserve serve --upstream`: exact and fast."""
    with running_sim(model=model or "sim", max_num_seqs=seats) as sim, tempfile.TemporaryDirectory() as tmp:
        engine = f"bench.vllm_sim ({seats} slots, 10 ms step) behind fairserve --upstream"

        def usage() -> dict[str, int]:
            records = sim.requests()
            return {k: sum(int(str(r[k])) for r in records) for k in ("prompt_tokens", "completion_tokens")}

        target = f"{sim.model}={sim.url}"
        yield from _fairserve(Path(tmp), engine, sim.model, "--upstream", target, engine_usage=usage)


@contextmanager
def sim_alone(seats: int, model: str | None) -> Iterator[Front]:
    """The vLLM simulator with nothing in front: it splits its slots by request count."""
    with running_sim(model=model or "sim", max_num_seqs=seats) as sim:
        yield Front(sim.url, sim.model, {}, None, f"bench.vllm_sim alone ({seats} slots, 10 ms step)", True)


STARTERS: dict[str, Callable[[int, str | None], AbstractContextManager[Front]]] = {
    "fairserve-engine": fairserve_engine,
    "transformers-behind-fairserve": transformers_behind_fairserve,
    "transformers-alone": transformers_alone,
    # Not in the default run: the simulator in the same two places, for exact figures in seconds.
    "sim-behind-fairserve": sim_behind_fairserve,
    "sim-alone": sim_alone,
}


@dataclass(frozen=True)
class Shape:
    """The load: closed-loop streams per tenant, prompt and output lengths, the phases' lengths."""

    a_clients: int
    b_clients: int
    prompt_tokens: int
    max_tokens: int
    alone_s: float
    duration_s: float
    warmup_s: float


def _workload(tenant: str) -> Workload:
    traffic = (TenantTraffic(tenant, WEIGHTS[tenant], 1.0),)
    fixed = LengthDist(1, 1)  # lengths are in the plan; the workload only carries sampling and the SLO
    return Workload(
        f"upstream-{tenant}", "closed-loop streams", fixed, fixed, SLO(60, 60, 600), tenants=traffic
    )


def _plan(tenant: str, shape: Shape, clients: int, seconds: float, seed: int) -> list[PlannedRequest]:
    rng = random.Random(seed)
    n = clients * (int(seconds * 20) + 2)  # more than the clients can send: a request takes > 50 ms
    return [
        PlannedRequest(0.0, tenant, text(shape.prompt_tokens, rng), [shape.max_tokens], seeds=[i])
        for i in range(n)
    ]


async def run_phase(
    front: Front, shape: Shape, clients: dict[str, int], seconds: float, seed: int
) -> dict[str, LoadResult]:
    """Each tenant's closed-loop clients at once for `seconds`; every request waited for."""

    async def tenant(name: str, n: int) -> LoadResult:
        target = Target(
            front.url, front.model, {name: front.keys.get(name, "none")}, ignore_eos=front.ignore_eos
        )
        plan = _plan(name, shape, n, seconds, seed + ord(name))
        return await run_load(target, _workload(name), plan, clients=n, duration_s=seconds, timeout_s=600)

    results = await asyncio.gather(*(tenant(name, n) for name, n in clients.items()))
    return dict(zip(clients, results, strict=True))


def _ledger(front: Front, expected: dict[str, int], wait_s: float = 20.0) -> dict[str, dict[str, int]]:
    """The ledger's totals by tenant once it holds as many answered requests as the clients saw (it writes
    behind the requests), or what it holds after `wait_s`."""
    headers = {"Authorization": f"Bearer {front.admin_token}"}
    deadline = time.monotonic() + wait_s
    while True:
        rows = httpx.get(
            f"{front.url}/admin/api/usage", params={"window": "1h"}, headers=headers, timeout=30
        ).json()
        got = {
            str(r["tenant_name"]).removeprefix("upstream-"): {
                k: int(r[k]) for k in ("requests", "prompt_tokens", "completion_tokens")
            }
            for r in rows["tenants"]
        }
        if (
            all(got.get(t, {}).get("requests", 0) >= n for t, n in expected.items())
            or time.monotonic() > deadline
        ):
            return got
        time.sleep(0.2)  # a poll: the ledger's writer gives no event to wait on


def measure(front: Front, shape: Shape) -> dict[str, Any]:
    """Warm-up, A alone, then A beside B's flood, through `front`; the setup's section of the report."""
    warm = asyncio.run(run_phase(front, shape, {"A": 1, "B": 1}, 0.5, 1))
    alone = asyncio.run(run_phase(front, shape, {"A": shape.a_clients}, shape.alone_s, 2))
    flood = asyncio.run(
        run_phase(front, shape, {"A": shape.a_clients, "B": shape.b_clients}, shape.duration_s, 3)
    )
    start = max(r.started for r in flood.values()) + shape.warmup_s
    stop = min(r.started for r in flood.values()) + shape.duration_s
    a_alone, a_beside = rep.ttft(alone["A"].outcomes), rep.ttft(flood["A"].outcomes)
    section: dict[str, Any] = {
        "engine": front.engine,
        "measured": True,
        "whole_flood": rep.window_shares(flood, start, stop, max(stop - start, 1e-3), WEIGHTS)[0],
        "windows_10s": rep.window_shares(flood, start, stop, 10.0, WEIGHTS),
        "windows_60s": rep.window_shares(flood, start, stop, 60.0, WEIGHTS),
        "a_ttft_alone_s": a_alone,
        "a_ttft_beside_flood_s": a_beside,
        "a_ttft_p50_ratio": rep.ratio(a_beside["p50"], a_alone["p50"]),
        "a_ttft_p99_ratio": rep.ratio(a_beside["p99"], a_alone["p99"]),
        "tokens_per_s": rep.throughput(flood.values(), start, stop),
        "failed": {t: sum(1 for o in r.outcomes if not o.accepted) for t, r in flood.items()},
    }
    section["every_60s_window_within_5pct"] = rep.within(section["windows_60s"], 0.05)
    section["every_10s_window_within_10pct"] = rep.within(section["windows_10s"], 0.10)
    if front.admin_token is not None:
        everything = {
            t: LoadResult(
                outcomes=[o for phase in (warm, alone, flood) if t in phase for o in phase[t].outcomes]
            )
            for t in WEIGHTS
        }
        clients = rep.client_usage(everything)
        ledger = _ledger(front, {t: c["requests"] for t, c in clients.items()})
        section["ledger"] = rep.ledger_against_clients(ledger, clients)
        if front.engine_usage is not None:
            kept = {
                k: sum(row[k] for t, row in ledger.items() if t in WEIGHTS)
                for k in ("prompt_tokens", "completion_tokens")
            }
            section["ledger_against_engine"] = {"ledger": kept, "engine": front.engine_usage()}
    return section


def run(setups: tuple[str, ...], shape: Shape, seats: int, upstream_model: str | None) -> dict[str, Any]:
    """Every setup in turn; one that cannot start is reported as not measured, with why."""
    report: dict[str, Any] = {"shape": shape.__dict__, "weights": WEIGHTS, "setups": {}}
    for name in setups:
        try:
            with STARTERS[name](seats, upstream_model) as front:
                report["setups"][name] = measure(front, shape)
        except (AssertionError, RuntimeError, httpx.HTTPError, KeyError) as exc:
            report["setups"][name] = {
                "measured": False,
                "note": f"not measured: {type(exc).__name__}: {str(exc)[-400:]}",
            }
    report["throughput_fairserve_over_engine_alone"] = {
        engine: rep.ratio(behind["tokens_per_s"], alone["tokens_per_s"])
        for engine in ("transformers", "sim")
        if (behind := report["setups"].get(f"{engine}-behind-fairserve", {})).get("measured")
        and (alone := report["setups"].get(f"{engine}-alone", {})).get("measured")
    }
    return report


def markdown(report: dict[str, Any]) -> list[str]:
    """One row per setup: A:B over 4:1 in the 60 s and 10 s windows (min–max), TTFT ratios, tokens/s, ledger."""

    def spread(windows: list[dict[str, Any]]) -> str:
        xs = [w["ratio_over_weights"] for w in windows if w["ratio_over_weights"] is not None]
        return f"{min(xs):.2f}–{max(xs):.2f} ({len(xs)})" if xs else "–"

    def num(x: float | None, fmt: str = ".2f") -> str:
        return "–" if x is None else format(x, fmt)

    rows = []
    for name, s in report["setups"].items():
        if not s.get("measured"):
            rows.append(f"{name} | {s['note']} | | | | | |")
            continue
        ledger = s.get("ledger")
        equal = (
            "–"
            if ledger is None
            else "yes"
            if all(r["completion_equal_to_usage"] for r in ledger.values())
            else "no"
        )
        rows.append(
            f"{name} | {s['engine']} | {spread(s['windows_60s'])} | {spread(s['windows_10s'])} | "
            f"{num(s['a_ttft_p50_ratio'])} / {num(s['a_ttft_p99_ratio'])} | {num(s['tokens_per_s'], '.0f')} | {equal}"
        )
    header = "setup | engine | A:B ÷ 4:1, 60 s windows (n) | 10 s windows (n) | A TTFT p50 / p99 beside ÷ alone | tokens/s | ledger = usage"
    lines = table(header, "llrrrrl", rows)
    for engine, x in report["throughput_fairserve_over_engine_alone"].items():
        lines.append(f"\nthroughput through fairserve ÷ {engine} alone: {num(x)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run and print the Markdown summary; the whole report as JSON to --out (else to stdout)."""
    p = parser(
        __doc__,
        duration=(60.0, "seconds of A beside B's flood"),
        alone=(15.0, "seconds of A alone"),
        warmup=(5.0, "seconds of the flood before the windows start"),
        a_clients=(12, "A's closed-loop streams"),
        b_clients=(24, "B's closed-loop streams (the flood)"),
        prompt_tokens=(24, "prompt length (tokens of the byte tokenizer)"),
        max_tokens=(32, "output tokens per request"),
        seats=(8, "fairserve engine's --max-num-seqs (and the simulator's slots)"),
        setups=(",".join(SETUPS), f"which setups, comma-separated, of {', '.join(STARTERS)}"),
        upstream_model=(None, "the name fairserve serves the upstream as (default: the engine's own id)"),
        out=(None, "write the JSON report here"),
    )
    p.add_argument("--quick", action="store_true", help="seconds per phase, few clients (the test's run)")
    p.prog = "python -m bench.upstream"
    a = p.parse_args(argv)
    shape = (
        Shape(3, 6, 16, 8, 2.0, 6.0, 1.0)
        if a.quick
        else Shape(a.a_clients, a.b_clients, a.prompt_tokens, a.max_tokens, a.alone, a.duration, a.warmup)
    )
    setups = tuple(s for s in a.setups.split(",") if s in STARTERS)
    report = run(setups, shape, a.seats, a.upstream_model)
    print("\n".join(markdown(report)))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2))
    else:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
