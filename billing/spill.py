"""Append-only spill file for ledger rows that do not fit the buffer (JSON lines), and its replay.

Appends go to `<path>`; replay first renames it to `<path>.replay-<ns>` so new overflow keeps flowing
into a fresh file, then reads the renamed file batch by batch and deletes it once every row is stored.
Files left by a crash are replayed on the next start; idempotent inserts make a second replay harmless.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import msgspec

from billing.records import USAGE_DEFAULTS, UsageRecord, check_counts

log = logging.getLogger(__name__)

_FIELDS = tuple(f.name for f in fields(UsageRecord))
_DATETIME_FIELDS = ("created_at", "finished_at")
# The row format a journal segment, spill file or quarantined row is written in. Each file begins with
# FORMAT_HEADER; a file without one is format 1 (before the header existed: the same JSON rows).
# Readers take every version: fields a row lacks get USAGE_DEFAULTS, fields they do not know are ignored.
FORMAT_VERSION = 2
_HEADER_KEY = "fairserve_ledger_format"
FORMAT_HEADER = json.dumps({_HEADER_KEY: FORMAT_VERSION}, separators=(",", ":")) + "\n"

# msgspec encodes the dataclass itself, in C: its fields in order, datetimes as RFC 3339 (UTC as `Z`, which
# `datetime.fromisoformat` reads back), non-ASCII text as UTF-8 rather than escaped.
_ENCODER = msgspec.json.Encoder()


def encode_line(row: UsageRecord) -> bytes:
    """One JSON line for a usage row, as bytes: the journal's per-request encode, on the event loop."""
    return _ENCODER.encode(row) + b"\n"


def encode_row(row: UsageRecord) -> str:
    """`encode_line` as text (the spill file and the quarantine take text)."""
    return (_ENCODER.encode(row) + b"\n").decode()


def decode_row(line: str) -> UsageRecord:
    """The usage row of one JSON line of any format version: missing fields with a default get it,
    unknown fields are ignored; raises ValueError (or KeyError/TypeError) on a torn or foreign line."""
    doc = json.loads(line)
    if not isinstance(doc, dict):
        raise ValueError("a usage row is a JSON object")
    values: dict[str, Any] = {}
    for name in _FIELDS:
        if name in doc:
            values[name] = doc[name]
        elif name in USAGE_DEFAULTS:
            values[name] = USAGE_DEFAULTS[name]
        else:
            raise KeyError(f"usage row lacks {name!r}, which has no default")
    for name in _DATETIME_FIELDS:
        values[name] = datetime.fromisoformat(values[name])
    row = UsageRecord(**values)
    check_counts(row)  # a negative count is quarantined, never stored
    return row


def is_header(line: str) -> bool:
    """True for a file's format line (FORMAT_HEADER of any version), which holds no row."""
    return line.startswith('{"' + _HEADER_KEY + '"')


class SpillFile:
    """The spill file of one ledger: thread-safe appends, rotation for replay, pending-row accounting."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._handle: IO[str] | None = None
        self.pending_rows = sum(self._count_lines(p) for p in self._existing_files())

    @staticmethod
    def _count_lines(path: Path) -> int:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            return sum(1 for line in fh if not is_header(line))

    def _existing_files(self) -> list[Path]:
        replays = sorted(self.path.parent.glob(self.path.name + ".replay-*"))
        return replays + ([self.path] if self.path.exists() else [])

    def append(self, rows: list[UsageRecord]) -> None:
        """Append rows; buffered in the process until sync() (called by the flusher and on close)."""
        if not rows:
            return
        text = "".join(encode_row(r) for r in rows)
        with self._lock:
            if self._handle is None:
                self._handle = self.path.open("a", encoding="utf-8")
                if self._handle.tell() == 0:
                    self._handle.write(FORMAT_HEADER)
            self._handle.write(text)
            self.pending_rows += len(rows)

    def sync(self, fsync: bool = False) -> None:
        """Push appended rows to the OS (and to disk with fsync=True)."""
        with self._lock:
            if self._handle is not None:
                self._handle.flush()
                if fsync:
                    os.fsync(self._handle.fileno())

    def close(self) -> None:
        """Flush to disk and close the append handle."""
        with self._lock:
            if self._handle is not None:
                self._handle.flush()
                os.fsync(self._handle.fileno())
                self._handle.close()
                self._handle = None

    def rotate(self) -> list[Path]:
        """Move the live file aside for replay; returns every file waiting for replay, oldest first."""
        with self._lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
            if self.path.exists() and self.path.stat().st_size > 0:
                self.path.rename(self.path.with_name(f"{self.path.name}.replay-{time.time_ns():020d}"))
            return sorted(self.path.parent.glob(self.path.name + ".replay-*"))

    def mark_replayed(self, count: int) -> None:
        """Account for rows of a replay file that are now stored."""
        with self._lock:
            self.pending_rows = max(0, self.pending_rows - count)


def read_batches(
    path: Path, batch_size: int, unreadable: Callable[[str, str], None] | None = None
) -> Iterator[tuple[list[UsageRecord], int]]:
    """(rows, row lines consumed) batches of a journal or spill file of any format version.

    A line that does not decode (torn by an OS crash, or foreign) goes to `unreadable(line, reason)` (the
    ledger quarantines it), else it is logged; either way it is never silently dropped from the count.
    """
    batch: list[UsageRecord] = []
    lines = 0
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if is_header(line):
                continue
            lines += 1
            try:
                batch.append(decode_row(line))
            except (ValueError, KeyError, TypeError) as exc:
                reason = f"line {number} of {path.name} does not decode: {exc}"
                if unreadable is None:
                    log.error("skipping %s", reason)
                else:
                    unreadable(line, reason)
            if len(batch) >= batch_size:
                yield batch, lines
                batch, lines = [], 0
    if batch or lines:
        yield batch, lines
