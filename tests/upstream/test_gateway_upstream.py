"""fairserve in front of an engine it does not own, over real HTTP: the official `openai` client → a real
gateway (`serve --upstream sim=URL`, SQLite ledger) → the vLLM simulator (bench/vllm_sim, a process of its
own that serves requests first come first served, one token per running request per step).

Two backlogged tenants of weights 3:1 split the tokens 3:1 at the client and in the ledger, where the engine
alone splits by request count; the ledger's tokens equal the engine's own count; a cancel mid-stream ends
the engine's request; a deadline that passes in the gateway's queue is a 503 with Retry-After; an upstream
killed mid-stream is a retryable error billed once; a 5xx before the first token is retried on the other
replica.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.vllm_sim.process import SimProcess, start_sim
from engine.core.tokenizer import Tokenizer
from engine.worker.loader import default_model_dir
from gateway.settings import GatewaySettings
from gateway.state import start_gateway_engine
from tests.gateway.conftest import Server, start_server, wait_for
from upstream import UpstreamSettings

MODEL = "sim"
TOKENIZER = Tokenizer.from_dir(default_model_dir())  # the gateway's, and transformers serve's model's


@dataclass
class Deployment:
    """The simulated engine(s) and the gateway in front of them."""

    sims: list[SimProcess]
    server: Server
    engine: Any

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.server.url + "/v1", api_key=self.server.keys[tenant], max_retries=0, timeout=60
        )

    def engine_records(self, sim: int = 0) -> dict[str, dict[str, Any]]:
        return {str(r["id"]): r for r in self.sims[sim].requests()}


def deploy(tmp_path: Path, sims: list[SimProcess], **upstream: Any) -> Deployment:
    settings = GatewaySettings(
        data_dir=tmp_path,
        port=0,
        key_cache_ttl_s=0.5,
        refusal_burst=100_000,
        upstream=UpstreamSettings(targets=[f"{MODEL}={sim.url}" for sim in sims], **upstream),
    )
    engine = start_gateway_engine(settings)
    server = start_server(settings, engine)
    server.add_tenant("heavy", weight=3.0)
    server.add_tenant("light", weight=1.0)
    return Deployment(sims, server, engine)


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    process = start_sim(model=MODEL, max_num_seqs=8, step_ms=10.0)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def deployment(tmp_path: Path, sim: SimProcess) -> Iterator[Deployment]:
    d = deploy(tmp_path, [sim])
    try:
        yield d
    finally:
        d.server.stop()
        d.engine.shutdown()


@dataclass
class Flood:
    """Closed-loop streaming clients per tenant; tokens counted client side, in and after a window."""

    deployment: Deployment
    clients: int
    max_tokens: int = 32
    model: str = MODEL
    tokens: dict[str, int] = field(default_factory=dict)  # every token each tenant received
    window: dict[str, int] = field(default_factory=dict)  # those received inside the measured window
    measuring: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[str] = field(default_factory=list)

    def run(self, tenant: str) -> None:
        client = self.deployment.client(tenant)
        while not self.stop.is_set():
            try:
                stream = client.completions.create(
                    model=self.model, prompt="fair share", max_tokens=self.max_tokens, stream=True
                )
                for chunk in stream:
                    if not (chunk.choices and chunk.choices[0].text):
                        continue
                    # The model's byte-level tokenizer: a chunk may carry several tokens.
                    n = len(TOKENIZER.encode(chunk.choices[0].text, add_special_tokens=False))
                    with self.lock:
                        self.tokens[tenant] = self.tokens.get(tenant, 0) + n
                        if self.measuring:
                            self.window[tenant] = self.window.get(tenant, 0) + n
            except openai.OpenAIError as exc:
                self.errors.append(repr(exc))
                return

    def total(self) -> int:
        with self.lock:
            return sum(self.tokens.values())


@pytest.fixture
def small_batch(tmp_path: Path) -> Iterator[Deployment]:
    """The simulator with a batch of 4: the window settles near 4, so 24 clients keep both tenants queued
    at the gateway (the bound's condition) even while the test's own client threads are slow to resend."""
    process = start_sim(model=MODEL, max_num_seqs=4, step_ms=10.0)
    d = deploy(tmp_path, [process])
    try:
        yield d
    finally:
        d.server.stop()
        d.engine.shutdown()
        process.stop()


def test_two_backlogged_tenants_of_weights_3_and_1_split_3_to_1_at_the_client_and_in_the_ledger(
    small_batch: Deployment,
) -> None:
    deployment = small_batch
    flood = Flood(deployment, clients=12)
    threads = [
        threading.Thread(target=flood.run, args=(tenant,), daemon=True)
        for tenant in ("heavy", "light")
        for _ in range(flood.clients)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: flood.total() >= 800, 120, "a warm-up of 800 tokens")
    began = time.time()
    flood.measuring = True
    wait_for(lambda: sum(flood.window.values()) >= 4000, 240, "4000 tokens in the measured window")
    flood.measuring = False
    ended = time.time()
    flood.stop.set()
    for thread in threads:
        thread.join(60)
    assert flood.errors == []
    share = flood.window["heavy"] / flood.window["light"]
    assert share == pytest.approx(3.0, rel=0.10), flood.window

    rows = deployment.server.usage_rows("1=1")
    tenant = {deployment.server.tenants[name].id: name for name in ("heavy", "light")}
    in_window: dict[str, int] = {"heavy": 0, "light": 0}
    billed: dict[str, int] = {"heavy": 0, "light": 0}
    for row in rows:
        billed[tenant[row["tenant_id"]]] += row["completion_tokens"]
        finished = _epoch(row["finished_at"])
        if began <= finished <= ended:
            in_window[tenant[row["tenant_id"]]] += row["completion_tokens"]
    assert in_window["heavy"] / in_window["light"] == pytest.approx(3.0, rel=0.10), in_window
    # Every token streamed is billed, and the ledger's tokens are the engine's own count.
    assert billed == flood.tokens
    engine = deployment.engine_records()
    assert sum(billed.values()) == sum(int(r["completion_tokens"]) for r in engine.values())
    assert len(rows) == len(engine)
    assert not any(row["counted_by_gateway"] for row in rows)


def _epoch(stored: Any) -> float:
    """A ledger timestamp (SQLite hands back the naive UTC text) as epoch seconds."""
    moment = stored if isinstance(stored, datetime) else datetime.fromisoformat(str(stored))
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def test_cancel_mid_stream_ends_the_engines_request_and_bills_what_was_received(
    deployment: Deployment,
) -> None:
    server = deployment.server
    body = {"model": MODEL, "prompt": "long", "max_tokens": 2000, "stream": True}
    headers = server.headers("light", **{"X-Request-Id": "to-cancel"})
    received = 0
    with (
        httpx.Client(base_url=server.url, timeout=60) as http,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:") and '"text"' in line:
                received += 1
                if received == 5:
                    break  # the client goes away mid-stream
    records = wait_for(
        lambda: [r for r in deployment.engine_records().values() if r["state"] == "aborted"],
        30,
        "the engine's request aborted",
    )
    assert len(records) == 1 and int(records[0]["completion_tokens"]) < 2000
    rows = wait_for(lambda: server.usage_rows("request_id = 'to-cancel'"), 30, "the ledger row")
    assert len(rows) == 1 and rows[0]["status"] == "cancelled"
    assert received <= rows[0]["completion_tokens"] <= int(records[0]["completion_tokens"])


def test_a_deadline_that_passes_in_the_gateways_queue_is_a_503_with_retry_after(
    tmp_path: Path, sim: SimProcess
) -> None:
    d = deploy(tmp_path, [sim], window_min=1, window_start=1, window_max=1)
    try:
        server = d.server
        hold = threading.Thread(
            target=lambda: httpx.post(
                server.url + "/v1/completions",
                json={"model": MODEL, "prompt": "hold", "max_tokens": 1500},
                headers=server.headers("heavy"),
                timeout=120,
            ),
            daemon=True,
        )
        hold.start()
        wait_for(lambda: d.engine_records(), 30, "the first request in the engine")
        late = httpx.post(
            server.url + "/v1/completions",
            json={"model": MODEL, "prompt": "late", "max_tokens": 4},
            headers=server.headers("light", **{"X-Request-Id": "late", "X-Timeout-Ms": "1500"}),
            timeout=60,
        )
        assert late.status_code == 503, late.text
        assert late.json()["error"]["code"] == "deadline_exceeded"
        assert int(late.headers["Retry-After"]) >= 1
        assert len(d.engine_records()) == 1  # the late one never reached the engine
        rows = server.usage_rows("request_id = 'late'")
        assert len(rows) == 1 and rows[0]["status"] == "deadline" and rows[0]["completion_tokens"] == 0
    finally:
        d.server.stop()
        d.engine.shutdown()


def test_an_upstream_killed_mid_stream_is_a_retryable_error_billed_once(deployment: Deployment) -> None:
    server = deployment.server
    body = {"model": MODEL, "prompt": "doomed", "max_tokens": 2000, "stream": True}
    headers = server.headers("heavy", **{"X-Request-Id": "doomed"})
    lines: list[str] = []
    with (
        httpx.Client(base_url=server.url, timeout=60) as http,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if sum('"text"' in x for x in lines) == 5:
                deployment.sims[0].kill()
    received = sum(1 for x in lines if '"text"' in x and '"error"' not in x)
    assert any('"engine_error"' in x or '"error"' in x for x in lines), lines[-3:]
    rows = server.usage_rows("request_id = 'doomed'")
    assert len(rows) == 1 and rows[0]["status"] == "error"
    assert rows[0]["completion_tokens"] >= received >= 5


def test_a_5xx_before_the_first_token_is_retried_once_on_the_other_replica(
    tmp_path: Path, sim: SimProcess
) -> None:
    other = start_sim(model=MODEL, max_num_seqs=8, step_ms=10.0)
    d = deploy(tmp_path, [sim, other])
    try:
        d.sims[0].fail_next(
            1, 503
        )  # the first replica is tried first (both idle); the retry goes to the other
        done = httpx.post(
            d.server.url + "/v1/completions",
            json={"model": MODEL, "prompt": "retry me", "max_tokens": 6},
            headers=d.server.headers("heavy", **{"X-Request-Id": "retried"}),
            timeout=60,
        )
        assert done.status_code == 200, done.text
        assert done.json()["usage"]["completion_tokens"] == 6
        assert [len(d.engine_records(i)) for i in range(2)] == [0, 1]
        rows = d.server.usage_rows("request_id = 'retried'")
        assert len(rows) == 1 and rows[0]["completion_tokens"] == 6
    finally:
        d.server.stop()
        d.engine.shutdown()
        other.stop()


def test_a_slow_upstream_ends_a_request_at_its_deadline_and_stops_the_engines_work(tmp_path: Path) -> None:
    """An engine at five tokens a second, slower than the gateway's estimate, which accepts the deadline:
    the stream's deadline passes in flight and it ends there with the tokens it has (finish reason
    deadline, as fairserve's engine ends one), the engine's request is aborted, the ledger holds them once."""
    slow = start_sim(model=MODEL, max_num_seqs=8, step_ms=200.0)
    d = deploy(tmp_path, [slow])
    try:
        server = d.server
        body = {"model": MODEL, "prompt": "slow", "max_tokens": 30, "stream": True}
        headers = server.headers("light", **{"X-Request-Id": "slow", "X-Timeout-Ms": "2500"})
        with (
            httpx.Client(base_url=server.url, timeout=60) as http,
            http.stream("POST", "/v1/completions", json=body, headers=headers) as response,
        ):
            assert response.status_code == 200, response.read()
            events = [line for line in response.iter_lines() if line.startswith("data: {")]
        received = sum(1 for line in events if '"text":"' in line and '"text":""' not in line)
        assert 1 <= received < 30 and '"finish_reason":"deadline"' in events[-1].replace(" ", "")
        records = wait_for(
            lambda: [r for r in d.engine_records().values() if r["state"] == "aborted"],
            30,
            "the engine's request aborted",
        )
        assert len(records) == 1 and int(records[0]["completion_tokens"]) < 30
        rows = wait_for(lambda: server.usage_rows("request_id = 'slow'"), 30, "the ledger row")
        assert len(rows) == 1 and rows[0]["status"] == "deadline"
        assert received <= rows[0]["completion_tokens"] <= int(records[0]["completion_tokens"])
    finally:
        d.server.stop()
        d.engine.shutdown()
        slow.stop()
