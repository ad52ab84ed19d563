"""`fairserve db|tenants|keys|usage`: schema migrations, tenants, API keys and usage from the command line."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from billing import (
    BillingError,
    BillingStore,
    Database,
    KeyNotFound,
    TenantExists,
    TenantNotFound,
)
from gateway.edge.key_events import publish_change
from gateway.settings import DEFAULT_DATA_DIR, StorageSettings

_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """A point in time: ISO date/datetime (UTC if naive) or a relative age such as 30m, 24h, 7d."""
    now = now or datetime.now(UTC)
    match = _RELATIVE.match(text.strip())
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: use ISO 8601 (2026-05-01, 2026-05-01T12:00Z) or an age like 24h, 7d"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def quota_arg(text: str) -> int | None:
    """A quota value: a non-negative integer, or 'none' / 'unlimited' for no limit."""
    if text.strip().lower() in ("none", "unlimited", "-"):
        return None
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid quota {text!r}: an integer >= 0 or 'none'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid quota {text!r}: must be >= 0")
    return value


def _db_options(parser: argparse.ArgumentParser) -> None:
    # The same flags, FAIRSERVE_* variables and defaults as `fairserve serve` (gateway/settings.py).
    fields = StorageSettings.model_fields
    parser.add_argument("--db", default=None, help=f"{fields['db_url'].description} [FAIRSERVE_DB_URL]")
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"{fields['data_dir'].description} [FAIRSERVE_DATA_DIR; default {DEFAULT_DATA_DIR}]",
    )


def _storage(args: argparse.Namespace) -> StorageSettings:
    given = {"data_dir": args.data_dir, "db_url": args.db}
    return StorageSettings(**{k: v for k, v in given.items() if v is not None})


def _database(args: argparse.Namespace) -> Database:
    return Database(_storage(args).database_url())


def _store(args: argparse.Namespace, need_tenants: bool = True) -> BillingStore:
    """The store of the configured database; ValueError saying what to do when it has no schema, or no
    tenants where the command needs some: the usual cause is a data directory other than the server's."""
    storage = _storage(args)
    db = Database(storage.database_url())
    where = f"{db!r}" if storage.db_url else f"the data directory {storage.data_dir.resolve()}"
    if db.current_revision() is None:
        raise ValueError(
            f"{where} has no fairserve schema: is it the one `fairserve serve` uses "
            "(--data-dir / --db, FAIRSERVE_DATA_DIR / FAIRSERVE_DB_URL)? To start a new one, "
            "run `fairserve db upgrade` or `fairserve serve` with the same options"
        )
    db.upgrade()  # an older schema moves to head, as the server does on start; a no-op at head
    store = BillingStore(db)
    if need_tenants and not store.list_tenants():
        raise ValueError(
            f"{where} has no tenants: is it the one `fairserve serve` uses "
            "(--data-dir / --db, FAIRSERVE_DATA_DIR / FAIRSERVE_DB_URL)? "
            "Add one with `fairserve tenants add NAME`"
        )
    return store


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _emit(args: argparse.Namespace, rows: list[dict[str, Any]], columns: list[str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(rows, default=_fmt, indent=2))
    else:
        print(_table(rows, columns) if rows else "(none)")


TENANT_COLUMNS = [
    "id",
    "name",
    "weight",
    "priority_class",
    "tokens_per_minute",
    "tokens_per_day",
    "max_queued_requests",
    "cache_group",
    "disabled",
]
KEY_COLUMNS = ["id", "tenant_id", "prefix", "name", "created_at", "last_used_at", "revoked_at"]


def cmd_db(args: argparse.Namespace) -> int:
    """db upgrade|downgrade|current."""
    db = _database(args)
    if args.db_action == "upgrade":
        db.upgrade(args.revision)
    elif args.db_action == "downgrade":
        db.downgrade(args.revision)
    print(f"{db!r} at revision {db.current_revision() or 'base'} (head {db.head_revision()})")
    return 0


def cmd_tenants(args: argparse.Namespace) -> int:
    """tenants add|list|set."""
    store = _store(args, need_tenants=args.tenants_action != "add")
    if args.tenants_action == "list":
        _emit(args, [asdict(t) for t in store.list_tenants()], TENANT_COLUMNS)
        return 0
    fields = {
        k: getattr(args, k)
        for k in (
            "weight",
            "priority_class",
            "tokens_per_minute",
            "tokens_per_day",
            "max_queued_requests",
            "cache_group",
        )
        if getattr(args, k) is not _UNSET
    }
    if args.tenants_action == "add":
        tenant = store.create_tenant(args.name, **fields)
    else:
        if args.rename is not None:
            fields["name"] = args.rename
        if args.disabled is not None:
            fields["disabled"] = args.disabled
        if not fields:
            raise ValueError(
                "nothing to change: give at least one of --weight, --priority-class, --tokens-per-minute, "
                "--tokens-per-day, --max-queued-requests, --cache-group, --rename, "
                "--disable/--enable"
            )
        tenant = store.update_tenant(args.tenant, actor=args.actor, **fields)
        _announce(args, tenant.id)
    _emit(args, [asdict(tenant)], TENANT_COLUMNS)
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """keys create|list|revoke."""
    store = _store(args)
    if args.keys_action == "create":
        secret, info = store.create_key(args.tenant, name=args.name, actor=args.actor)
        if args.json:
            print(json.dumps({"secret": secret, **asdict(info)}, default=_fmt, indent=2))
        else:
            print(secret)
            print(
                f"key {info.id} ({info.prefix}) for tenant {info.tenant_id}; store the secret now, "
                "it is not shown again",
                file=sys.stderr,
            )
    elif args.keys_action == "list":
        _emit(args, [asdict(k) for k in store.list_keys(args.tenant)], KEY_COLUMNS)
    else:
        info = store.revoke_key(args.key_id, actor=args.actor)
        _announce(args, info.tenant_id)
        _emit(args, [asdict(info)], KEY_COLUMNS)
    return 0


def _announce(args: argparse.Namespace, tenant_id: str) -> None:
    """With --redis, tell every gateway to drop the tenant's cached keys now (else their TTL applies)."""
    if getattr(args, "redis", None) and not publish_change(args.redis, tenant_id):
        print(
            "warning: could not reach Redis; gateways see the change within their key cache TTL",
            file=sys.stderr,
        )


def cmd_reconcile(args: argparse.Namespace) -> int:
    """usage reconcile [--since WHEN] --engine ADDR...: the ledger against the engines' own counters.

    Prints every (tenant, count) on which they differ; exits 1 when there is one (0: they agree).
    """
    from engine.remote.client import RemoteEngine  # only this command talks to engines
    from gateway.ops.produced import reconcile_report

    if not args.engine:
        raise SystemExit("fairserve usage reconcile: give the engines to compare with (--engine ADDR ...)")
    since = args.since or parse_since("24h")
    answers = []
    for address in args.engine:
        engine = RemoteEngine(address, heartbeat_timeout_s=5.0)
        try:
            engine.start()
            answers.append(engine.produced_now(since.timestamp()))
        finally:
            engine.shutdown(timeout_s=1.0)
    db = _database(args)
    db.upgrade()
    report = reconcile_report(db, since, answers)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"since {report['since']}, engines {', '.join(report['engines'])}")
        if report["differences"]:
            print(_table(report["differences"], ["tenant_id", "count", "ledger", "engines", "delta"]))
        else:
            print("no differences")
    return 1 if report["differences"] else 0


def cmd_usage(args: argparse.Namespace) -> int:
    """usage [--tenant T] [--since WHEN] [--until WHEN]; `usage reconcile` compares with the engines."""
    if args.usage_action == "reconcile":
        return cmd_reconcile(args)
    store = _store(args)
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
    _emit(
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


class _Unset:
    def __repr__(self) -> str:
        return "(unchanged)"


_UNSET: Any = _Unset()


def _guarded(func: Any) -> Any:
    """Run a command; known errors become one line on stderr and exit status 1, never a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except (TenantExists, TenantNotFound, KeyNotFound, BillingError, ValueError) as exc:
            print(f"fairserve {args.command}: error: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:  # e.g. the database is unreachable
            from sqlalchemy.exc import SQLAlchemyError

            if isinstance(exc, SQLAlchemyError):
                print(
                    f"fairserve {args.command}: database error: {str(exc).splitlines()[0]}", file=sys.stderr
                )
                return 1
            raise

    return run


def _tenant_fields(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weight", type=float, default=_UNSET, help="fair-share weight (> 0)")
    p.add_argument("--priority-class", type=int, default=_UNSET, help="0 = most important (default 1)")
    p.add_argument(
        "--tokens-per-minute", type=quota_arg, default=_UNSET, help="token quota per minute, or none"
    )
    p.add_argument("--tokens-per-day", type=quota_arg, default=_UNSET, help="token quota per day, or none")
    p.add_argument("--max-queued-requests", type=quota_arg, default=_UNSET, help="queue bound, or none")
    p.add_argument(
        "--cache-group",
        type=_cache_group_arg,
        default=_UNSET,
        help="share prefix-cache blocks with the tenants of this group, or none (own blocks only)",
    )


def _cache_group_arg(value: str) -> str | None:
    return None if value.lower() in ("none", "") else value


def register(subparsers: Any) -> None:
    """Add the db, tenants, keys and usage subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    _db_options(common)
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument("--actor", default="cli", help="who is making the change (audit log)")

    db = subparsers.add_parser("db", help="database schema migrations")
    db_sub = db.add_subparsers(dest="db_action", required=True)
    for action, default in (("upgrade", "head"), ("downgrade", "base"), ("current", "head")):
        p = db_sub.add_parser(action, parents=[common], help=f"{action} the schema")
        if action != "current":
            p.add_argument("revision", nargs="?", default=default)
        else:
            p.set_defaults(revision=default)
        p.set_defaults(func=_guarded(cmd_db))

    tenants = subparsers.add_parser("tenants", help="manage tenants")
    t_sub = tenants.add_subparsers(dest="tenants_action", required=True)
    add = t_sub.add_parser("add", parents=[common], help="create a tenant")
    add.add_argument("name")
    _tenant_fields(add)
    t_sub.add_parser("list", parents=[common], help="list tenants")
    set_ = t_sub.add_parser("set", parents=[common], help="change a tenant (by id or name)")
    set_.add_argument("tenant")
    _tenant_fields(set_)
    set_.add_argument("--rename", default=None, help="new name")
    set_.add_argument("--disable", dest="disabled", action="store_const", const=True, default=None)
    set_.add_argument("--enable", dest="disabled", action="store_const", const=False)
    set_.add_argument(
        "--redis", default=None, help="redis:// URL of the gateways: they apply the change at once"
    )
    tenants.set_defaults(func=_guarded(cmd_tenants))

    keys = subparsers.add_parser("keys", help="manage API keys")
    k_sub = keys.add_subparsers(dest="keys_action", required=True)
    create = k_sub.add_parser("create", parents=[common], help="issue a key (the secret is printed once)")
    create.add_argument("--tenant", required=True, help="tenant id or name")
    create.add_argument("--name", default="default", help="a label for the key")
    lst = k_sub.add_parser("list", parents=[common], help="list keys (never secrets)")
    lst.add_argument("--tenant", default=None, help="only this tenant's keys")
    revoke = k_sub.add_parser("revoke", parents=[common], help="revoke a key by id or prefix")
    revoke.add_argument("key_id")
    revoke.add_argument(
        "--redis", default=None, help="redis:// URL of the gateways: they refuse the key at once"
    )
    keys.set_defaults(func=_guarded(cmd_keys))

    usage = subparsers.add_parser("usage", parents=[common], help="per-tenant usage from the ledger")
    usage.add_argument(
        "usage_action", nargs="?", choices=["reconcile"], help="reconcile: compare with the engines' counters"
    )
    usage.add_argument("--engine", action="append", default=[], help="reconcile: an engine's address")
    usage.add_argument("--tenant", default=None, help="tenant id or name (default: all)")
    usage.add_argument("--since", type=parse_since, default=None, help="ISO time or age (24h, 7d)")
    usage.add_argument("--until", type=parse_since, default=None, help="ISO time or age")
    usage.set_defaults(func=_guarded(cmd_usage))
