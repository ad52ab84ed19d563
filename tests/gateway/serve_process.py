"""Run `fairserve serve` as a real subprocess on a free port and read its banner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.banner import SECRETS, banner_entry


class ServeProcess:
    """A `fairserve serve --port 0` subprocess; `banner` holds the printed key: value lines."""

    def __init__(self, data_dir: Path, *args: str, timeout: float = 120.0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            *args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.banner: dict[str, str] = {}
        self.files: dict[str, str] = {}  # secret -> the file the banner named for it
        self.output: list[str] = []
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                key, sep, value = line.strip().partition(": ")
                if sep and key.removesuffix("_file") in SECRETS and key.endswith("_file"):
                    self.files[key.removesuffix("_file")] = value  # stdout is a pipe: files, not secrets
                key, value = banner_entry(line) or ("", "")
                if key in ("url", "admin", *SECRETS):
                    self.banner[key] = value
                    if key == "admin_token":
                        ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout) or "admin_token" not in self.banner:
            self.stop()
            raise AssertionError("fairserve serve did not start:\n" + "".join(self.output[-40:]))
        self.url = self.banner["url"]

    def headers(self, key: str, **extra: str) -> dict[str, str]:
        """Authorization with `key` plus extra headers."""
        return {"Authorization": f"Bearer {key}", **extra}

    def terminate(self) -> None:
        """Send SIGTERM (graceful shutdown)."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for exit; returns the exit code."""
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """Terminate and reap the process (kill if it will not stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
