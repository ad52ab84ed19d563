"""Fair share inside a tenant on the real engine: Sybil users and an agent's fan-out beside a chat.

    .venv/bin/python -m bench.flows [--rounds 2] [--seconds 10] [--scenario sybil fan-out]

One CPU engine with 8 seats behind the gateway, over HTTP; tenants A and B of weight 1, both kept
backlogged by closed-loop streams. `sybil`: A's 24 streams carry 24 `user` names, B's 24 one name, fairness
key `user` against `tenant/user`. `fan-out`: A runs an agent (one X-Workflow-Run-Id, 20 parallel calls) and
a chat (another run id, one 8-token call at a time) beside B's 20 streams, key `tenant` against
`tenant/workflow`. Reported: A's charged service over B's inside the window, and the chat's median
completion at the client, in engine steps and server-side (the ledger's e2e). Results: docs/fairness.md.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from bench.harness import closed_loop, parser
from bench.server import LocalServer, start_local_server
from engine import EngineConfig
from fairness import FairnessConfig

WARMUP_S = 1.0


@dataclass
class Stream:
    """A closed-loop client of one tenant: `concurrency` requests in flight, each replaced as it ends."""

    tenant: str
    concurrency: int
    prompt_words: int
    max_tokens: tuple[int, int]  # output lengths vary, as an agent's do: requests end spread out
    user: str | None = None
    workflow: str | None = None


@dataclass
class Tally:
    """What completed inside the measured window."""

    service: dict[str, float] = field(default_factory=dict)  # charged by the engine inside the window
    iterations_per_s: float = 0.0  # the engine's pace inside the window (a busy machine slows it)
    epoch_window: tuple[float, float] = (0.0, 0.0)
    latency_s: dict[str, list[float]] = field(default_factory=dict)


def tenant_service(server: LocalServer) -> dict[str, float]:
    """The engine's charged service by tenant name, whatever the fairness key ("<tenant id>/<flow>" too)."""
    names = {server.state.store.get_tenant(name).id: name for name in server.keys}  # type: ignore[union-attr]
    totals: dict[str, float] = {}
    for key, value in server.engine.stats().service.items():
        name = names.get(key.split("/")[0], key)
        totals[name] = totals.get(name, 0.0) + value
    return totals


async def drive(server: LocalServer, streams: list[Stream], seconds: float) -> Tally:
    """Run every stream's clients for `seconds` after a warm-up; the tally of the measured window.

    Service is read from the engine at the window's edges (charged as tokens are scheduled), so requests
    cut by the window count for what they received inside it.
    """
    start = time.monotonic()
    window = (start + WARMUP_S, start + WARMUP_S + seconds)
    tally = Tally(epoch_window=(time.time() + WARMUP_S, time.time() + WARMUP_S + seconds))
    clients = [
        (st, random.Random(1000 * s + i)) for s, st in enumerate(streams) for i in range(st.concurrency)
    ]

    async def once(c: int) -> None:
        stream, rng = clients[c]
        body: dict[str, Any] = {"prompt": " ".join(["fair"] * stream.prompt_words), "ignore_eos": True}
        body |= {"temperature": 0.0, "max_tokens": rng.randint(*stream.max_tokens)}
        body |= {"user": stream.user} if stream.user else {}
        headers = {"X-Workflow-Run-Id": stream.workflow} if stream.workflow else {}
        sent = time.monotonic()
        resp = await server.complete(client, stream.tenant, headers, **body)
        ended = time.monotonic()
        if resp.status_code == 200 and window[0] <= sent and ended <= window[1]:
            tally.latency_s.setdefault(stream.workflow or stream.tenant, []).append(ended - sent)

    async def sample_service() -> None:
        await asyncio.sleep(WARMUP_S)
        before, iterations = tenant_service(server), server.engine.stats().iterations
        await asyncio.sleep(seconds)
        after = tenant_service(server)
        tally.service = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in server.keys}
        tally.iterations_per_s = (server.engine.stats().iterations - iterations) / seconds

    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(base_url=server.url, timeout=120.0, limits=limits) as client:
        await asyncio.gather(sample_service(), closed_loop(len(clients), window[1], once))
    return tally


def ledger_e2e_s(server: LocalServer, workflow: str, window: tuple[float, float]) -> list[float]:
    """Server-side arrival-to-finish seconds of `workflow`'s requests inside `window` (epoch), from the ledger:
    the scheduling delay without the client's and HTTP's share of a busy machine."""
    assert server.state.ledger.flush(10.0), "the ledger did not flush"
    query = text("SELECT e2e_ms, created_at, finished_at FROM usage WHERE workflow_run_id = :w")
    with server.state.db.engine.connect() as conn:
        rows = list(conn.execute(query, {"w": workflow}))
    return [
        e2e / 1000
        for e2e, t0, t1 in rows
        if e2e is not None and window[0] <= _epoch(t0) <= _epoch(t1) <= window[1]
    ]


def _epoch(value: Any) -> float:
    value = datetime.fromisoformat(value) if isinstance(value, str) else value
    return float((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp())


def serve(key: str, data_dir: Path, **fairness: Any) -> LocalServer:
    """A gateway over a fresh 8-seat CPU engine keeping fair share per `key` (and any other `fairness`
    knobs); tenants A and B, weight 1."""
    config = EngineConfig(
        max_num_seqs=8,
        max_num_batched_tokens=256,
        num_kv_blocks=512,
        cache_dir=str(data_dir / "model"),
        fairness=FairnessConfig(key=key, **fairness),  # type: ignore[arg-type]
    )
    return start_local_server(config, data_dir, [("A", 1.0), ("B", 1.0)])


SYBIL = [Stream("A", 1, 8, (8, 24), user=f"a{i}") for i in range(24)]
SYBIL += [Stream("B", 24, 8, (8, 24), user="b")]
FAN_OUT = [
    Stream("A", 20, 8, (8, 24), workflow="agent"),
    Stream("A", 1, 4, (8, 8), workflow="chat"),
    Stream("B", 20, 8, (8, 24), workflow="b"),
]
RUNS: tuple[tuple[str, str, list[Stream]], ...] = (
    ("sybil", "user", SYBIL),
    ("sybil", "tenant/user", SYBIL),
    ("fan-out", "tenant", FAN_OUT),
    ("fan-out", "tenant/workflow", FAN_OUT),
)


def measure(rounds: int, seconds: float, scenarios: tuple[str, ...]) -> dict[str, list[dict[str, float]]]:
    """Every run of `RUNS` once per round, alternating; per run key, one record per round."""
    results: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for scenario, key, streams in (run for run in RUNS if run[0] in scenarios):
            with tempfile.TemporaryDirectory() as tmp:
                server = serve(key, Path(tmp))
                try:
                    tally = asyncio.run(drive(server, streams, seconds))
                    server_side = ledger_e2e_s(server, "chat", tally.epoch_window)
                finally:
                    server.stop()
            record = {"a_over_b": tally.service["A"] / max(1.0, tally.service["B"])}
            if "chat" in tally.latency_s:
                record["chat_median_s"] = statistics.median(tally.latency_s["chat"])
                record["chat_median_iterations"] = record["chat_median_s"] * tally.iterations_per_s
                record["chat_done"] = len(tally.latency_s["chat"])
                record["chat_server_median_s"] = statistics.median(server_side)
            results.setdefault(f"{scenario} {key}", []).append(record)
    return results


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__, rounds=2, seconds=10.0)
    p.add_argument("--scenario", nargs="+", choices=("sybil", "fan-out"), default=["sybil", "fan-out"])
    args = p.parse_args(argv)
    results = measure(args.rounds, args.seconds, tuple(args.scenario))
    for name, records in results.items():
        print(name, json.dumps(records))
    pairs = zip(results.get("fan-out tenant", []), results.get("fan-out tenant/workflow", []), strict=True)
    for r, (flat, two) in enumerate(pairs, start=1):
        ratio = [
            two[k] / flat[k] for k in ("chat_median_s", "chat_median_iterations", "chat_server_median_s")
        ]
        print(
            f"round {r}: chat median, tenant/workflow over tenant: {ratio[0]:.3f} at the client, "
            f"{ratio[1]:.3f} in engine steps, {ratio[2]:.3f} server-side (ledger e2e)"
        )


if __name__ == "__main__":
    main()
