"""`fairserve serve` refusing to start: fast, one clear line, exit status 3, and no process left behind.

Real processes: the gateway is `python -m gateway.cli serve`, and every process it starts (the engine
worker, multiprocessing's helpers) is found afterwards by the mark in its environment (tests/gateway/marked.py).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.gateway.marked import run_marked, wait_no_leftovers


def _port_nobody_listens_on() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_engine_is_one_line_naming_it_and_exit_3(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{_port_nobody_listens_on()}"
    began = time.monotonic()
    done, mark = run_marked("serve", "--port", "0", "--data-dir", str(tmp_path), "--engine", address)
    print(f"unreachable engine reported after {time.monotonic() - began:.1f}s (process start included)")
    assert done.returncode == 3, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [
        f"fairserve serve: no engine reachable at {address}: nothing accepted a connection within 2s "
        f"(is `fairserve engine --listen {address}` running?)"
    ], done.stderr
    assert "url:" not in done.stdout  # no banner: it never served
    assert wait_no_leftovers(mark) == []


def test_a_refusal_after_the_engine_worker_started_leaves_no_process(tmp_path: Path) -> None:
    """The local engine worker is up when the metrics port turns out to be taken: serve exits non-zero,
    and the worker (and multiprocessing's helpers) end with it instead of holding it forever."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done, mark = run_marked(
            "serve", "--port", "0", "--data-dir", str(tmp_path), "--metrics-port", port, timeout=180
        )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Address already in use" in done.stderr
    assert wait_no_leftovers(mark) == []


def test_workers_without_redis_or_engine_are_one_line_naming_the_flag_and_exit_2(tmp_path: Path) -> None:
    """State the workers must share (idempotency, quotas, revocation) needs Redis; an embedded engine
    cannot be shared. Refused before anything starts."""
    engine = f"tcp://127.0.0.1:{_port_nobody_listens_on()}"
    cases = [
        (("--engine", engine), "--workers 2 needs --redis"),
        (("--redis", "redis://127.0.0.1:6379/13"), "--workers 2 needs --engine"),
    ]
    for extra, needs in cases:
        done, mark = run_marked("serve", "--port", "0", "--data-dir", str(tmp_path), "--workers", "2", *extra)
        assert done.returncode == 2, done.stdout + done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"fairserve serve: {needs}"), done.stderr
        assert wait_no_leftovers(mark) == []
