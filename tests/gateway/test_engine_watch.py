"""A killed engine worker under `fairserve serve`: its streams fail, a new worker takes over, serving resumes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx

from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess


def engine_workers(pid: int) -> list[int]:
    """Child processes of `pid` that are multiprocessing workers (not its resource tracker)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    workers = []
    for child in children:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # already gone
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            workers.append(child)
    return workers


def test_a_killed_worker_fails_its_streams_and_is_replaced(tmp_path: Path) -> None:
    serve = ServeProcess(tmp_path, "--max-num-seqs", "4")
    try:
        headers = serve.headers(serve.banner["api_key"])
        with httpx.Client(base_url=serve.url, timeout=60) as client:
            model = client.get("/v1/models", headers=headers).json()["data"][0]["id"]
            body = {"model": model, "prompt": "doomed", "max_tokens": 1500, "ignore_eos": True, "stream": True}
            (worker,) = engine_workers(serve.proc.pid)
            with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
                lines = resp.iter_lines()
                assert next(line for line in lines if line).startswith("data: {")  # decoding has begun
                os.kill(worker, signal.SIGKILL)
                rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]"
            assert json.loads(rest[-2][6:])["error"]["code"] == "engine_unavailable"

            wait_for(lambda: client.get("/readyz").status_code == 200, 60, "readiness after the restart")
            (replacement,) = engine_workers(serve.proc.pid)
            assert replacement != worker
            done = client.post("/v1/completions", json={**body, "stream": False, "max_tokens": 4}, headers=headers)
            assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
            metrics = client.get("/metrics", headers={"Authorization": f"Bearer {serve.banner['metrics_token']}"}).text
            assert 'fairserve_engine_restarts_total{result="ok"} 1.0' in metrics
    finally:
        serve.stop()
    assert serve.proc.returncode == 0
    assert "engine worker died" in "".join(serve.output) and "engine worker replaced" in "".join(serve.output)
