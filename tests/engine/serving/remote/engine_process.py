"""Run `fairserve engine --listen tcp://127.0.0.1:PORT` as a real subprocess and read its banner.

Reusable by any test that needs engines on their own (a gateway's `--engine`, routing, failure drills):
`EngineProcess(data_dir)` returns once the engine prints `engine_id`, with `address` and `engine_id` set.
Port 0 picks a free port; pass the previous `port` to restart an engine where a gateway expects it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


class EngineProcess:
    """A `fairserve engine` subprocess; `banner` holds its printed key: value lines."""

    def __init__(self, data_dir: Path, *args: str, port: int = 0, timeout: float = 120.0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "gateway.cli",
            "engine",
            "--listen",
            f"tcp://127.0.0.1:{port}",
            "--data-dir",
            str(data_dir),
            *args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.banner: dict[str, str] = {}
        self.output: list[str] = []
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                key, sep, value = line.strip().partition(": ")
                if sep and key in ("engine", "engine_id"):
                    self.banner[key] = value
                    if key == "engine_id":
                        ready.set()
            ready.set()  # it exited before its banner

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout) or "engine_id" not in self.banner:
            self.kill()
            raise AssertionError("fairserve engine did not start:\n" + "".join(self.output[-40:]))
        self.address = self.banner["engine"]
        self.engine_id = self.banner["engine_id"]
        self.port = int(self.address.rpartition(":")[2])

    def terminate(self) -> None:
        """SIGTERM: the engine drains, then exits."""
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for exit; returns the exit code."""
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """Terminate and reap (kill if it will not stop in 30 s)."""
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
