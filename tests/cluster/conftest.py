"""One local Ray cluster for the package's tests, and one deployment on it started by `fairserve ray up`.

CI cost: one `ray.init` (about 5 s and 0.8 GiB on the 2-core VM: GCS, raylet, and their agents), the
dashboard off, workers' logs not forwarded; the deployment (2 engines, 1 gateway) is built once and the
tests run in file order on it (serve, then kill, then scale), each leaving it with engines serving.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray

from tests.billing.conftest import pg_url  # noqa: F401  (the fixture: gateways share PostgreSQL by URL)

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


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Cluster]:
    """A local Ray cluster (this process is its driver); workers import this checkout."""
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    namespace = f"fairserve-test-{uuid.uuid4().hex[:8]}"
    ray.init(
        num_cpus=8, include_dashboard=False, log_to_driver=False, namespace=namespace, configure_logging=False
    )
    try:
        yield Cluster(ray.get_runtime_context().gcs_address, namespace)
    finally:
        ray.shutdown()
