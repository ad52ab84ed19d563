"""Rows written into the `usage` table as an older revision has it (the migration tests downgrade first)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, MetaData, Table, insert


def insert_as_stored(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert `rows` into `usage` with only the columns the database has now: today's model would also
    write the columns a later migration adds (with their defaults), which the downgraded table lacks."""
    usage = Table("usage", MetaData(), autoload_with=conn)
    names = set(usage.columns.keys())
    conn.execute(insert(usage), [{k: v for k, v in row.items() if k in names} for row in rows])
