"""`fairserve serve` as a subprocess: the banner, owner-only secrets, and graceful SIGTERM."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import httpx

from tests.gateway.serve_process import ServeProcess


def test_serve_banner_secrets_and_graceful_sigterm(tmp_path: Path) -> None:
    proc = ServeProcess(tmp_path, "--max-num-seqs", "4", "--grace-period", "20")
    try:
        assert proc.banner["url"].startswith("http://127.0.0.1:")
        assert proc.banner["admin"] == proc.banner["url"] + "/admin"
        for name, value in (("api_key", proc.banner["api_key"]), ("admin_token", proc.banner["admin_token"])):
            path = tmp_path / name
            assert path.read_text().strip() == value
            assert path.stat().st_mode & 0o777 == 0o600
        auth = {"Authorization": f"Bearer {proc.banner['api_key']}"}
        with httpx.Client(base_url=proc.url, timeout=60) as c:
            model = c.get("/v1/models", headers=auth).json()["data"][0]["id"]
            admin = c.get(
                "/admin/api/engine", headers={"Authorization": f"Bearer {proc.banner['admin_token']}"}
            )
            assert admin.status_code == 200
        lines: list[str] = []
        first_token = threading.Event()

        def stream() -> None:
            body = {
                "model": model,
                "prompt": "drain me",
                "max_tokens": 60,
                "ignore_eos": True,
                "stream": True,
            }
            with (
                httpx.Client(base_url=proc.url, timeout=60) as c,
                c.stream(
                    "POST", "/v1/completions", json=body, headers={**auth, "X-Request-Id": "drained-1"}
                ) as resp,
            ):
                for line in resp.iter_lines():
                    if line:
                        lines.append(line)
                        first_token.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first_token.wait(30)
        proc.terminate()
        # New work is refused while draining: a 503 with Retry-After, or the listener already closed.
        try:
            late = httpx.post(
                proc.url + "/v1/completions",
                json={"model": model, "prompt": "x", "max_tokens": 1},
                headers=auth,
                timeout=10,
            )
            assert late.status_code == 503 and "retry-after" in late.headers
        except httpx.TransportError:
            pass
        t.join(60)
        assert lines[-1] == "data: [DONE]"  # the in-flight stream finished within the grace period
        assert proc.wait(60) == 0
        with sqlite3.connect(tmp_path / "fairserve.db") as db:
            rows = db.execute(
                "SELECT status, completion_tokens FROM usage WHERE request_id='drained-1'"
            ).fetchall()
        assert rows == [("completed", 60)]  # the ledger was flushed before exit
    finally:
        proc.stop()
