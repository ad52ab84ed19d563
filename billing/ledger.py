"""Write-behind usage ledger: record() journals a row, appends it to a bounded buffer; one thread writes SQL.

Nothing is lost: record() first appends the row to the local journal (billing/journal.py: one write(),
so a kill -9 of the process right after cannot lose it; start() replays what a dead process left). While
the database is unreachable rows stay buffered and the write is retried with exponential backoff; rows
that do not fit the buffer go to an append-only spill file that is replayed once writes succeed again;
close() flushes and spills whatever could not be written in time. Inserts are idempotent (ON CONFLICT DO
NOTHING on (tenant_id, request_id)), so a replay never stores a row twice. A row the database refuses
is quarantined (billing/quarantine.py) and never holds up the others, nor a start.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from sqlalchemy.exc import SQLAlchemyError
from tenacity import RetryCallState, Retrying, wait_random_exponential

from billing.db import Database
from billing.journal import Journal
from billing.ledger_config import LedgerConfig, spill_path
from billing.ledger_metrics import ledger_metrics
from billing.ledger_sql import permanent, write_batch
from billing.quarantine import Quarantine, adopt_rejects, requeue
from billing.records import USAGE_STATUSES, UsageRecord, check_counts
from billing.spill import SpillFile, encode_line, read_batches

log = logging.getLogger(__name__)


class Ledger:
    """The write-behind ledger of usage rows; see the module docstring for its guarantees."""

    def __init__(
        self, db: Database, config: LedgerConfig | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        self.db = db
        self.config = config or LedgerConfig()
        self.metrics = ledger_metrics(registry)
        self.spill = SpillFile(spill_path(db, self.config))
        self.quarantine = Quarantine(self.spill.path.with_suffix(".quarantine"))
        adopt_rejects(self.quarantine, self.spill.path.with_name(self.spill.path.name + ".rejected"))
        self.journal = Journal(self.spill.path.with_suffix(".journal")) if self.config.journal else None
        self._stored = 0  # buffered rows stored in SQL so far: the journal's release marks count these
        self._buffer: deque[UsageRecord] = deque()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flush_wanted = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._replay_files: list[Path] = []
        self._replay_iter: Iterator[tuple[list[UsageRecord], int]] | None = None
        self._replay_batch: tuple[list[UsageRecord], int] | None = None
        # Full-jitter exponential back-off (tenacity's wait strategy; the loop itself is the writer's own,
        # since a failed batch stays buffered and new rows keep arriving while it waits).
        self._wait = wait_random_exponential(multiplier=0.05, max=self.config.max_backoff_s)
        self._failures = 0
        self._last_journal_warning = 0.0
        self._last_warning = 0.0
        self.metrics.buffer_depth.set_function(lambda: len(self._buffer))
        self.metrics.spill_pending.set_function(lambda: self.spill.pending_rows)
        self.metrics.quarantined.set_function(lambda: self.quarantine.count)
        self._orphans_at = time.monotonic()

    # -- request path ------------------------------------------------------------------------------

    def record(self, row: UsageRecord) -> None:
        """Queue one ended request for writing; never blocks on SQL and never raises on a database outage."""
        if row.status not in USAGE_STATUSES:
            raise ValueError(f"usage status must be one of {sorted(USAGE_STATUSES)}, got {row.status!r}")
        try:
            check_counts(row)
        except ValueError as exc:  # a negative count is a bug upstream: kept for an operator, never billed
            self.quarantine.add(row, str(exc))
            return
        line = encode_line(row) if self.journal is not None else None
        with self._lock:
            closed = self._closed
            if line is not None and not closed:
                self._journal(line)
            if not closed and len(self._buffer) < self.config.buffer_size:
                self._buffer.append(row)
                if len(self._buffer) == self.config.batch_size:
                    self._wake.set()
                return
            # Spilled under the lock, so the writer's journal trim (also under it) sees it in the spill file.
            self.spill.append([row])
        self.metrics.spilled_rows.inc()
        if closed:  # no writer thread will sync it any more
            self.spill.sync()

    def _journal(self, line: bytes) -> None:
        """Append to the journal; a failing disk must not cost the row its place in the buffer."""
        assert self.journal is not None  # record() makes a line only when there is a journal
        try:
            self.journal.append(line)
        except OSError as exc:
            self.metrics.journal_errors.inc()
            now = time.monotonic()
            if now - self._last_journal_warning > 5.0:
                self._last_journal_warning = now
                log.error(
                    "ledger journal write failed (rows are buffered, but a kill -9 now would lose them): %s",
                    exc,
                )

    @property
    def depth(self) -> int:
        """Rows in the in-memory buffer (including the batch being written)."""
        return len(self._buffer)

    @property
    def pending(self) -> int:
        """Rows not yet stored: buffered plus spilled."""
        return len(self._buffer) + self.spill.pending_rows

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Replay the journals dead processes left into SQL, then start the writer thread (idempotent).

        The replay is synchronous so that a gateway serves only once every row it answered before it died
        is stored. A row the database refuses is quarantined and the replay goes on; it raises only when the
        database cannot be reached (the caller must not serve then, and the journal stays for the next start).
        Spill files left by a previous run are replayed by the writer thread.
        """
        if self._thread is None:
            self._replay_journal()
            self._thread = threading.Thread(target=self._run, name="fairserve-ledger", daemon=True)
            self._thread.start()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Write everything buffered and spilled now; True when all of it is stored within the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            self._flush_wanted = True
            self._wake.set()
            while self.pending:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._idle.wait(min(left, 0.05))
            return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush for up to timeout_s, stop the writer, spill whatever is still buffered."""
        if self._thread is not None:
            self.flush(timeout_s)
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=max(1.0, self.config.max_backoff_s + 1.0))
        with self._lock:
            self._closed = True
            leftover = list(self._buffer)
            self._buffer.clear()
        if leftover:
            log.warning(
                "ledger closing with %d unwritten rows; spilled to %s", len(leftover), self.spill.path
            )
            self.spill.append(leftover)
            self.metrics.spilled_rows.inc(len(leftover))
        self.spill.close()
        if self.journal is not None:  # every row is now in SQL or in the fsynced spill file
            self.journal.discard()

    # -- journal -----------------------------------------------------------------------------------

    def _replay_journal(self) -> None:
        """Store every row of dead owners' journals (refused ones quarantined), then delete the files."""
        if self.journal is None:
            return
        try:
            for path in self.journal.leftovers():
                stored = 0
                for rows, _lines in read_batches(path, self.config.batch_size, self._quarantine_line):
                    if rows:
                        stored += self._store_now(rows)
                self.metrics.replayed_rows.inc(stored)
                log.info("replayed ledger journal %s: %d rows were missing from SQL", path, stored)
                path.unlink(missing_ok=True)
        except BaseException:
            self.journal.keep_leftovers()  # not deleted: the next scan or start replays them
            raise
        self.journal.forget_leftovers()

    def _adopt_orphans(self) -> None:
        """From the writer thread: replay journals whose owner died since the last scan (none is skipped
        for good); a database outage leaves them for the next scan."""
        self._orphans_at = time.monotonic()
        try:
            self._replay_journal()
        except SQLAlchemyError as exc:
            log.warning("could not replay a dead gateway's journal yet: %s", str(exc).splitlines()[0])

    def _store_now(self, rows: list[UsageRecord]) -> int:
        """Store rows synchronously, quarantining refused ones; raises when the database is unreachable."""
        try:
            inserted = write_batch(self.db.engine, rows)
        except SQLAlchemyError as exc:
            if not permanent(exc):
                raise
            inserted, _ = self._write_one_by_one(rows)
        self.metrics.written_rows.inc(inserted)
        return inserted

    def _quarantine_line(self, line: str, reason: str) -> None:
        """A journal or spill line that does not decode: kept in quarantine (as text), never dropped."""
        self.quarantine.add_text(line, reason)
        self.metrics.rejected_rows.inc()

    def requeue_quarantined(self) -> tuple[int, int]:
        """Try every quarantined row again (after the schema or the row was fixed): (stored, still refused)."""
        return requeue(self.quarantine, self.db.engine)

    def _trim_journal(self) -> None:
        """Fsync the live segment, close it when large (or when nothing is buffered), delete stored segments."""
        journal = self.journal
        if journal is None:
            return
        journal.fsync()
        closed = None
        with self._lock:
            if not self._buffer or journal.live_bytes >= self.config.journal_segment_bytes:
                closed = journal.rotate(mark=self._stored + len(self._buffer))
            stored = self._stored
            self.spill.sync()  # spilled rows of the closed segments reach the OS before the segments go
        journal.seal(closed)
        journal.release(stored)

    # -- writer thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._run_loop()
            except Exception:  # a bug here must not silently stop billing: log, back off, go on
                log.exception("ledger writer failed; restarting")
                self._sleep_backoff()

    def _run_loop(self) -> None:
        last_write = time.monotonic()
        while not self._stop.is_set():
            self._wake.clear()
            with self._lock:
                buffered = len(self._buffer)
                batch = list(itertools.islice(self._buffer, self.config.batch_size))
                urgent = self._flush_wanted
            due = (
                buffered >= self.config.batch_size
                or urgent
                or time.monotonic() - last_write >= self.config.flush_interval_s
            )
            if batch and due:
                if self._write(batch):
                    with self._idle:
                        for _ in batch:
                            if self._buffer:  # close() may have spilled the buffer after a join timeout
                                self._buffer.popleft()
                                self._stored += 1
                        self._idle.notify_all()
                    self._trim_journal()
                    last_write = time.monotonic()
                    continue
            elif self.spill.pending_rows and (not batch or due):
                if self._replay_step():
                    continue
            else:
                with self._idle:
                    if not self.pending:
                        self._flush_wanted = False
                    self._idle.notify_all()
                self.spill.sync()
                self._trim_journal()
                if time.monotonic() - self._orphans_at >= self.config.orphan_scan_s:
                    self._adopt_orphans()
                self._wake.wait(self.config.flush_interval_s)
                continue
            self._sleep_backoff()

    def _sleep_backoff(self) -> None:
        self._failures += 1
        attempt = RetryCallState(Retrying(), None, (), {})
        attempt.attempt_number = self._failures
        delay = max(0.01, self._wait(attempt))
        self.spill.sync()
        if self.journal is not None:
            self.journal.fsync()
        self._stop.wait(delay)

    def _write(self, rows: list[UsageRecord], replay: bool = False) -> bool:
        """Store one batch; False (after counting a retry) when it must be retried later."""
        started = time.perf_counter()
        rejected = 0
        try:
            inserted = write_batch(self.db.engine, rows)
        except SQLAlchemyError as exc:
            self.metrics.flush_seconds.observe(time.perf_counter() - started)
            if not permanent(exc):
                self.metrics.retries.inc()
                now = time.monotonic()
                if now - self._last_warning > 5.0:
                    self._last_warning = now
                    log.warning(
                        "ledger write failed (%d rows buffered, %d spilled), retrying: %s",
                        len(self._buffer),
                        self.spill.pending_rows,
                        str(exc).splitlines()[0],
                    )
                return False
            try:
                inserted, rejected = self._write_one_by_one(rows)
            except SQLAlchemyError:
                self.metrics.retries.inc()
                return False
        else:
            self.metrics.flush_seconds.observe(time.perf_counter() - started)
        self._failures = 0
        self.metrics.written_rows.inc(inserted)
        self.metrics.duplicate_rows.inc(max(0, len(rows) - inserted - rejected))
        if replay:
            self.metrics.replayed_rows.inc(inserted)
        return True

    def _write_one_by_one(self, rows: list[UsageRecord]) -> tuple[int, int]:
        """Quarantine the rows the database refuses, store the others; returns (inserted, quarantined)."""
        inserted = rejected = 0
        for row in rows:
            try:
                inserted += write_batch(self.db.engine, [row])
            except SQLAlchemyError as exc:
                if not permanent(exc):
                    raise
                self.quarantine.add(row, str(exc).splitlines()[0])
                rejected += 1
        self.metrics.rejected_rows.inc(rejected)
        return inserted, rejected

    def _replay_step(self) -> bool:
        """Store the next batch of spilled rows; False when the write must be retried."""
        if self._replay_batch is None and not self._next_replay_batch():
            self._replay_files = self.spill.rotate()
            if not self._next_replay_batch():
                self.spill.mark_replayed(self.spill.pending_rows)  # nothing on disk: resync a drifted count
                return True
        assert self._replay_batch is not None
        rows, lines = self._replay_batch
        if rows and not self._write(rows, replay=True):
            return False
        self.spill.mark_replayed(lines)
        self._replay_batch = None
        # Look ahead now so a fully replayed file is deleted before close() can stop the thread.
        self._next_replay_batch()
        if not self.spill.pending_rows:
            with self._idle:
                self._idle.notify_all()
        return True

    def _next_replay_batch(self) -> bool:
        """Load the next batch from the replay files, deleting each file once it is exhausted."""
        while True:
            if self._replay_iter is None:
                if not self._replay_files:
                    return False
                self._replay_iter = read_batches(
                    self._replay_files[0], self.config.batch_size, self._quarantine_line
                )
            nxt = next(self._replay_iter, None)
            if nxt is not None:
                self._replay_batch = nxt
                return True
            done = self._replay_files.pop(0)
            done.unlink(missing_ok=True)
            self._replay_iter = None
            log.info("replayed spill file %s", done)
