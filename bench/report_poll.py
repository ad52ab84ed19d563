"""Polling a large task report beside another tenant's requests (issue 45, point 3).

    .venv/bin/python -m bench.report_poll                          # this checkout, about a minute
    .venv/bin/python -m bench.report_poll --server-tree /work/main # the same against another checkout
    .venv/bin/python -m bench.report_poll --quick                  # a few seconds per phase (the test's run)

A `fairserve serve` subprocess (SQLite ledger) with two tenants of weight 1. Tenant B's task is given
`--rows` ledger rows (50,000) over `--attempts` distinct X-Attempt values (as many as rows: issue 54's
case), written through the server tree's own ledger batch insert, so whatever that tree maintains beside
the rows (the report rollup here) is there too. Then, alternating: tenant A
alone (4 closed-loop clients, 100-token prompts, `max_tokens` 1), and A beside `--pollers` (16) loops of
B polling `GET /v1/tasks/{id}` back to back (or, with `--polite`, each waiting the Retry-After of its
429s, as the issue's honouring pollers did). Reported: A's answers and p50 / p99 in each, and what the
pollers got (status counts). `--server-tree` runs the server (and the seeding) from another checkout, for
a before / after on the same machine.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.door import clients
from bench.harness import closed_loop, parser, served_model
from tests.gateway.serve_process import ServeProcess

# Run with the server tree's PYTHONPATH: its own ledger insert stores the rows (and any rollup of them).
_SEED = """
import sys
from dataclasses import replace
from billing import Database
from billing.ledger_sql import write_batch
from tests.billing.test_ledger import make_row
url, tenant, task, n, attempts = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
db = Database(url)
for start in range(0, n, 1000):
    rows = [replace(make_row(i), tenant_id=tenant, request_id=f"seed-{i}", task_id=task, attempt=i % attempts)
            for i in range(start, min(n, start + 1000))]
    write_batch(db.engine, rows)
db.dispose()
"""


def make_tenant(url: str, admin_token: str, name: str) -> tuple[str, str]:
    """A tenant of weight 1 and one key, through the admin API: (tenant id, key)."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30) as c:
        tenant = c.post("/admin/api/tenants", json={"name": name, "weight": 1.0}).json()
        key = c.post(f"/admin/api/tenants/{tenant['id']}/keys", json={"name": "bench"}).json()["secret"]
        return str(tenant["id"]), str(key)


async def pollers(url: str, key: str, task: str, n: int, seconds: float, polite: bool) -> Counter[str]:
    """`n` loops GETting the task report back to back for `seconds` (`polite`: waiting a 429's
    Retry-After first): status counts."""
    got: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def once(_: int) -> None:
            try:
                answer = await client.get(f"/v1/tasks/{task}", headers={"Authorization": f"Bearer {key}"})
                got[str(answer.status_code)] += 1
                if polite and answer.status_code == 429:  # a client that honours the refusal
                    await asyncio.sleep(float(answer.headers.get("Retry-After", "1")))
            except httpx.HTTPError:
                got["0"] += 1

        await closed_loop(n, time.monotonic() + seconds, once)
    return got


def poll_process(url: str, key: str, task: str, n: int, seconds: float, polite: bool, results: Any) -> None:
    """Child process: the pollers, apart from tenant A's clients (as bench.door runs its floods)."""
    results.put(dict(asyncio.run(pollers(url, key, task, n, seconds, polite))))


def phase(url: str, a_key: str, model: str, seconds: float, flood: tuple[str, str, int, bool] | None) -> Any:
    """Tenant A for `seconds`, alone or beside the pollers (`flood`: B's key, task, loops, polite) in a
    child."""
    body = json.dumps({"model": model, "prompt": [65] * 100, "max_tokens": 1}).encode()
    auth = {"Authorization": f"Bearer {a_key}"}
    results: Any = mp.get_context("spawn").Queue()
    child = None
    if flood is not None:
        key, task, loops, polite = flood
        args = (url, key, task, loops, seconds + 1.0, polite, results)
        child = mp.get_context("spawn").Process(target=poll_process, args=args)
        child.start()
        time.sleep(1.0)  # the pollers' start-up (a phase boundary, not a synchronisation)
    out = asyncio.run(clients(url, 4, seconds, body, lambda: auth))
    got = {} if child is None else results.get(timeout=seconds + 120)
    if child is not None:
        child.join(30)
    ok = sorted(s for status, s in out if status == 200)
    return {
        "ok": len(ok),
        "sent": len(out),
        "p50_ms": round(statistics.median(ok) * 1e3, 1) if ok else None,
        "p99_ms": round(ok[min(len(ok) - 1, int(0.99 * len(ok)))] * 1e3, 1) if ok else None,
        "pollers": got,
    }


def run(
    seconds: float,
    rounds: int,
    rows: int,
    loops: int,
    tree: Path,
    attempts: int | None = None,
    polite: bool = False,
) -> dict[str, Any]:
    """Seed B's task (`attempts` distinct attempts, default one per row), then alternate A alone and A
    beside the pollers `rounds` times."""
    env_before, cwd_before = os.environ.get("PYTHONPATH"), Path.cwd()
    os.environ["PYTHONPATH"] = str(tree)  # the server subprocess (and the seeding) run the chosen tree;
    os.chdir(tree)  # `python -m` puts the working directory first on the path, before PYTHONPATH
    try:
        with tempfile.TemporaryDirectory() as data_dir:
            server = ServeProcess(Path(data_dir))
            try:
                url, admin = server.url, server.banner["admin_token"]
                _, a_key = make_tenant(url, admin, "poll-a")
                b_id, b_key = make_tenant(url, admin, "poll-b")
                db_url = f"sqlite:///{Path(data_dir) / 'fairserve.db'}"
                distinct = str(attempts or rows)
                seed = [sys.executable, "-c", _SEED, db_url, b_id, "big-task", str(rows), distinct]
                subprocess.run(seed, check=True, cwd=tree, env=os.environ.copy())
                model = served_model(url, a_key)
                alone, beside = [], []
                for _ in range(rounds):
                    alone.append(phase(url, a_key, model, seconds, None))
                    flood = (b_key, "big-task", loops, polite)
                    beside.append(phase(url, a_key, model, seconds, flood))
            finally:
                server.stop()
    finally:
        os.chdir(cwd_before)
        if env_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_before
    return {**summary(alone, beside, str(tree)), "rows": rows, "attempts": attempts or rows, "polite": polite}


def summary(alone: list[Any], beside: list[Any], tree: str) -> dict[str, Any]:
    """Medians over rounds of A's answers and latency, alone and beside the pollers."""

    def med(phases: list[Any], key: str) -> float | None:
        values = [p[key] for p in phases if p[key] is not None]
        return statistics.median(values) if values else None

    got = sum((Counter(p["pollers"]) for p in beside), Counter[str]())
    out: dict[str, Any] = {"tree": tree}
    for name, phases in (("alone", alone), ("beside", beside)):
        out[name] = {k: med(phases, k) for k in ("ok", "p50_ms", "p99_ms")}
    base, flooded = out["alone"]["ok"], out["beside"]["ok"]
    out["answers_kept"] = round(flooded / base, 3) if base else None
    out["pollers"] = dict(got)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run and print the JSON report."""
    p = parser(
        __doc__,
        phase=(8.0, "seconds per phase"),
        rounds=(2, "alternations of alone / beside the pollers"),
        rows=(50_000, "ledger rows of the polled task"),
        pollers=(16, "loops polling the report"),
        attempts=(0, "distinct X-Attempt values among the rows (0: one per row)"),
        server_tree=(str(Path(__file__).resolve().parents[1]), "checkout the server runs from"),
    )
    p.add_argument("--quick", action="store_true", help="2-second phases, one round, 2,000 rows (a test)")
    p.add_argument("--polite", action="store_true", help="pollers wait each 429's Retry-After")
    p.prog = "python -m bench.report_poll"
    args = p.parse_args(argv)
    if args.quick:
        args.phase, args.rounds, args.rows = 2.0, 1, 2000
    tree = Path(args.server_tree).resolve()
    result = run(args.phase, args.rounds, args.rows, args.pollers, tree, args.attempts or None, args.polite)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
