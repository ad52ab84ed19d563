"""Retry storm: duplicate generations with the plain openai client vs fairserve_client, same run.

    .venv/bin/python -m experiments.retry_storm --out artifacts/retry_storm.json   # 24 clients, 2 rounds per kind

Many clients, each its own SDK client object, send one completion at the same instant at a
`fairserve serve` subprocess with few engine slots and a small tenant queue bound: part of the burst
is refused with 429 (`tenant_queue_full`, `Retry-After`), the rest queues, and calls that wait in the
queue past the clients' read timeout are retried by the SDK. The two kinds of client run the same
burst in alternating rounds (plain, fairserve, plain, ...) against the same server with the same SDK
settings (`max_retries`, `timeout`); only the client class differs.

Every call carries its own `X-Workflow-Run-Id`, so after the run (the server is stopped first, which
flushes its ledger) the ledger says how many engine requests each call cost. A *duplicate
generation* is a ledger row beyond the first of a call: an attempt the engine worked on although
another attempt of the same call answered or was also worked on. `wasted tokens` are the completion
tokens of those rows. 429s themselves never reach the engine; what a storm duplicates is the work of
attempts the client gave up on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
from sqlalchemy import create_engine, text

from billing.db import default_db_url
from experiments.gateway_overhead import Served
from fairserve_client import AsyncFairServe

KINDS = ("plain", "fairserve")


class Attempts:
    """What the clients of one round sent and got back, counted by httpx event hooks."""

    def __init__(self) -> None:
        self.sent = 0
        self.statuses: Counter[int] = Counter()

    async def on_request(self, request: httpx2.Request) -> None:
        if request.url.path.endswith("/completions"):
            self.sent += 1

    async def on_response(self, response: httpx2.Response) -> None:
        if response.request.url.path.endswith("/completions"):
            self.statuses[response.status_code] += 1

    def http(self) -> httpx2.AsyncClient:
        return openai.DefaultAsyncHttpxClient(
            event_hooks={"request": [self.on_request], "response": [self.on_response]}
        )


async def _call(
    kind: str, served: Served, key: str, call_id: str, args: argparse.Namespace, attempts: Attempts
) -> int | None:
    """One client, one call; returns the completion tokens it received (None when the call failed)."""
    common: dict[str, Any] = {
        "base_url": served.url + "/v1",
        "api_key": key,
        "max_retries": args.max_retries,
        "timeout": args.timeout,
        "http_client": attempts.http(),
    }
    client: openai.AsyncOpenAI
    headers: dict[str, str] = {}
    if kind == "plain":
        client = openai.AsyncOpenAI(**common)
        headers["X-Workflow-Run-Id"] = (
            call_id  # for the count only; the plain client sends nothing of its own
        )
    else:
        client = AsyncFairServe(workflow_run_id=call_id, **common)
    try:
        out = await client.completions.create(
            model="fairserve-tiny",
            prompt=f"storm {call_id}",
            max_tokens=args.max_tokens,
            extra_body={"ignore_eos": True},
            extra_headers=headers,
        )
        return out.usage.completion_tokens if out.usage else 0
    except openai.APIError:
        return None
    finally:
        await client.close()


async def _round(
    kind: str, round_no: int, served: Served, key: str, args: argparse.Namespace
) -> dict[str, Any]:
    attempts = Attempts()
    ids = [f"storm-{round_no}-{kind}-{i}" for i in range(args.clients)]
    received = await asyncio.gather(*(_call(kind, served, key, i, args, attempts) for i in ids))
    return {
        "kind": kind,
        "round": round_no,
        "calls": args.clients,
        "answered": sum(r is not None for r in received),
        "attempts": attempts.sent,
        "responses_by_status": dict(sorted(attempts.statuses.items())),
        "no_response": attempts.sent - sum(attempts.statuses.values()),
        "tokens_received": sum(r or 0 for r in received),
        "prefix": f"storm-{round_no}-{kind}-",
    }


def _wait_idle(served: Served, admin: httpx.Client, timeout_s: float = 120.0) -> None:
    """Until no run is live on the server (orphaned keyed runs included), polled with a deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if admin.get("/admin/api/engine").json()["live_requests"] == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("the server did not become idle")


def _ledger(data_dir: Path, rounds: list[dict[str, Any]]) -> None:
    """Add each round's ledger figures (rows, duplicates, wasted tokens) to its dict."""
    engine = create_engine(default_db_url(data_dir))
    with engine.connect() as conn:
        rows = list(
            conn.execute(
                text(
                    "SELECT workflow_run_id, status, completion_tokens FROM usage "
                    "WHERE workflow_run_id LIKE 'storm-%' ORDER BY created_at"
                )
            ).mappings()
        )
    engine.dispose()
    for r in rounds:
        mine = [row for row in rows if str(row["workflow_run_id"]).startswith(r["prefix"])]
        per_call = Counter(row["workflow_run_id"] for row in mine)
        r["ledger_rows"] = len(mine)
        r["calls_with_a_row"] = len(per_call)
        r["duplicate_generations"] = sum(n - 1 for n in per_call.values())
        r["calls_generated_more_than_once"] = sum(1 for n in per_call.values() if n > 1)
        r["tokens_generated"] = sum(int(row["completion_tokens"]) for row in mine)
        r["wasted_tokens"] = r["tokens_generated"] - r["tokens_received"]
        r["rows_by_status"] = dict(Counter(row["status"] for row in mine))


def _totals(rounds: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    keys = (
        "calls",
        "answered",
        "attempts",
        "no_response",
        "ledger_rows",
        "duplicate_generations",
        "calls_generated_more_than_once",
        "tokens_generated",
        "tokens_received",
        "wasted_tokens",
    )
    out: dict[str, dict[str, int]] = {}
    for kind in KINDS:
        mine = [r for r in rounds if r["kind"] == kind]
        out[kind] = {k: sum(int(r[k]) for r in mine) for k in keys}
        out[kind]["429s"] = sum(int(r["responses_by_status"].get(429, 0)) for r in mine)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, run the alternating rounds, stop it (flushing the ledger), count."""
    with tempfile.TemporaryDirectory(prefix="retry-storm-") as tmp:
        data_dir = Path(tmp)
        served = Served(str(data_dir), "--max-num-seqs", str(args.max_num_seqs), "--no-engine-process")
        rounds: list[dict[str, Any]] = []
        try:
            admin = httpx.Client(
                base_url=served.url,
                timeout=30,
                headers={"Authorization": f"Bearer {served.banner['admin_token']}"},
            )
            admin.post(
                "/admin/api/tenants", json={"name": "storm", "max_queued_requests": args.tenant_queue}
            ).raise_for_status()
            key = admin.post("/admin/api/tenants/storm/keys", json={}).json()["secret"]
            for round_no in range(args.rounds):
                for kind in KINDS if round_no % 2 == 0 else tuple(reversed(KINDS)):
                    rounds.append(asyncio.run(_round(kind, round_no, served, key, args)))
                    _wait_idle(served, admin)
            admin.close()
        finally:
            served.stop()  # SIGTERM: the gateway flushes its ledger before it exits
        _ledger(data_dir, rounds)
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "rounds": rounds,
        "totals": _totals(rounds),
    }


def main() -> None:
    """CLI entry: run and print the totals (and write the JSON with --out)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=24, help="clients in each burst (one call each)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per client kind, alternating")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=128,
        help="per call (ignore_eos): long enough to queue past the timeout",
    )
    p.add_argument("--timeout", type=float, default=1.0, help="the SDK's request timeout, seconds")
    p.add_argument("--max-retries", type=int, default=5, help="the SDK's retry budget (both kinds)")
    p.add_argument("--max-num-seqs", type=int, default=4, help="engine slots of the server")
    p.add_argument(
        "--tenant-queue", type=int, default=8, help="the storm tenant's queue bound (the rest: 429)"
    )
    p.add_argument("--out", default=None, help="write the JSON report here")
    args = p.parse_args()
    report = run(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
    for kind, t in report["totals"].items():
        print(
            f"{kind:9} calls {t['calls']} answered {t['answered']} attempts {t['attempts']} 429s {t['429s']} "
            f"no-response {t['no_response']} ledger rows {t['ledger_rows']} duplicate generations "
            f"{t['duplicate_generations']} (calls {t['calls_generated_more_than_once']}) "
            f"tokens generated {t['tokens_generated']} received {t['tokens_received']} wasted {t['wasted_tokens']}"
        )


if __name__ == "__main__":
    main()
