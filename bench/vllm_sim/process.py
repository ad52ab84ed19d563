"""Start the simulator as a process of its own on a free port, for a test or a bench, and stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from bench.vllm_sim import READY


@dataclass
class SimProcess:
    """A running `python -m bench.vllm_sim`."""

    proc: subprocess.Popen[str]
    url: str  # http://127.0.0.1:PORT, no /v1
    model: str

    def requests(self) -> list[dict[str, object]]:
        """The engine's own record of every request it saw (GET /sim/requests)."""
        resp = httpx.get(f"{self.url}/sim/requests", timeout=10.0)
        resp.raise_for_status()
        records: list[dict[str, object]] = resp.json()["requests"]
        return records

    def fail_next(self, count: int, status: int = 503) -> None:
        """The next `count` generation requests answer `status` before any token."""
        httpx.post(f"{self.url}/sim/faults", json={"fail_next": count, "status": status}, timeout=10.0)

    def kill(self) -> None:
        """SIGKILL: the engine dies mid-whatever, connections drop (an upstream killed mid-stream)."""
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_sim(
    *,
    model: str = "sim",
    max_num_seqs: int = 8,
    step_ms: float = 10.0,
    extra: Sequence[str] = (),
    timeout_s: float = 30.0,
) -> SimProcess:
    """Start the simulator and return once it has printed its READY line (it answers by then)."""
    argv = [sys.executable, "-m", "bench.vllm_sim", "--model", model, "--max-num-seqs", str(max_num_seqs)]
    argv += ["--step-ms", str(step_ms), *extra]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline() if proc.stdout else ""))
    reader.start()
    reader.join(timeout_s)  # the READY line, or EOF if the process died
    if not line or not line[0].startswith(READY):
        proc.kill()
        proc.wait(10)
        raise RuntimeError(f"bench.vllm_sim did not start (exit {proc.poll()}, said {line!r})")
    return SimProcess(proc, line[0].split()[1], model)


@contextmanager
def running_sim(
    *, model: str = "sim", max_num_seqs: int = 8, step_ms: float = 10.0, extra: Sequence[str] = ()
) -> Iterator[SimProcess]:
    """`start_sim(...)` for the length of a with-block."""
    sim = start_sim(model=model, max_num_seqs=max_num_seqs, step_ms=step_ms, extra=extra)
    try:
        yield sim
    finally:
        sim.stop()
