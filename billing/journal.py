"""The ledger's local journal: every usage row is appended here (one write()) before its reply ends.

Why a journal: the ledger writes SQL behind the request (batches every `flush_interval_s`), so a kill -9
of the gateway would lose the rows still in memory. With the journal a row is in the kernel's page cache
the moment `Ledger.record()` returns, which survives the death of the process; `fsync()` is batched on
the ledger's writer thread (once per write-loop pass, at most `flush_interval_s` apart), so an OS crash or
power loss can lose at most that interval. The next start replays every journal file into SQL before the
gateway serves; inserts are idempotent on (tenant_id, request_id), so replaying rows that did reach SQL
is harmless.

Files, in the directory `<path>`: each process has an owner id and holds an flock on `<owner>.lock` for its
life, so several gateways may share one data dir; a start replays only the files of owners whose lock is
free (dead) or whose lock file is gone, at start and again every `orphan_scan_s` from the writer thread,
so a journal skipped because its owner was alive is replayed once that owner dies. Per owner: the live
segment `<owner>.live` and closed segments `<owner>.<ns>`, each beginning with the row format's header.
The writer thread closes the live segment (`rotate`) with a mark: the count of buffered rows that must be stored before the segment's rows
are all safe. `release(stored)` deletes closed segments whose mark is reached. Rows the ledger spilled
instead of buffering are safe once the spill file is flushed to the OS, which the ledger does under its
lock when it rotates. Plain os.write on an O_APPEND descriptor rather than a buffered file object: a
buffered object would hold the line in this process until it flushes, exactly what a kill -9 loses.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from pathlib import Path

from billing.spill import FORMAT_HEADER

log = logging.getLogger(__name__)
_HEADER = FORMAT_HEADER.encode()


class Journal:
    """Append-only, segment-rotated journal of encoded usage rows (JSON lines, as the spill file)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.owner = uuid.uuid4().hex
        self._lock_fd = _locked(self.directory / f"{self.owner}.lock", wait=True)
        self.path = self.directory / f"{self.owner}.live"
        self._fd: int | None = None
        self._bytes = 0  # written to the live segment
        self._unsynced = False
        self._closed: list[tuple[Path, int]] = []  # (segment, mark), oldest first
        self._dead: list[tuple[Path, int]] = []  # (lock file, fd) of dead owners whose files are replayed

    def files(self) -> list[Path]:
        """This process's journal files (closed segments oldest first, then the live one)."""
        return self._owner_files(self.owner)

    def _owner_files(self, owner: str) -> list[Path]:
        closed = sorted(p for p in self.directory.glob(f"{owner}.*") if p.suffix not in (".lock", ".live"))
        live = self.directory / f"{owner}.live"
        return closed + ([live] if live.exists() else [])

    def leftovers(self) -> list[Path]:
        """Journal files of dead owners (their lock is free, or their lock file is gone), oldest first.

        Their locks stay held by this process until `forget_leftovers()` (files replayed and deleted) or
        `keep_leftovers()` (replay failed: the next scan takes them again), so two gateways never replay and
        delete the same files at once. A lock whose owner left no files is let go, never deleted: its owner
        may be a gateway that has just created it and is about to take it.
        """
        found: list[Path] = []
        owners = {p.name.split(".", 1)[0] for p in self.directory.iterdir() if "." in p.name}
        for owner in sorted(owners - {self.owner}):
            lock = self.directory / f"{owner}.lock"
            fd = _locked(lock, wait=False)
            if fd is None:
                continue  # a live gateway's journal
            files = self._owner_files(owner)
            if not files:
                os.close(fd)
                continue
            self._dead.append((lock, fd))
            found += files
        return found

    def forget_leftovers(self) -> None:
        """Drop the locks of dead owners whose files were replayed (and deleted by the caller)."""
        for lock, fd in self._dead:
            lock.unlink(missing_ok=True)
            os.close(fd)
        self._dead.clear()

    def keep_leftovers(self) -> None:
        """Let go of dead owners' locks without deleting them: their files are replayed by a later scan."""
        for _lock, fd in self._dead:
            os.close(fd)
        self._dead.clear()

    def append(self, line: bytes) -> None:
        """Append one encoded row with a single write() (the caller serialises appends)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if self._bytes == 0 and os.fstat(self._fd).st_size == 0:
                os.write(self._fd, _HEADER)  # each segment names its row format (billing/spill.py)
        size = len(line)
        written = os.write(self._fd, line)
        if written < size:  # a regular file takes the whole line in one call; this only guards a short write
            view = memoryview(line)[written:]
            while view:
                view = view[os.write(self._fd, view) :]
        self._bytes += size
        self._unsynced = True

    @property
    def live_bytes(self) -> int:
        """Bytes in the live segment."""
        return self._bytes

    def fsync(self) -> None:
        """Push the live segment to disk (batched: the writer thread calls it once per pass)."""
        fd = self._fd
        if fd is not None and self._unsynced:
            self._unsynced = False
            with contextlib.suppress(OSError):  # closed by a concurrent rotate(), whose own fsync covered it
                os.fsync(fd)

    def rotate(self, mark: int) -> int | None:
        """Close the live segment for appends; it may be deleted once `mark` buffered rows are stored.

        Returns the segment's descriptor for `seal()`, which the caller runs outside its lock: the fsync
        must not hold up record() on the event loop.
        """
        if self._fd is None or self._bytes == 0:
            return None
        fd, self._fd = self._fd, None
        closed = self.path.with_name(f"{self.path.name[: -len('.live')]}.{time.time_ns():020d}")
        self.path.rename(closed)
        self._closed.append((closed, mark))
        self._bytes = 0
        self._unsynced = False
        return fd

    @staticmethod
    def seal(fd: int | None) -> None:
        """Fsync and close a segment `rotate()` closed."""
        if fd is not None:
            os.fsync(fd)
            os.close(fd)

    def release(self, stored: int) -> None:
        """Delete the closed segments whose rows are all stored (their mark <= `stored`)."""
        while self._closed and self._closed[0][1] <= stored:
            path, _ = self._closed.pop(0)
            path.unlink(missing_ok=True)

    def discard(self) -> None:
        """Close and delete every segment and the lock (after close(): each row is in SQL or the fsynced spill)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for path in self.files():
            path.unlink(missing_ok=True)
        self._closed.clear()
        self._bytes = 0
        if self._lock_fd is not None:
            (self.directory / f"{self.owner}.lock").unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None


def _locked(path: Path, wait: bool) -> int | None:
    """An fd holding an exclusive flock on `path` (created if missing); None if another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
