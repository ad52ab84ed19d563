"""Quarantine of usage rows the database refuses: one file per row, listed by the admin API.

A row the database refuses as invalid (a value too long for its column, say) can never be stored by
retrying, and must not hold up the rows behind it nor a restart. So it is written, with the database's
reason, to its own file in `<data-dir>/ledger.quarantine/` and the ledger moves on. The count is a metric
and makes `/readyz` report `ledger: degraded`; an operator fixes the cause and requeues them
(`POST /admin/api/ledger/quarantine/requeue`) or deletes the file. Files name their format version like the journal's.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from billing.ledger_sql import permanent, write_batch
from billing.records import UsageRecord
from billing.spill import FORMAT_VERSION, decode_row, encode_row

log = logging.getLogger(__name__)


class Quarantine:
    """The directory of quarantined rows; thread-safe, survives restarts (the count is read from disk)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._count = len(self.files())

    def files(self) -> list[Path]:
        """Quarantined row files, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob("*.json"))

    @property
    def count(self) -> int:
        """Rows in quarantine."""
        return self._count

    def add(self, row: UsageRecord, reason: str) -> Path:
        """Write one refused row to its own file (fsynced: the journal segment holding it is then deleted)."""
        path = self._write({"format": FORMAT_VERSION, "reason": reason, "row": json.loads(encode_row(row))})
        log.error("ledger row %s/%s quarantined in %s: %s", row.tenant_id, row.request_id, path, reason)
        return path

    def add_text(self, line: str, reason: str) -> Path:
        """Keep a journal or spill line that does not decode, as it was read."""
        path = self._write({"format": FORMAT_VERSION, "reason": reason, "row": None, "text": line})
        log.error("unreadable ledger line quarantined in %s: %s", path, reason)
        return path

    def _write(self, doc: dict[str, Any]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            path = self.directory / f"{time.time_ns():020d}-{os.getpid()}.json"
            tmp = path.with_suffix(".tmp")
            with tmp.open("w", encoding="utf-8") as fh:
                fh.write(json.dumps(doc))
                fh.flush()
                os.fsync(fh.fileno())
            tmp.rename(path)
            self._count += 1
        return path

    def entries(self, limit: int = 100) -> list[dict[str, Any]]:
        """The first `limit` quarantined rows: file name, the database's reason and the row itself."""
        found: list[dict[str, Any]] = []
        for path in self.files()[:limit]:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                found.append({"file": path.name, "reason": f"unreadable: {exc}", "row": None})
                continue
            found.append(
                {
                    "file": path.name,
                    "reason": doc.get("reason"),
                    "row": doc.get("row"),
                    "text": doc.get("text"),
                }
            )
        return found

    def rows(self) -> list[tuple[Path, UsageRecord]]:
        """Every quarantined row that still decodes, with its file (for requeueing once the cause is fixed)."""
        out: list[tuple[Path, UsageRecord]] = []
        for path in self.files():
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                out.append((path, decode_row(json.dumps(doc["row"]))))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # unreadable text: only an operator can say what it was
        return out

    def remove(self, path: Path) -> None:
        """Forget one quarantined row (stored after all, or dropped by an operator)."""
        with self._lock:
            if path.exists():
                path.unlink()
                self._count = max(0, self._count - 1)


def adopt_rejects(quarantine: Quarantine, path: Path) -> None:
    """Move the rows of an older version's `<spill>.rejected` file into the quarantine."""
    if not path.exists():
        return
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip():
            try:
                quarantine.add(decode_row(line), "refused by the database (from the rejects file)")
            except (ValueError, KeyError, TypeError) as exc:
                quarantine.add_text(line, f"rejects file line does not decode: {exc}")
    path.unlink()


def requeue(quarantine: Quarantine, engine: Engine) -> tuple[int, int]:
    """Store every quarantined row the database now accepts: (stored, still refused)."""
    stored = refused = 0
    for path, row in quarantine.rows():
        try:
            stored += write_batch(engine, [row])
        except SQLAlchemyError as exc:
            if not permanent(exc):
                raise
            refused += 1
            continue
        quarantine.remove(path)  # stored now, or already stored (a duplicate)
    return stored, refused
