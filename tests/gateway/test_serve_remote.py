"""`fairserve serve --engine tcp://...`: a gateway process attached to an engine process it did not start.

It answers OpenAI requests over HTTP through the remote engine; when the engine is killed -9 mid-stream the
stream ends with an error event, requests get a retryable 503 with Retry-After, their ledger rows say
"error", /readyz reports the engine down (on the dropped connection: the lost bound is set beyond the
test); and an engine restarted on the same port is served again without restarting the gateway."""

from __future__ import annotations

import functools
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from billing import Database, default_db_url
from tests.engine.serving.remote.engine_process import EngineProcess
from tests.gateway.conftest import wait_for
from tests.gateway.marked import run_marked, wait_no_leftovers
from tests.gateway.serve_process import ServeProcess

ENGINE_ARGS = ("--num-kv-blocks", "512", "--max-num-batched-tokens", "64")


def chat(model: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "count to a thousand"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def ledger_status(data_dir: Path, request_id: str) -> tuple[str, str | None] | None:
    db = Database(default_db_url(data_dir))
    try:
        with db.engine.connect() as conn:
            row = conn.execute(
                text("SELECT status, finish_reason FROM usage WHERE request_id = :r"), {"r": request_id}
            ).first()
    finally:
        db.dispose()
    return None if row is None else (row[0], row[1])


def test_serve_attached_to_an_engine_process_survives_its_kill_and_restart(tmp_path: Path) -> None:
    engine = EngineProcess(tmp_path / "engine", *ENGINE_ARGS)
    serve: ServeProcess | None = None
    restarted: EngineProcess | None = None
    try:
        # A lost bound no test waits out: only the connection the kill drops can fail the requests.
        serve = ServeProcess(tmp_path / "gateway", "--engine", engine.address, "--engine-lost-timeout", "600")
        key = serve.banner["api_key"]
        with httpx.Client(base_url=serve.url, timeout=30, headers=serve.headers(key)) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            done = client.post("/v1/chat/completions", json=chat(model, 6))
            assert done.status_code == 200, done.text
            assert done.json()["usage"]["completion_tokens"] == 6
            assert client.get("/readyz").status_code == 200

            # A non-stream request and a stream in flight when the engine dies.
            held: dict[str, httpx.Response] = {}
            plain = threading.Thread(
                target=lambda: held.setdefault(
                    "r",
                    client.post(
                        "/v1/chat/completions",
                        json=chat(model, 2000),
                        headers={"X-Request-Id": "remote-plain"},
                    ),
                )
            )
            events: list[str] = []
            with client.stream(
                "POST",
                "/v1/chat/completions",
                json=chat(model, 2000, stream=True),
                headers={"X-Request-Id": "remote-stream"},
            ) as resp:
                lines = resp.iter_lines()
                events.append(next(line for line in lines if line.startswith("data:")))
                plain.start()
                admin = {"Authorization": f"Bearer {serve.banner['admin_token']}"}
                wait_for(
                    lambda: client.get("/admin/api/live", headers=admin).json()["engine"]["running"] == 2,
                    10,
                    "both requests to run on the engine",
                )
                engine.kill()
                killed_at = time.monotonic()
                wait_for(
                    lambda: client.get("/readyz").status_code == 503, 60, "/readyz to report the engine down"
                )
                # docs/engine.md's figure (`pytest -s` prints it), not an assert: a time is no behaviour.
                print(f"kill -9 to /readyz 503: {time.monotonic() - killed_at:.3f}s")
                events += [line for line in lines if line.startswith("data:")]
            plain.join(60)
            assert events[-1] == "data: [DONE]"
            error = json.loads(events[-2].removeprefix("data: "))["error"]
            assert error["code"] == "engine_unavailable", events[-3:]
            assert held["r"].status_code == 503 and "Retry-After" in held["r"].headers, held["r"].text
            refused = client.post("/v1/chat/completions", json=chat(model, 4))
            assert refused.status_code == 503 and "Retry-After" in refused.headers
            for rid in ("remote-stream", "remote-plain"):
                row = wait_for(
                    functools.partial(ledger_status, tmp_path / "gateway", rid),
                    10,
                    f"the ledger row of {rid}",
                )
                assert row == ("error", "error"), (rid, row)

            restarted = EngineProcess(tmp_path / "engine", *ENGINE_ARGS, port=engine.port)
            wait_for(
                lambda: client.get("/readyz").status_code == 200, 10, "the gateway to rejoin the new engine"
            )
            again = client.post("/v1/chat/completions", json=chat(model, 5))
            assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 5, again.text
    finally:
        if serve is not None:
            serve.stop()
        engine.kill()
        if restarted is not None:
            restarted.stop()


def test_serve_reaches_a_keyed_engine_only_with_its_cluster_key(tmp_path: Path) -> None:
    """`engine --cluster-key NEW` creates the key; `serve --cluster-key` with it answers; without it, serve
    refuses to start, saying why (engine/serving/remote/curve.py)."""
    key_file = tmp_path / "cluster_key"
    engine = EngineProcess(tmp_path / "engine", *ENGINE_ARGS, "--cluster-key", str(key_file))
    serve: ServeProcess | None = None
    try:
        assert any(line.startswith(f"cluster_key: created {key_file}") for line in engine.output)
        assert key_file.stat().st_mode & 0o077 == 0
        serve = ServeProcess(tmp_path / "gateway", "--engine", engine.address, "--cluster-key", str(key_file))
        with httpx.Client(
            base_url=serve.url, timeout=30, headers=serve.headers(serve.banner["api_key"])
        ) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            done = client.post("/v1/chat/completions", json=chat(model, 4))
            assert done.status_code == 200, done.text
            assert done.json()["usage"]["completion_tokens"] == 4
        refused, mark = run_marked(
            "serve", "--port", "0", "--data-dir", str(tmp_path / "unkeyed"), "--engine", engine.address
        )
        assert refused.returncode == 3, refused.stdout + refused.stderr
        said = [line for line in refused.stderr.splitlines() if line.strip()]
        # The refusal alone: the warning of a keyless serve --engine comes only once the engines are reached.
        assert len(said) == 1 and engine.address in said[0] and "same --cluster-key" in said[0], said
        assert wait_no_leftovers(mark) == []
    finally:
        if serve is not None:
            serve.stop()
        engine.stop()


def test_a_graceful_engine_stop_is_logged_at_info_by_its_gateway(tmp_path: Path) -> None:
    """An engine stopped by SIGTERM says so (WorkerExiting): an operator's stop, not an error (issue 56)."""
    engine = EngineProcess(tmp_path / "engine", *ENGINE_ARGS)
    serve: ServeProcess | None = None
    try:
        serve = ServeProcess(tmp_path / "gateway", "--engine", engine.address, "--engine-lost-timeout", "600")
        engine.terminate()
        assert engine.wait(60) == 0
        said = f"the engine at {engine.address} shut down: failing the 0 requests in flight"
        line = wait_for(
            lambda: next((x for x in list(serve.output) if said in x), None), 30, "the stop logged"
        )
        assert " INFO " in line, line
        assert not [x for x in serve.output if " ERROR " in x], serve.output
    finally:
        if serve is not None:
            serve.stop()
        engine.stop()
