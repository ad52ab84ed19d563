"""`fairserve serve` with a refused row in a dead gateway's journal starts, stores the rest and reports
`ledger: degraded`; a start that fails exits non-zero instead of hanging alive without listening."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from billing import Database, default_db_url
from billing.spill import FORMAT_HEADER, encode_row
from tests.billing.conftest import pg_url  # noqa: F401  (the fixture, for the PostgreSQL runs)
from tests.billing.test_ledger import make_row
from tests.gateway.serve_process import ServeProcess


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_refused_journal_row_is_quarantined_and_the_gateway_serves(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    db_url = request.getfixturevalue("pg_url") if backend == "postgresql" else default_db_url(tmp_path)
    tag = uuid.uuid4().hex[:8]
    good = replace(make_row(1), request_id=f"start-{tag}-good")
    refused = json.loads(encode_row(replace(make_row(2), request_id=f"start-{tag}-refused")))
    refused["model"] = None  # NOT NULL: refused on every dialect, as a too-long id is on PostgreSQL
    journal = tmp_path / "ledger.journal"
    journal.mkdir()
    (journal / "killed.lock").touch()
    (journal / "killed.live").write_text(FORMAT_HEADER + encode_row(good) + json.dumps(refused) + "\n")
    serve = ServeProcess(tmp_path, "--db", db_url)
    try:
        with httpx.Client(base_url=serve.url, timeout=30) as c:
            ready = c.get("/readyz").json()
            assert ready["ready"] and ready["ledger"] == "degraded" and "ledger" in ready["degraded"]
            admin = {"Authorization": f"Bearer {serve.banner['admin_token']}"}
            listed = c.get("/admin/api/ledger/quarantine", headers=admin).json()
            assert listed["count"] == 1 and listed["rows"][0]["row"]["request_id"] == refused["request_id"]
            metrics = c.get("/metrics", headers=admin).text
            assert "fairserve_ledger_quarantined_rows 1.0" in metrics
    finally:
        serve.stop()
    db = Database(db_url)
    with db.engine.connect() as conn:
        ids = {
            r[0]
            for r in conn.execute(
                text("SELECT request_id FROM usage WHERE request_id LIKE :p"), {"p": f"start-{tag}%"}
            )
        }
    db.dispose()
    assert ids == {good.request_id}


def test_a_failed_start_exits_non_zero(tmp_path: Path) -> None:
    (tmp_path / "ledger.journal").write_text("not a directory")  # the ledger cannot open its journal
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--data-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "url: " not in proc.stdout  # it never listened
