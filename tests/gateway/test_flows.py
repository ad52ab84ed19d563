"""Two-level fair share over real HTTP on the real engine (8 seats, CPU): Sybil users and an agent's fan-out.

Each test runs its own gateway (bench/server.py) because the fairness key is an engine setting.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.flows import serve, tenant_service
from bench.server import LocalServer


@pytest.fixture()
def tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def body(server: LocalServer, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": server.model,
        "prompt": "fair share",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        **extra,
    }


def test_24_users_of_one_tenant_get_what_one_user_of_another_gets(tmp: Path) -> None:
    server = serve("tenant/user", tmp)
    stop = asyncio.Event()

    async def stream(client: httpx.AsyncClient, tenant: str, user: str) -> None:
        headers = {"Authorization": f"Bearer {server.keys[tenant]}"}
        while not stop.is_set():
            resp = await client.post("/v1/completions", json=body(server, 12, user=user), headers=headers)
            assert resp.status_code == 200, resp.text

    async def run() -> dict[str, float]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60.0) as client:
            tasks = [asyncio.create_task(stream(client, "A", f"a{i}")) for i in range(24)]
            tasks += [asyncio.create_task(stream(client, "B", "b")) for _ in range(24)]
            deadline = time.monotonic() + 120
            while sum(tenant_service(server).values()) < 6000:  # about 4 seconds of this engine
                assert time.monotonic() < deadline, "the engine served too little"
                await asyncio.sleep(0.05)
            service = tenant_service(server)
            stop.set()
            await asyncio.gather(*tasks)
            return service

    try:
        service = asyncio.run(run())
    finally:
        server.stop()
    assert service["A"] / service["B"] == pytest.approx(1.0, rel=0.1)


async def chat_beside_agent(server: LocalServer) -> int:
    """Queue B's load and A's 24 agent calls, then one chat call: agent calls that completed before it."""
    a = {"Authorization": f"Bearer {server.keys['A']}"}
    b = {"Authorization": f"Bearer {server.keys['B']}"}
    done: list[str] = []

    async def call(client: httpx.AsyncClient, headers: dict[str, str], workflow: str, tokens: int) -> None:
        payload = body(server, tokens)
        resp = await client.post(
            "/v1/completions", json=payload, headers={**headers, "X-Workflow-Run-Id": workflow}
        )
        assert resp.status_code == 200, resp.text
        done.append(workflow)

    async with httpx.AsyncClient(base_url=server.url, timeout=120.0) as client:
        load = [asyncio.create_task(call(client, b, "b", 16)) for _ in range(24)]
        load += [asyncio.create_task(call(client, a, "agent", 16)) for _ in range(24)]
        deadline = time.monotonic() + 60
        while server.engine.stats().waiting < 24:  # the agent's calls queue behind the 8 seats
            assert time.monotonic() < deadline, "the load never queued"
            await asyncio.sleep(0.01)
        await call(client, a, "chat", 4)
        ahead = done.count("agent")
        await asyncio.gather(*load)
    return ahead


def test_an_agents_queued_fan_out_does_not_delay_its_tenants_chat(tmp: Path) -> None:
    """Under `tenant` the chat waits for the agent calls queued before it; under `tenant/workflow` it does not."""
    counts = {}
    for key in ("tenant", "tenant/workflow"):
        path = tmp / key.replace("/", "-")
        path.mkdir()
        server = serve(key, path)
        try:
            counts[key] = asyncio.run(chat_beside_agent(server))
        finally:
            server.stop()
    print(f"\nagent calls completed before the chat: {counts}")
    assert counts["tenant"] >= 16  # FIFO inside the tenant: nearly all its queued agent calls go first
    assert counts["tenant/workflow"] <= 8  # at most the calls already running, plus the chat's fair turn


def test_a_flat_user_key_remembers_at_most_the_cap_of_invented_names(tmp: Path) -> None:
    """`--fairness-key user`: 40 invented user names over HTTP leave at most 4 user counters in the engine."""
    server = serve("user", tmp, max_flows_per_tenant=4)
    try:
        tenant_id = server.state.store.get_tenant("A").id  # type: ignore[union-attr]
        headers = {"Authorization": f"Bearer {server.keys['A']}"}
        with httpx.Client(base_url=server.url, timeout=60.0) as client:
            for i in range(40):
                resp = client.post(
                    "/v1/completions", json=body(server, 1, user=f"sybil-{i}"), headers=headers
                )
                assert resp.status_code == 200, resp.text
        user_keys = [k for k in server.engine.stats().service if k.startswith(f"{tenant_id}/")]
        assert 1 <= len(user_keys) <= 4, user_keys
    finally:
        server.stop()
