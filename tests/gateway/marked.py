"""Run a `fairserve` command as a real process whose every descendant can be found afterwards.

Each run gets a unique environment variable; children inherit the environment (the engine worker, the
multiprocessing fork server and resource tracker among them), so `leftovers` finds whatever of the run
still lives, whoever its parent is now, by reading /proc (Linux).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

MARK = "FAIRSERVE_TEST_RUN"


def run_marked(*args: str, timeout: float = 120.0) -> tuple[subprocess.CompletedProcess[str], str]:
    """`python -m gateway.cli ARGS` to its end (bounded); (the completed run, its mark)."""
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    return done, mark


def marked_pids(mark: str) -> dict[int, str]:
    """The live processes carrying `mark` in their environment: pid -> command line."""
    needle = f"{MARK}={mark}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
                found[int(proc.name)] = cmdline.decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def leftovers(mark: str) -> list[str]:
    """Command lines of the live processes carrying `mark` in their environment."""
    return list(marked_pids(mark).values())


def wait_no_leftover_pids(mark: str, timeout_s: float = 10.0) -> list[int]:
    """As `wait_no_leftovers`, the pids still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (left := marked_pids(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling a condition, bounded by the deadline
    return list(left)


def wait_no_leftovers(mark: str, timeout_s: float = 10.0) -> list[str]:
    """Poll until no process of the run lives (bounded: daemonic children end just after their parent);
    returns what still lives at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (left := leftovers(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling a condition, bounded by the deadline
    return left
