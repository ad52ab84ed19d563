"""fairserve in front of a real engine no one here wrote: `transformers serve --continuous-batching` on the
embedded model, offline (tests/peers/fixtures.py). It has no /metrics and streams usage only once, at the
end, so the gateway's own in-flight window and its counting are what is exercised. Two tenants of weights
3:1, twelve streaming clients each, both backlogged, the upstream settings at their defaults (a window
without metrics stays under `window_max_unmetered`, docs/upstream.md): 3:1 ± 10% at the client and in the
ledger, and the ledger's tokens equal the usage the clients were given."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from bench.transformers_peer import TransformersServe
from gateway.settings import GatewaySettings
from gateway.state import start_gateway_engine
from tests.gateway.conftest import Server, start_server, wait_for
from tests.upstream.test_gateway_upstream import _epoch
from upstream import UpstreamSettings

pytestmark = [pytest.mark.slow, pytest.mark.serial]
TENANTS = ("heavy", "light")


@pytest.fixture
def fronted(tmp_path: Path, transformers_engine: TransformersServe) -> Iterator[tuple[Server, object]]:
    settings = GatewaySettings(
        data_dir=tmp_path,
        port=0,
        key_cache_ttl_s=0.5,
        refusal_burst=100_000,
        upstream=UpstreamSettings(targets=[f"tiny={transformers_engine.url}"]),
    )
    engine = start_gateway_engine(settings)
    server = start_server(settings, engine)
    server.add_tenant("heavy", weight=3.0)
    server.add_tenant("light", weight=1.0)
    try:
        yield server, engine
    finally:
        server.stop()
        engine.shutdown()


@dataclass
class UsageFlood:
    """Closed-loop streaming clients; each request's tokens are the usage its stream ends with (the random
    model's bytes are often no whole character, so the engine merges them and text miscounts tokens)."""

    server: Server
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TENANTS, 0))
    window: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TENANTS, 0))
    measuring: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[str] = field(default_factory=list)

    def run(self, tenant: str) -> None:
        client = openai.OpenAI(
            base_url=self.server.url + "/v1", api_key=self.server.keys[tenant], max_retries=0, timeout=120
        )
        while not self.stop.is_set():
            try:
                stream = client.completions.create(
                    model="tiny",
                    prompt="fair share",
                    max_tokens=16,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                for chunk in stream:
                    if chunk.usage is not None:
                        with self.lock:
                            self.tokens[tenant] += chunk.usage.completion_tokens
                            if self.measuring:
                                self.window[tenant] += chunk.usage.completion_tokens
            except openai.OpenAIError as exc:
                self.errors.append(repr(exc))
                return


def test_weights_3_and_1_split_3_to_1_in_front_of_transformers_serve(fronted: tuple[Server, object]) -> None:
    server, _ = fronted
    flood = UsageFlood(server)
    threads = [threading.Thread(target=flood.run, args=(t,), daemon=True) for t in TENANTS for _ in range(12)]
    for thread in threads:
        thread.start()
    wait_for(lambda: sum(flood.tokens.values()) >= 800, 300, "a warm-up of 800 tokens")
    began = time.time()
    flood.measuring = True
    wait_for(lambda: sum(flood.window.values()) >= 6000, 900, "6000 tokens in the measured window")
    flood.measuring = False
    ended = time.time()
    flood.stop.set()
    for thread in threads:
        thread.join(120)
    assert flood.errors == []
    assert flood.window["heavy"] / flood.window["light"] == pytest.approx(3.0, rel=0.10), flood.window
    tenant = {server.tenants[name].id: name for name in TENANTS}
    in_window = dict.fromkeys(TENANTS, 0)
    billed = dict.fromkeys(TENANTS, 0)
    for row in server.usage_rows("1=1"):
        billed[tenant[row["tenant_id"]]] += row["completion_tokens"]
        if began <= _epoch(row["finished_at"]) <= ended:
            in_window[tenant[row["tenant_id"]]] += row["completion_tokens"]
    assert in_window["heavy"] / in_window["light"] == pytest.approx(3.0, rel=0.10), in_window
    assert billed == flood.tokens
