"""A killed engine worker under `fairserve serve`: its streams fail, a new worker takes over, serving resumes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx

from gateway.ops.engine_watch import restart_delay
from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass  # already gone
    return children


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def engine_workers(pid: int) -> list[int]:
    """The engine worker processes of `pid`: spawned children, or children of its multiprocessing forkserver
    (not its resource tracker, not the forkserver itself)."""
    workers = []
    for child in _children(pid):
        cmdline = _cmdline(child)
        if b"forkserver" in cmdline:
            workers += _children(child)
        elif b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            workers.append(child)
    return workers


def test_a_killed_worker_fails_its_streams_and_is_replaced(tmp_path: Path) -> None:
    serve = ServeProcess(tmp_path, "--max-num-seqs", "4")
    try:
        headers = serve.headers(serve.banner["api_key"])
        with httpx.Client(base_url=serve.url, timeout=60) as client:
            model = client.get("/v1/models", headers=headers).json()["data"][0]["id"]
            body = {
                "model": model,
                "prompt": "doomed",
                "max_tokens": 1500,
                "ignore_eos": True,
                "stream": True,
            }
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
            done = client.post(
                "/v1/completions", json={**body, "stream": False, "max_tokens": 4}, headers=headers
            )
            assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
            metrics = client.get(
                "/metrics", headers={"Authorization": f"Bearer {serve.banner['metrics_token']}"}
            ).text
            assert 'fairserve_engine_restarts_total{result="ok"} 1.0' in metrics
    finally:
        serve.stop()
    assert serve.proc.returncode == 0
    assert "engine worker died" in "".join(serve.output) and "engine worker replaced" in "".join(serve.output)


def test_restart_delay_grows_only_for_workers_that_never_served() -> None:
    assert [restart_delay(True, 0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [restart_delay(False, n) for n in (1, 2, 3, 4, 10)] == [1.0, 2.0, 4.0, 8.0, 30.0]


def test_a_crash_loop_of_serving_workers_gets_no_back_off(tmp_path: Path) -> None:
    """Three workers in a row die right after serving a request: each is replaced at once (delay 0), never
    after a growing back-off, and the gateway serves again after every one."""
    serve = ServeProcess(tmp_path)
    try:
        headers = serve.headers(serve.banner["api_key"])
        with httpx.Client(base_url=serve.url, timeout=60) as client:
            model = client.get("/v1/models", headers=headers).json()["data"][0]["id"]
            body = {"model": model, "prompt": "served", "max_tokens": 2}
            workers = []
            for _ in range(3):
                assert client.post("/v1/completions", json=body, headers=headers).status_code == 200
                (worker,) = engine_workers(serve.proc.pid)
                workers.append(worker)
                os.kill(worker, signal.SIGKILL)

                def replaced(w: int = worker) -> bool:
                    return client.get("/readyz").status_code == 200 and engine_workers(
                        serve.proc.pid
                    ) not in ([], [w])

                wait_for(replaced, 60, "a replacement worker")
            assert client.post("/v1/completions", json=body, headers=headers).status_code == 200
            assert (
                'fairserve_engine_restarts_total{result="ok"} 3.0'
                in client.get(
                    "/metrics", headers={"Authorization": f"Bearer {serve.banner['metrics_token']}"}
                ).text
            )
    finally:
        serve.stop()
    out = "".join(serve.output)
    assert out.count("starting a new one in 0 s") == 3
    assert "starting a new one in 1 s" not in out and len(set(workers)) == 3
