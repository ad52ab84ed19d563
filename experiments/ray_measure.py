"""`python -m experiments.ray_measure`: the figures of docs/deploy.md ("Measured"), from real processes on
this machine (needs the `ray` extra; a study, not part of the `cluster` package it measures).

1. `fairserve ray up --engines 2` (as a user types it: a local cluster sized by Ray, 2 engines, 1 gateway)
   to its first answered request;
2. the gateway overhead through the Ray deployment against `fairserve serve` alone, as a ratio of median
   latencies of short requests (max_tokens=1), rounds alternating between the two in one run;
3. SIGKILL of the engine actor's process to its re-registration, and to the first request it answers.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import ray

from cluster.config import ClusterConfig
from cluster.deploy import connect, wait_until
from cluster.registry import EngineEntry


class Banner:
    """A `fairserve` subprocess whose `key: value` lines are read until `admin_token`."""

    def __init__(self, *args: str, timeout_s: float = 600.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: dict[str, str] = {}
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                key, sep, value = line.strip().partition(": ")
                if sep:
                    self.lines[key] = value
                if key == "admin_token":
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout_s) or "admin_token" not in self.lines:
            self.stop()
            raise RuntimeError(f"fairserve {args[0]} did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _model(client: httpx.Client) -> str:
    return str(client.get("/v1/models").json()["data"][0]["id"])


def _round(client: httpx.Client, model: str, n: int) -> float:
    """Median seconds of `n` sequential one-token completions."""
    took = []
    for _ in range(n):
        start = time.perf_counter()
        resp = client.post("/v1/completions", json={"model": model, "prompt": "hello", "max_tokens": 1})
        resp.raise_for_status()
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="fairserve-ray-measure-"))
    common = ["--port", "0", "--max-num-seqs", "8", "--num-kv-blocks", "256"]
    started = time.monotonic()
    up = Banner("ray", "up", "--engines", "2", "--data-dir", str(data / "ray"), *common)
    ray_client = httpx.Client(
        base_url=up.lines["url"], timeout=60, headers={"Authorization": f"Bearer {up.lines['api_key']}"}
    )
    model = _model(ray_client)
    _round(ray_client, model, 1)
    print(f"fairserve ray up -> first answered request: {time.monotonic() - started:.1f}s", flush=True)
    serve = Banner("serve", "--data-dir", str(data / "serve"), *common)
    serve_client = httpx.Client(
        base_url=serve.lines["url"], timeout=60, headers={"Authorization": f"Bearer {serve.lines['api_key']}"}
    )
    try:
        _round(serve_client, model, 5)
        ratios = []
        for i in range(args.rounds):  # alternate which goes first, so drift hits both alike
            pair = [("ray", ray_client), ("serve", serve_client)][:: 1 if i % 2 == 0 else -1]
            medians = {name: _round(c, model, args.requests) for name, c in pair}
            ratios.append(medians["ray"] / medians["serve"])
            print(
                f"round {i}: ray {medians['ray'] * 1e3:.1f} ms, serve {medians['serve'] * 1e3:.1f} ms, "
                f"ratio {ratios[-1]:.2f}",
                flush=True,
            )
        print(
            f"gateway through Ray / serve alone, median latency of 1-token requests: "
            f"{statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})",
            flush=True,
        )
        _restart(ray_client, model, up.lines["ray"])
    finally:
        serve.stop()
        up.stop()


def _restart(client: httpx.Client, model: str, address: str) -> None:
    connect(ClusterConfig(address=address))
    registry = ray.get_actor("fairserve-registry")
    before: EngineEntry = ray.get(registry.engines.remote())[0]
    killed = time.monotonic()
    os.kill(before.pid, signal.SIGKILL)

    def back() -> bool:
        return any(e.engine_id != before.engine_id for e in ray.get(registry.engines.remote()))

    wait_until(back, 120, "the engine actor to re-register")
    registered = time.monotonic() - killed

    def answers() -> bool:
        return (
            client.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 1}).status_code
            == 200
        )

    wait_until(answers, 120, "an answer from the restarted engine", every_s=0.05)
    print(
        f"engine actor SIGKILL -> re-registered {registered:.1f}s, answering {time.monotonic() - killed:.1f}s",
        flush=True,
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
