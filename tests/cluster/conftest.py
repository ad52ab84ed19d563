"""One deployment for the package's tests, started as a user starts it: `fairserve ray up --engines 2`.

No --num-cpus, no --address: `ray up` starts its own local cluster on this (2-core) machine and sizes the
actors' CPU reservations to it (cluster/fit.py); this process then joins that cluster as a driver, at the
address the banner prints. The run's own choices travel as environment (a free port, PostgreSQL, a small KV
cache), so the command line is the user's. CI cost: one local cluster (GCS, raylet and their agents, about
0.8 GiB), 2 engines and 1 gateway; the tests run in file order on it (serve, then kill, then scale), each
leaving it with engines serving.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray

from cluster import deploy
from cluster.config import ClusterConfig
from tests.billing.conftest import pg_url  # noqa: F401  (the fixture: gateways share PostgreSQL by URL)
from tests.gateway.marked import MARK, wait_no_leftover_pids

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 300.0


@dataclass
class Cluster:
    """The local cluster's address and the namespace of this run's deployment."""

    address: str
    namespace: str

    def fairserve(
        self, *args: str, until: str | None = None, timeout: float = CLI_TIMEOUT_S
    ) -> dict[str, str]:
        """Run `fairserve ray <args>` against this cluster; its `key: value` lines (read up to `until`)."""
        cmd = [
            sys.executable,
            "-m",
            "gateway.cli",
            "ray",
            args[0],
            "--address",
            self.address,
            "--namespace",
            self.namespace,
            *args[1:],
        ]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        lines: list[str] = []
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
            rc = proc.wait()
        finally:
            timer.cancel()
        assert rc == 0, f"fairserve ray {' '.join(args)} exited {rc}:\n" + "".join(lines[-40:])
        found = {}
        for line in lines:
            key, sep, value = line.strip().partition(": ")
            if sep:
                found[key] = value
        return found


@dataclass
class RayUp:
    """The foreground `fairserve ray up` process, its banner, and the seconds from launch to its first answer."""

    proc: subprocess.Popen[str]
    banner: dict[str, str]
    output: list[str]
    mark: str
    db_url: str
    launched_at: float


def _read_banner(proc: subprocess.Popen[str], output: list[str], timeout_s: float) -> dict[str, str]:
    """The `key: value` lines up to `admin_token` (the banner's last); AssertionError if it never comes."""
    banner: dict[str, str] = {}
    done = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            key, sep, value = line.strip().partition(": ")
            if sep and key in ("ray", "url", "admin", "api_key", "metrics_token", "admin_token"):
                banner[key] = value
                if key == "admin_token":
                    done.set()
        done.set()

    threading.Thread(target=pump, daemon=True).start()
    if not done.wait(timeout_s) or "admin_token" not in banner:
        raise AssertionError("fairserve ray up did not come up:\n" + "".join(output[-60:]))
    return banner


@pytest.fixture(scope="package")
def ray_up(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayUp]:  # noqa: F811
    """`fairserve ray up --engines 2`, typed as a user types it, in a directory of its own (./fairserve-data)."""
    cwd = tmp_path_factory.mktemp("ray-up")
    mark = uuid.uuid4().hex
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        MARK: mark,  # every process of the run, Ray's own included, carries it (tests/gateway/marked.py)
        "FAIRSERVE_PORT": "0",
        "FAIRSERVE_DB_URL": pg_url,
        "FAIRSERVE_ENGINE__MAX_NUM_SEQS": "8",
        "FAIRSERVE_ENGINE__NUM_KV_BLOCKS": "256",
    }
    launched_at = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "ray", "up", "--engines", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env=env,
    )
    output: list[str] = []
    try:
        banner = _read_banner(proc, output, CLI_TIMEOUT_S)
        yield RayUp(proc, banner, output, mark, pg_url, launched_at)
    finally:
        _stop(proc, mark)


def _stop(proc: subprocess.Popen[str], mark: str) -> None:
    """SIGTERM (`ray up` takes its deployment and cluster down), bounded; then end whatever of it is left."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    for pid in wait_no_leftover_pids(mark, timeout_s=20):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="package")
def ray_cluster(ray_up: RayUp) -> Iterator[Cluster]:
    """This process as a driver of the cluster `ray up` started (the deployment's namespace, `fairserve`)."""
    address = ray_up.banner["ray"]
    deploy.connect(ClusterConfig(address=address))  # as `ray status --address` joins it (Ray's token too)
    try:
        yield Cluster(address, "fairserve")
    finally:
        ray.shutdown()
