"""Kill-to-ready: how long a killed engine worker takes to be replaced under `fairserve serve`, and where it goes.

    python -m experiments.kill_to_ready [--kills 5]

Starts `fairserve serve` (its engine worker in its own process, as deployed), and `--kills` times: serves
one request (so the worker is one that served), SIGKILLs the worker, and times from the kill until
/readyz answers 200 again, polling every 5 ms. The gateway logs where each start's time went (spawn and
imports until the worker's main runs, then the engine build); a bare spawned interpreter that imports
nothing is timed too, so "imports" can be told from "spawn". Successive kills show whether the
replacement waits grow (they must not: docs/engine.md, "Kill to ready").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.banner import banner_entry

_REPLACED = re.compile(
    r"engine worker replaced \(start ([\d.]+) s: spawn and imports ([\d.]+) s, engine build ([\d.]+) s\)"
)


def _noop() -> None:
    """The target of the bare spawn: nothing to import beyond this small module."""


def bare_spawn_seconds(n: int = 3) -> float:
    """Median seconds to spawn, start and join an interpreter that runs nothing."""
    ctx = multiprocessing.get_context("spawn")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = ctx.Process(target=_noop)
        proc.start()
        proc.join()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def engine_worker(pid: int) -> int | None:
    """The serve process's engine worker: a child of its multiprocessing forkserver, or a spawned child."""
    for child in _children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"forkserver" in cmd:
            workers = _children(child)
            if workers:
                return workers[0]
        elif b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            return child
    return None


def run(kills: int) -> dict[str, Any]:
    """Serve, kill, time to ready, `kills` times; the figures as a dict."""
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--data-dir", data],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        lines: list[str] = []
        banner: dict[str, str] = {}
        ready = threading.Event()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                key, value = banner_entry(line) or ("", "")  # a secret's file read into the secret
                if key in ("url", "api_key", "admin_token"):
                    banner[key] = value
                    if key == "admin_token":
                        ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        try:
            if not ready.wait(300) or "url" not in banner:
                raise RuntimeError("fairserve serve did not start:\n" + "".join(lines[-20:]))
            return _kill_cycles(proc.pid, banner, kills, lines)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def _kill_cycles(pid: int, banner: dict[str, str], kills: int, lines: list[str]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {banner['api_key']}"}
    seconds: list[float] = []
    with httpx.Client(base_url=banner["url"], timeout=120) as client:
        model = client.get("/v1/models", headers=headers).json()["data"][0]["id"]
        for _ in range(kills):
            served = client.post(
                "/v1/completions", headers=headers, json={"model": model, "prompt": "served", "max_tokens": 2}
            )
            assert served.status_code == 200, served.text
            worker = engine_worker(pid)
            assert worker is not None
            t0 = time.perf_counter()
            os.kill(worker, signal.SIGKILL)
            while client.get("/readyz").status_code == 200:  # until the death is noticed
                time.sleep(0.005)
            while client.get("/readyz").status_code != 200:
                time.sleep(0.005)
            seconds.append(time.perf_counter() - t0)
    starts = [tuple(float(x) for x in m.groups()) for m in map(_REPLACED.search, lines) if m]
    bare = bare_spawn_seconds()
    return {
        "kill_to_ready_s": [round(s, 3) for s in seconds],
        "kill_to_ready_median_s": round(statistics.median(seconds), 3),
        "start_total_s": [round(s[0], 3) for s in starts],
        "spawn_and_imports_s": [round(s[1], 3) for s in starts],
        "engine_build_s": [round(s[2], 3) for s in starts],
        "bare_spawn_s": round(bare, 3),
    }


def main() -> None:
    """Run and print JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=5, help="workers to kill in a row")
    print(json.dumps(run(p.parse_args().kills), indent=2))


if __name__ == "__main__":
    main()
