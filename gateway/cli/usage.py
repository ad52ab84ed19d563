"""`fairserve usage [reconcile]`: per-tenant usage from the ledger, and the ledger against the engines."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from billing import TenantNotFound
from gateway.cli.arg_types import parse_since
from gateway.cli.output import emit, table
from gateway.cli.store import common_options, guarded, open_database, open_store


def cmd_reconcile(args: argparse.Namespace) -> int:
    """usage reconcile [--since WHEN] --engine ADDR...: the ledger against the engines' own counters.

    Prints every (tenant, count) on which they differ; exits 1 when there is one (0: they agree).
    """
    from engine.serving.remote.client import RemoteEngine  # only this command talks to engines
    from engine.serving.remote.liveness import SilenceBounds
    from gateway.ops.produced import reconcile_report

    if not args.engine:
        raise SystemExit("fairserve usage reconcile: give the engines to compare with (--engine ADDR ...)")
    since = args.since or parse_since("24h")
    answers = []
    for address in args.engine:
        engine = RemoteEngine(address, SilenceBounds(5.0, 5.0))  # one question: no routing
        try:
            engine.start()
            answers.append(engine.produced_now(since.timestamp()))
        finally:
            engine.shutdown(timeout_s=1.0)
    db = open_database(args)
    db.upgrade()
    report = reconcile_report(db, since, answers)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"since {report['since']}, engines {', '.join(report['engines'])}")
        if report["differences"]:
            print(table(report["differences"], ["tenant_id", "count", "ledger", "engines", "delta"]))
        else:
            print("no differences")
    return 1 if report["differences"] else 0


def cmd_usage(args: argparse.Namespace) -> int:
    """usage [--tenant T] [--since WHEN] [--until WHEN]; `usage reconcile` compares with the engines."""
    if args.usage_action == "reconcile":
        return cmd_reconcile(args)
    store = open_store(args)
    if args.tenant is not None and store.get_tenant(args.tenant) is None:
        raise TenantNotFound(f"no tenant {args.tenant!r}")
    summaries = store.usage_summary(args.tenant, since=args.since, until=args.until)
    rows = []
    for s in summaries:
        row = asdict(s)
        by_status = row.pop("requests_by_status")
        row.update(
            {
                st: by_status.get(st, 0)
                for st in ("completed", "cancelled", "deadline", "rejected", "error", "interrupted")
            }
        )
        row["tenant"] = s.tenant_name or s.tenant_id
        rows.append(row)
    emit(
        args,
        rows,
        [
            "tenant",
            "requests",
            "completed",
            "cancelled",
            "deadline",
            "rejected",
            "error",
            "interrupted",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
            "charged_service",
            "tokens_after_cancel",
            "preemptions",
            "recomputed_tokens",
        ],
    )
    return 0


def register(subparsers: Any) -> None:
    """Add the usage subcommand."""
    usage = subparsers.add_parser(
        "usage", parents=[common_options()], help="per-tenant usage from the ledger"
    )
    usage.add_argument(
        "usage_action", nargs="?", choices=["reconcile"], help="reconcile: compare with the engines' counters"
    )
    usage.add_argument("--engine", action="append", default=[], help="reconcile: an engine's address")
    usage.add_argument("--tenant", default=None, help="tenant id or name (default: all)")
    usage.add_argument("--since", type=parse_since, default=None, help="ISO time or age (24h, 7d)")
    usage.add_argument("--until", type=parse_since, default=None, help="ISO time or age")
    usage.set_defaults(func=guarded(cmd_usage))
