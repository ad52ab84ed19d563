"""`fairserve serve --workers N`: N gateway processes accepting on one port, supervised by the `serve` process.

Why processes: one gateway's event loop is one core (docs/gateway.md, "Benchmark: gateway CPU against its
floor"), and a GPU streams more tokens than one core can frame. Each worker is a whole `fairserve serve`
attached to the same `--engine`s, exactly as N separate gateways are (tests/gateway/test_scale_out.py): the
fair share lives in the engines, idempotency, quotas and key revocation in Redis, the ledger in one database.
So N > 1 needs `--redis` and `--engine`; an embedded engine would be one worker's own.

Each worker binds the port itself with SO_REUSEPORT, so the kernel spreads new connections over the workers'
accept queues. The parent holds a bound, non-listening socket on the port from before the first worker
starts to after the last one ends: `--port 0` resolves once, and nobody else can take the port while a
worker restarts. A worker that dies is logged and restarted (as `--restart-engine` does for the engine);
SIGINT/SIGTERM to the parent stops every worker with SIGTERM (each drains as a lone `serve` does).
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

WORKER_FLAG = "--worker"  # hidden: this `serve` is one of a supervisor's workers (binds with SO_REUSEPORT)
READY_PREFIX = "url: "  # the first banner line a worker prints once it listens
RESTART_PAUSE_S = 1.0  # least time between two starts of one worker slot: a worker that cannot start
STOP_GRACE_S = 5.0  # past the drain (grace_period_s), how long a worker may take before it is killed


def refusal(settings: GatewaySettings) -> str | None:
    """Why `serve` cannot run `settings.workers` workers, in one line naming the flag; None if it can."""
    if settings.workers == 1:
        return None
    if not settings.redis_url:
        return (
            f"--workers {settings.workers} needs --redis: idempotency, quotas and key revocation "
            "must be shared by the workers"
        )
    if not settings.engines:
        return (
            f"--workers {settings.workers} needs --engine: the workers attach to running "
            "`fairserve engine`s (an embedded engine would be one worker's own)"
        )
    return None


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT, not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class _Worker:
    """One worker slot: its process, and a thread that forwards its output and notices it listening."""

    def __init__(self, cmd: list[str]) -> None:
        self.cmd = cmd
        self.ready = threading.Event()
        self.started_at = time.monotonic()
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[str]:
        self.ready.clear()
        self.started_at = time.monotonic()
        proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()
        return proc

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY_PREFIX) and not self.ready.is_set():
                self.ready.set()  # the parent prints the one banner; the worker's own is not repeated
                continue
            if not line.startswith("admin: "):
                sys.stdout.write(line)
                sys.stdout.flush()

    def restart_if_dead(self) -> None:
        code = self.proc.poll()
        if code is None or time.monotonic() - self.started_at < RESTART_PAUSE_S:
            return
        log.warning("gateway worker pid %d exited with status %d; starting another", self.proc.pid, code)
        self.proc = self._spawn()


class Supervisor:
    """Start `n` workers on (host, port), print the banner once all listen, keep them running until a signal."""

    def __init__(self, argv: Sequence[str], host: str, port: int, n: int) -> None:
        self.held = reuse_port_socket(host, port)  # kept bound: see the module docstring
        self.host, self.port = host, self.held.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "gateway.cli",
            *argv,
            "--port",
            str(self.port),
            "--workers",
            "1",
            WORKER_FLAG,
        ]
        self.cmd, self.n = cmd, n
        self.workers: list[_Worker] = []
        self.stopping = threading.Event()

    def run(self, banner: dict[str, str], startup_timeout_s: float, grace_s: float) -> int:
        """Serve until SIGINT/SIGTERM; 3 when a worker cannot start (like a lone `serve`), else 0."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        try:
            self.workers = [_Worker(self.cmd) for _ in range(self.n)]
            if not self._wait_ready(startup_timeout_s):
                return 3
            lines = [f"url: http://{self.host}:{self.port}", f"admin: http://{self.host}:{self.port}/admin"]
            lines.append("workers: " + " ".join(str(w.proc.pid) for w in self.workers))
            lines += [f"{k}: {v}" for k, v in banner.items()]
            print("\n".join(lines), flush=True)
            while not self.stopping.wait(0.2):  # a supervisor's poll, not a test's sleep
                for worker in self.workers:
                    worker.restart_if_dead()
            return 0
        finally:
            self._stop_all(grace_s + STOP_GRACE_S)
            self.held.close()

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.stopping.is_set() and time.monotonic() < deadline:
            if any(w.proc.poll() is not None and not w.ready.is_set() for w in self.workers):
                print("fairserve serve: a gateway worker failed to start", file=sys.stderr)
                return False
            if all(w.ready.wait(0.1) for w in self.workers):
                return True
        return False

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.stopping.set()

    def _stop_all(self, grace_s: float) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for worker in self.workers:
            try:
                worker.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
