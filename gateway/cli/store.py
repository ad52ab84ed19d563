"""The billing store the `db|tenants|keys|usage` commands work on, opened as `fairserve serve` opens it, and
running a command against it with known errors as one line on stderr."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from billing import BillingError, BillingStore, Database, KeyNotFound, TenantExists, TenantNotFound
from gateway.settings_base import DEFAULT_DATA_DIR, StorageSettings


def common_options() -> argparse.ArgumentParser:
    """The parent parser of every billing command: where the database is, --json and --actor."""
    common = argparse.ArgumentParser(add_help=False)
    _db_options(common)
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument("--actor", default="cli", help="who is making the change (audit log)")
    return common


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


def open_database(args: argparse.Namespace) -> Database:
    return Database(_storage(args).database_url())


def open_store(args: argparse.Namespace, need_tenants: bool = True) -> BillingStore:
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
    if not db.at_head():  # an older schema moves to head, as the server does on start
        db.upgrade()
    store = BillingStore(db)
    if need_tenants and not store.list_tenants():
        raise ValueError(
            f"{where} has no tenants: is it the one `fairserve serve` uses "
            "(--data-dir / --db, FAIRSERVE_DATA_DIR / FAIRSERVE_DB_URL)? "
            "Add one with `fairserve tenants add NAME`"
        )
    return store


def guarded(func: Any) -> Any:
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
