"""Task and workflow-run reports read the ledger's rollup (usage_scope_totals): the same report as the rows say,
rows stored before migrations 0009 and 0014 included, by a key that begins with the tenant; a new attempt
written by two writers at once is counted once."""

from __future__ import annotations

import random
import re
import threading
from dataclasses import asdict, replace

from sqlalchemy import text

from billing import BillingStore, Database
from billing.ledger_sql import insert_batch, write_batch
from billing.models import Base
from billing.records import UsageRecord
from billing.tasks import INFEASIBLE, TaskReport, report_query
from tests.billing.old_schema import insert_as_stored
from tests.billing.test_ledger import make_row
from tests.gateway.conftest import wait_for

OUTCOMES: tuple[tuple[str, str | None], ...] = (
    ("completed", "stop"),
    ("cancelled", "cancelled"),
    ("deadline", "deadline"),
    ("rejected", INFEASIBLE),
    ("rejected", "rate_limited"),
    ("error", "error"),
    ("interrupted", None),
)


def _rows(seed: int, n: int = 400) -> list[UsageRecord]:
    """Rows of three tenants over a few tasks and runs, with attempts and every outcome; the same task
    and run ids under several tenants."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        status, reason = rng.choice(OUTCOMES)
        row = make_row(i)
        rows.append(
            replace(
                row,
                task_id=rng.choice([None, "task-a", "task-b", "task-c"]),
                workflow_run_id=rng.choice([None, "run-a", "run-b"]),
                attempt=rng.randrange(4),
                status=status,
                finish_reason=reason,
                tokens_after_cancel=rng.randrange(5) if status == "cancelled" else 0,
            )
        )
    return rows


def expected_report(rows: list[UsageRecord], tenant: str, kind: str, scope: str) -> TaskReport | None:
    """The report as the old query computed it, over the rows themselves."""
    mine = [
        r
        for r in rows
        if r.tenant_id == tenant and (r.task_id if kind == "task" else r.workflow_run_id) == scope
    ]
    if not mine:
        return None

    def tokens(r: UsageRecord) -> int:
        return r.prompt_tokens - r.cached_tokens + r.completion_tokens

    completed = [r for r in mine if r.status == "completed"]
    kept = max((r.attempt for r in completed), default=None)
    return TaskReport(
        attempts=len({r.attempt for r in mine}),
        requests=len(mine),
        completed=len(completed),
        cancelled=sum(r.status == "cancelled" for r in mine),
        deadline=sum(r.status == "deadline" for r in mine),
        rejected_infeasible=sum(r.status == "rejected" and r.finish_reason == INFEASIBLE for r in mine),
        engine_tokens=sum(map(tokens, mine)),
        tokens_after_cancel=sum(r.tokens_after_cancel for r in mine),
        cancelled_tokens=sum(tokens(r) for r in mine if r.status == "cancelled"),
        replaced_tokens=sum(tokens(r) for r in completed if kept is not None and r.attempt < kept),
    )


def _check_every_report(db: Database, rows: list[UsageRecord]) -> int:
    store, checked = BillingStore(db), 0
    for tenant in ("t0", "t1", "t2", "t9"):
        for scope in ("task-a", "task-b", "task-c", "task-z"):
            assert store.task_report(tenant, task_id=scope) == expected_report(rows, tenant, "task", scope)
            checked += 1
        for scope in ("run-a", "run-b", "run-z"):
            assert store.task_report(tenant, workflow_run_id=scope) == expected_report(
                rows, tenant, "run", scope
            )
            checked += 1
    return checked


def test_reports_from_the_rollup_match_the_rows_through_replays(any_db: Database) -> None:
    rows = _rows(seed=45)
    assert write_batch(any_db.engine, rows[:150]) == 150  # the all-new path
    assert write_batch(any_db.engine, rows[100:300] + [rows[200]]) == 150  # the exact path: replays
    assert write_batch(any_db.engine, rows) == 100
    assert write_batch(any_db.engine, rows) == 0  # a whole replay adds nothing
    assert _check_every_report(any_db, rows) == 28
    assert expected_report(rows, "t0", "task", "task-a") is not None  # the comparison saw real reports


def test_rows_stored_before_the_migration_are_rolled_up_by_it(any_db: Database) -> None:
    rows = _rows(seed=7, n=200)
    any_db.downgrade("0008_public_prefixes")
    with any_db.engine.begin() as conn:
        insert_as_stored(conn, [asdict(r) for r in rows])
    any_db.upgrade()
    _check_every_report(any_db, rows)
    later = [replace(r, request_id=f"later-{r.request_id}") for r in rows[:50]]
    write_batch(any_db.engine, later)  # the ledger adds to what the migration rolled up
    _check_every_report(any_db, rows + later)


def test_a_report_reads_a_key_range_that_begins_with_the_tenant(any_db: Database) -> None:
    """Timing-free: the plan of the report's query searches the rollup's primary key with the tenant as
    its first column, so another tenant's id is looked up exactly as an unknown id is."""
    write_batch(any_db.engine, _rows(seed=1))
    query = report_query("t1", "task", "task-a")
    compiled = query.compile(any_db.engine, compile_kwargs={"literal_binds": True})
    with any_db.engine.connect() as conn:
        if any_db.engine.dialect.name == "sqlite":
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}"))
            assert re.search(
                r"SEARCH usage_scope_totals USING INDEX \S+ \(tenant_id=\? AND kind=\? AND scope_id=\?\)",
                plan,
            ), plan
        else:
            conn.execute(text("SET LOCAL enable_seqscan = off"))  # a tiny table: ask which index it uses
            plan = " ".join(str(r[0]) for r in conn.exec_driver_sql(f"EXPLAIN {compiled}"))
            assert (
                "usage_scope_totals_pkey" in plan and "Index Cond: (((tenant_id)::text = 't1'::text)" in plan
            ), plan
    usage_indexes = {str(i.name): [c.name for c in i.columns] for i in Base.metadata.tables["usage"].indexes}
    assert usage_indexes["ix_usage_tenant_task"] == ["tenant_id", "task_id"]
    assert all(columns[0] == "tenant_id" for columns in usage_indexes.values()), usage_indexes


def test_two_writers_count_a_new_attempt_once(pg_db: Database) -> None:
    """Two replicas storing rows of the same new attempt at once: the second writer's attempt insert
    waits on the first's uncommitted one (seen in pg_stat_activity, not timed), then conflicts, so the
    attempt is counted once and the report matches the rows."""
    first, second = (
        replace(make_row(i), request_id=f"writer-{i}", tenant_id="t1", task_id="raced", attempt=7)
        for i in (1, 2)
    )
    done: list[int] = []
    with pg_db.engine.connect() as conn:
        transaction = conn.begin()
        insert_batch(conn, [first])
        writer = threading.Thread(target=lambda: done.append(write_batch(pg_db.engine, [second])))
        writer.start()
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'INSERT INTO usage_scope_attempts%' AND datname = current_database()"
        )

        def blocked() -> bool:  # a connection each time: pg_stat_activity is read once per transaction
            with pg_db.engine.connect() as watch:
                return bool(watch.execute(waiting).scalar_one() == 1)

        wait_for(blocked, 30, "the second writer to wait")
        transaction.commit()
        writer.join(30)
    assert done == [1]
    report = BillingStore(pg_db).task_report("t1", task_id="raced")
    assert report == expected_report([first, second], "t1", "task", "raced")
    assert report is not None and report.attempts == 1 and report.requests == 2
