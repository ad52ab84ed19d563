"""A refused row never blocks the ledger or a restart; no dead gateway's journal is skipped for good;
rows in every past shape of UsageRecord are replayed and stored (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from billing import Database, Ledger, LedgerConfig, UsageRecord
from billing.journal import Journal
from billing.spill import FORMAT_HEADER, encode_row
from tests.billing.test_ledger import make_row, wait_until


def _ledger(db: Database, tmp_path: Path, orphan_scan_s: float = 5.0) -> Ledger:
    return Ledger(
        db,
        LedgerConfig(data_dir=str(tmp_path), flush_interval_s=0.05, orphan_scan_s=orphan_scan_s),
        registry=CollectorRegistry(),
    )


def _stored(db: Database, prefix: str) -> set[str]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT request_id FROM usage WHERE request_id LIKE :p"), {"p": prefix + "%"}
        )
        return {r[0] for r in rows}


def _dead_journal(directory: Path, owner: str, lines: list[str], header: bool = True) -> Path:
    """A journal segment as a killed gateway leaves it: its lock file free, its rows on disk."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{owner}.lock").touch()
    path = directory / f"{owner}.live"
    path.write_text((FORMAT_HEADER if header else "") + "".join(lines), encoding="utf-8")
    return path


def test_a_refused_row_is_quarantined_and_the_start_stores_the_rest(any_db: Database, tmp_path: Path) -> None:
    good = [replace(make_row(i), request_id=f"q-good-{i}") for i in range(5)]
    refused = json.loads(encode_row(replace(make_row(99), request_id="q-refused")))
    refused["model"] = None  # NOT NULL: every dialect refuses it
    too_long = replace(make_row(98), request_id="q-long", task_id="t" * 300)  # refused by PostgreSQL only
    lines = [encode_row(r) for r in good] + [json.dumps(refused) + "\n", encode_row(too_long), "{torn\n"]
    _dead_journal(tmp_path / "ledger.journal", "deadowner", lines)
    ledger = _ledger(any_db, tmp_path)
    ledger.start()  # must not raise
    try:
        assert _stored(any_db, "q-good-") == {r.request_id for r in good}
        expected = 3 if any_db.dialect == "postgresql" else 2  # SQLite ignores varchar lengths
        assert ledger.quarantine.count == expected
        entries = ledger.quarantine.entries()
        assert {e["row"]["request_id"] for e in entries if e["row"]} >= {"q-refused"}
        assert any(e["text"] == "{torn\n" for e in entries)
        assert list((tmp_path / "ledger.journal").glob("deadowner.*")) == []  # replayed, not skipped
        ledger.record(replace(make_row(7), request_id="q-after"))  # the ledger writes on
        assert ledger.flush(10.0)
        assert "q-after" in _stored(any_db, "q-after")
    finally:
        ledger.close()
    again = _ledger(any_db, tmp_path)  # the quarantine survives a restart (the count is on disk)
    assert again.quarantine.count == expected
    again.close()


def test_requeue_stores_a_quarantined_row_once_it_fits(any_db: Database, tmp_path: Path) -> None:
    ledger = _ledger(any_db, tmp_path)
    ledger.quarantine.add(replace(make_row(3), request_id="rq-1"), "refused (test)")
    assert ledger.requeue_quarantined() == (1, 0)
    assert ledger.quarantine.count == 0
    assert _stored(any_db, "rq-") == {"rq-1"}
    ledger.close()


def test_a_live_owners_journal_waits_and_is_replayed_once_it_dies(any_db: Database, tmp_path: Path) -> None:
    directory = tmp_path / "ledger.journal"
    live = Journal(directory)  # another gateway, alive: holds its lock
    rows = [replace(make_row(i), request_id=f"lv-{i}") for i in range(4)]
    for row in rows:
        live.append(encode_row(row).encode())
    ledger = _ledger(any_db, tmp_path, orphan_scan_s=0.1)
    ledger.start()
    try:
        assert _stored(any_db, "lv-") == set()  # left alone while its owner lives
        assert live.path.exists()
        assert live._fd is not None and live._lock_fd is not None
        os.close(live._fd)
        os.close(live._lock_fd)  # the owner dies: the kernel drops its lock
        assert wait_until(lambda: _stored(any_db, "lv-") == {r.request_id for r in rows}, 10.0)
        assert wait_until(lambda: not live.path.exists(), 10.0)
    finally:
        ledger.close()


def test_a_journal_without_its_lock_file_is_replayed(any_db: Database, tmp_path: Path) -> None:
    path = _dead_journal(
        tmp_path / "ledger.journal", "nolock", [encode_row(replace(make_row(1), request_id="nl-1"))]
    )
    (path.parent / "nolock.lock").unlink()
    ledger = _ledger(any_db, tmp_path)
    ledger.start()
    ledger.close()
    assert _stored(any_db, "nl-") == {"nl-1"}


# Every shape a journal or spill row has had. Format 1 (no header line) is UsageRecord as first committed
# (40925ce) and unchanged up to the format header: 22 fields. The older shape lacks preemptions and
# recomputed_tokens. Format 2 adds the header; a future row may carry fields this version does not know.
_FORMAT_1 = [
    "request_id", "tenant_id", "api_key_id", "task_id", "workflow_run_id", "attempt", "model", "status",
    "finish_reason", "cancel_state", "prompt_tokens", "cached_tokens", "completion_tokens", "charged_service",
    "tokens_after_cancel", "preemptions", "recomputed_tokens", "queue_ms", "ttft_ms", "e2e_ms", "created_at",
    "finished_at",
]  # fmt: skip
_SHAPES: dict[str, tuple[list[str], bool, dict[str, object]]] = {
    "before-preemptions": (
        [f for f in _FORMAT_1 if f not in ("preemptions", "recomputed_tokens")],
        False,
        {},
    ),
    "format-1": (_FORMAT_1, False, {}),
    "minimal": (
        [
            "request_id",
            "tenant_id",
            "model",
            "status",
            "prompt_tokens",
            "completion_tokens",
            "created_at",
            "finished_at",
        ],
        False,
        {},
    ),  # fmt: skip
    "format-2": (_FORMAT_1, True, {}),
    "future": (_FORMAT_1, True, {"a_field_from_the_future": 1}),
}


@pytest.mark.parametrize("where", ["journal", "spill"])
def test_rows_of_every_past_shape_are_stored(any_db: Database, tmp_path: Path, where: str) -> None:
    expected: dict[str, UsageRecord] = {}
    for shape, (names, header, extra) in _SHAPES.items():
        row = replace(make_row(len(expected)), request_id=f"shape-{shape}")
        full = json.loads(encode_row(row))
        line = json.dumps({**{n: full[n] for n in names}, **extra}) + "\n"
        if where == "journal":
            _dead_journal(tmp_path / "ledger.journal", f"owner{len(expected)}", [line], header)
        else:
            with (tmp_path / "ledger.spill").open("a") as fh:
                fh.write((FORMAT_HEADER if header else "") + line)
        expected[row.request_id] = row
    ledger = _ledger(any_db, tmp_path)
    ledger.start()
    assert ledger.flush(10.0)
    ledger.close()
    assert ledger.quarantine.count == 0
    assert _stored(any_db, "shape-") == set(expected)
    with any_db.engine.connect() as conn:
        got = conn.execute(
            text(
                "SELECT request_id, preemptions, completion_tokens FROM usage WHERE request_id LIKE 'shape-%'"
            )
        ).all()
    for request_id, preemptions, completion in got:
        names = _SHAPES[request_id.removeprefix("shape-")][0]
        assert preemptions == (expected[request_id].preemptions if "preemptions" in names else 0)
        assert completion == expected[request_id].completion_tokens
