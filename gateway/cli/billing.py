"""`fairserve db|tenants|keys`: schema migrations, tenants and API keys from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from gateway.cli.arg_types import cache_group_arg, quota_arg
from gateway.cli.output import emit, fmt
from gateway.cli.store import common_options, guarded, open_database, open_store

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
    db = open_database(args)
    if args.db_action == "upgrade":
        db.upgrade(args.revision)
    elif args.db_action == "downgrade":
        db.downgrade(args.revision)
    print(f"{db!r} at revision {db.current_revision() or 'base'} (head {db.head_revision()})")
    return 0


def cmd_tenants(args: argparse.Namespace) -> int:
    """tenants add|list|set."""
    store = open_store(args, need_tenants=args.tenants_action != "add")
    if args.tenants_action == "list":
        emit(args, [asdict(t) for t in store.list_tenants()], TENANT_COLUMNS)
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
    emit(args, [asdict(tenant)], TENANT_COLUMNS)
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """keys create|list|revoke."""
    store = open_store(args)
    if args.keys_action == "create":
        secret, info = store.create_key(args.tenant, name=args.name, actor=args.actor)
        if args.json:
            print(json.dumps({"secret": secret, **asdict(info)}, default=fmt, indent=2))
        else:
            print(secret)
            print(
                f"key {info.id} ({info.prefix}) for tenant {info.tenant_id}; store the secret now, "
                "it is not shown again",
                file=sys.stderr,
            )
    elif args.keys_action == "list":
        emit(args, [asdict(k) for k in store.list_keys(args.tenant)], KEY_COLUMNS)
    else:
        info = store.revoke_key(args.key_id, actor=args.actor)
        _announce(args, info.tenant_id)
        emit(args, [asdict(info)], KEY_COLUMNS)
    return 0


def _announce(args: argparse.Namespace, tenant_id: str) -> None:
    """With --redis, tell every gateway to drop the tenant's cached keys now (else their TTL applies)."""
    if not getattr(args, "redis", None):
        return
    # Imported here: redis's client is a fifth of a second that reading commands (`tenants list`) never need.
    from gateway.edge.key_events import publish_change

    if not publish_change(args.redis, tenant_id):
        print(
            "warning: could not reach Redis; gateways see the change within their key cache TTL",
            file=sys.stderr,
        )


class _Unset:
    def __repr__(self) -> str:
        return "(unchanged)"


_UNSET: Any = _Unset()


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
        type=cache_group_arg,
        default=_UNSET,
        help="share prefix-cache blocks with the tenants of this group, or none (own blocks only)",
    )


def register(subparsers: Any) -> None:
    """Add the db, tenants and keys subcommands."""
    common = common_options()

    db = subparsers.add_parser("db", help="database schema migrations")
    db_sub = db.add_subparsers(dest="db_action", required=True)
    for action, default in (("upgrade", "head"), ("downgrade", "base"), ("current", "head")):
        p = db_sub.add_parser(
            action,
            parents=[common],
            help={
                "upgrade": "upgrade the schema",
                "downgrade": "downgrade the schema",
                "current": "print the schema's revision",
            }[action],
        )
        if action != "current":
            p.add_argument("revision", nargs="?", default=default)
        else:
            p.set_defaults(revision=default)
        p.set_defaults(func=guarded(cmd_db))

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
        "--redis",
        default=None,
        help="redis:// URL of the gateways: their cached keys go at once (every gateway re-reads the "
        "tenants within --tenant-poll-interval, 1 s by default, and pushes a new weight to its engines)",
    )
    tenants.set_defaults(func=guarded(cmd_tenants))

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
    keys.set_defaults(func=guarded(cmd_keys))
