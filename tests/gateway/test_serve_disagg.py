"""`fairserve serve --engine P --engine D` with P a `--role prefill` and D a `--role decode` engine: requests
answered over HTTP through both (an idempotent retry replays; a stop string across the hand-off), and the kill drill: a decode engine killed -9 mid-stream and a frozen
prefill engine each fail their requests with the retryable `engine_unavailable`, and the ledger holds a
row for every answered request."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx

from tests.engine.serving.remote.engine_process import EngineProcess
from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess
from tests.gateway.test_serve_remote import chat, ledger_status

ENGINE_ARGS = ("--num-kv-blocks", "512", "--max-num-batched-tokens", "64")


def test_prefill_and_decode_engines_answer_and_survive_the_kill_drill(tmp_path: Path) -> None:
    prefill = EngineProcess(tmp_path / "prefill", *ENGINE_ARGS, "--role", "prefill")
    decode = EngineProcess(tmp_path / "decode", *ENGINE_ARGS, "--role", "decode")
    serve: ServeProcess | None = None
    answered: dict[str, str] = {}  # request id -> the finish_reason its ledger row must have
    try:
        # A frozen engine is lost after 2 s (it is suspect after 0.5 s, and a lone suspect engine still
        # takes requests): the request sent right after the prefill engine freezes is in flight there.
        serve = ServeProcess(
            tmp_path / "gateway",
            "--engine",
            prefill.address,
            "--engine",
            decode.address,
            "--engine-lost-timeout",
            "2",
        )
        key = serve.banner["api_key"]
        with httpx.Client(base_url=serve.url, timeout=30, headers=serve.headers(key)) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]

            def ask(rid: str, max_tokens: int) -> httpx.Response:
                return client.post(
                    "/v1/chat/completions", json=chat(model, max_tokens), headers={"X-Request-Id": rid}
                )

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                done = list(pool.map(ask, [f"ok-{i}" for i in range(4)], [6, 7, 8, 1]))
            for i, resp in enumerate(done):
                assert resp.status_code == 200, resp.text
                assert resp.json()["usage"]["completion_tokens"] == [6, 7, 8, 1][i]
                answered[f"ok-{i}"] = "length"
            # An idempotent retry of a split request replays the first answer instead of generating again.
            body = chat(model, 5)
            first = client.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "split-1"})
            again = client.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "split-1"})
            assert first.status_code == again.status_code == 200, (first.text, again.text)
            assert again.headers.get("Idempotent-Replayed") == "true"
            assert again.json()["choices"] == first.json()["choices"]
            answered[first.headers["X-Request-Id"]] = "length"
            a_stop_across_the_hand_off(client, model)
            admin = {"Authorization": f"Bearer {serve.banner['admin_token']}"}
            rows = client.get("/admin/api/engines", headers=admin).json()
            rows = rows if isinstance(rows, list) else rows.get("engines", rows)
            assert {r["key"] for r in rows} == {prefill.address, decode.address}

            # A frozen prefill engine: the request in flight there fails with the retryable 503.
            os.kill(prefill.proc.pid, signal.SIGSTOP)
            lost = ask("lost-prefill", 8)
            assert lost.status_code == 503 and "Retry-After" in lost.headers, lost.text
            answered["lost-prefill"] = "error"
            # Thawed, the prefill engine is rejoined; then the decode engine dies mid-stream: an error
            # event, then [DONE].
            os.kill(prefill.proc.pid, signal.SIGCONT)
            wait_for(lambda: client.get("/readyz").status_code == 200, 10, "the prefill engine back")
            events: list[str] = []
            with client.stream(
                "POST",
                "/v1/chat/completions",
                json=chat(model, 2000, stream=True),
                headers={"X-Request-Id": "lost-decode"},
            ) as resp:
                lines = resp.iter_lines()
                events += [next(line for line in lines if line.startswith("data:")) for _ in range(3)]
                decode.kill()
                events += [line for line in lines if line.startswith("data:")]
            assert events[-1] == "data: [DONE]"
            error: dict[str, Any] = json.loads(events[-2].removeprefix("data: "))["error"]
            assert error["code"] == "engine_unavailable", events[-3:]
            answered["lost-decode"] = "error"

            prefill.kill()
            refused = ask("refused", 4)
            assert refused.status_code == 503 and "Retry-After" in refused.headers

        for rid, reason in answered.items():
            row = wait_for(functools.partial(ledger_status, tmp_path / "gateway", rid), 10, f"row {rid}")
            assert row is not None and row[1] == reason, (rid, row)
            assert (row[0] == "error") == (reason == "error"), (rid, row)
    finally:
        if serve is not None:
            serve.stop()
        prefill.kill()
        decode.kill()


def a_stop_across_the_hand_off(client: httpx.Client, model: str) -> None:
    """A stop string spanning the first and second tokens (the start of a greedy answer) ends the answer
    before it, streamed and not: the decode part starts from the text the prefill part held back."""
    greedy = {**chat(model, 6), "temperature": 0}
    answer = client.post("/v1/chat/completions", json=greedy).json()["choices"][0]["message"]["content"]
    body = {**greedy, "stop": [answer[:2]]}
    whole = client.post("/v1/chat/completions", json=body).json()
    assert whole["choices"][0]["message"]["content"] == "", whole
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert whole["usage"]["completion_tokens"] == 2  # spans the hand-off: one token on each engine
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert (text, reasons[-1]) == ("", "stop"), chunks
