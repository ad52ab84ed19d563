"""Tenant isolation over real HTTP: poison values fail alone, caps answer 400 naming the field, and the
prefix cache tells one tenant nothing about another's prompts."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Server
from tests.gateway.serve_process import ServeProcess


def _complete(client: httpx.Client, server: Server, tenant: str, **body: Any) -> httpx.Response:
    return client.post(
        "/v1/completions", json={"model": server.model, **body}, headers=server.headers(tenant)
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stop": [f"s{i}" for i in range(17)]}, "stop"),
        ({"stop": ["x" * 257]}, "stop"),
        ({"logit_bias": {str(i): 1.0 for i in range(301)}}, "logit_bias"),
        ({"logit_bias": {"abc": 1.0}}, "logit_bias"),
        ({"logit_bias": {"5": 250.0}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1.0}}, "logit_bias"),
        ({"n": 9}, "n"),  # over RequestCaps.max_n (8)
        ({"logprobs": 6}, "logprobs"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"temperature": -1}, "temperature"),
        ({"prompt": "x" * (256 * 1024 + 1)}, "prompt"),
        ({"stop_token_ids": list(range(65))}, "stop_token_ids"),
    ],
)
def test_over_a_cap_or_out_of_range_is_a_400_naming_the_field(
    server: Server, client: httpx.Client, body: dict[str, Any], field: str
) -> None:
    resp = _complete(client, server, "alice", **{"prompt": "hi", "max_tokens": 2, **body})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field


def test_chat_top_logprobs_and_oversized_messages_are_refused(server: Server, client: httpx.Client) -> None:
    base = {"model": server.model, "max_tokens": 2}
    for body, field in (
        ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "é" * (128 * 1024 + 1)}]}, "messages"),
    ):
        resp = client.post("/v1/chat/completions", json={**base, **body}, headers=server.headers("alice"))
        assert resp.status_code == 400 and resp.json()["error"]["param"] == field, resp.text


def test_tiny_temperature_and_extreme_seeds_are_served(server: Server, client: httpx.Client) -> None:
    for extra in (
        {"temperature": 1e-39},
        {"temperature": 5e-324, "seed": 2**64 - 1},
        {"seed": -(2**63)},
        {"temperature": 1e-6, "logit_bias": {"65": 100}},
    ):
        resp = _complete(client, server, "alice", prompt="hello", max_tokens=3, ignore_eos=True, **extra)
        assert resp.status_code == 200, (extra, resp.text)
        assert resp.json()["choices"][0]["finish_reason"] == "length"


def _cached(client: httpx.Client, server: Server, tenant: str, prompt: str, **extra: Any) -> int:
    resp = _complete(client, server, tenant, prompt=prompt, max_tokens=1, **extra)
    assert resp.status_code == 200, resp.text
    return int(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_the_prefix_cache_is_isolated_by_tenant(server: Server, client: httpx.Client) -> None:
    secret = f"account {uuid.uuid4().hex} pin 4821. " * 6  # ~300 byte-level tokens, unseen before
    assert _cached(client, server, "alice", secret) == 0
    assert _cached(client, server, "alice", secret) >= 256  # the owner's repeat hits its own blocks
    assert _cached(client, server, "bob", secret) == 0  # another tenant learns nothing
    assert _cached(client, server, "alice", secret, cache_salt="job-1") == 0  # a salt narrows further
    assert _cached(client, server, "alice", secret, cache_salt="job-1") >= 256


def test_tenants_in_one_cache_group_share(server: Server, client: httpx.Client) -> None:
    names = [f"org-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    admin = {"Authorization": f"Bearer {server.state.admin_token}"}
    keys = []
    for name in names:
        assert (
            client.post(
                "/admin/api/tenants", json={"name": name, "cache_group": "acme"}, headers=admin
            ).status_code
            == 201
        )
        keys.append(client.post(f"/admin/api/tenants/{name}/keys", json={}, headers=admin).json()["secret"])
    shared = f"system prompt of acme {uuid.uuid4().hex}. " * 6
    for key, want_hit in zip(keys, (False, True), strict=True):
        server.keys[key] = key
        got = _cached(client, server, key, shared)
        assert (got >= 256) is want_hit, got
    assert _cached(client, server, "bob", shared) == 0  # outside the group
    # Leaving the group (null) puts the tenant back on its own blocks.
    patched = client.patch(f"/admin/api/tenants/{names[1]}", json={"cache_group": None}, headers=admin)
    assert patched.status_code == 200 and patched.json()["cache_group"] is None
    bad = client.patch(f"/admin/api/tenants/{names[1]}", json={"cache_group": "no spaces"}, headers=admin)
    assert bad.status_code == 400


POISON: list[dict[str, Any]] = [
    {"temperature": 1e-39},
    {"temperature": 5e-324},
    {"seed": 2**64},
    {"seed": 2**70},
    {"seed": -(2**63) - 1},
    {"temperature": 1e-30, "seed": 2**64 - 1},
    {"top_p": 1e-300, "temperature": 1e-20},
    {"logit_bias": {"1": -100, "2": 100}, "temperature": 1e-38},
    {"stop": ["\u0000", "\U0001f642", "ab" * 128]},
]


def test_poison_values_fail_alone_while_another_tenant_streams(tmp_path: Path) -> None:
    """`fairserve serve` with its engine worker process: each poison value is answered (200 or a 400 naming
    the field) while another tenant's stream completes normally and /readyz never drops."""
    serve = ServeProcess(tmp_path)
    ready_codes: list[int] = []
    stop = threading.Event()
    try:
        admin = {"Authorization": f"Bearer {serve.banner['admin_token']}"}
        with httpx.Client(base_url=serve.url, timeout=60) as client:
            assert (
                client.post("/admin/api/tenants", json={"name": "victim"}, headers=admin).status_code == 201
            )
            victim = client.post("/admin/api/tenants/victim/keys", json={}, headers=admin).json()["secret"]
            attacker = serve.headers(serve.banner["api_key"])
            model = client.get("/v1/models", headers=attacker).json()["data"][0]["id"]

            def watch_ready() -> None:
                with httpx.Client(base_url=serve.url, timeout=10) as c:
                    while not stop.is_set():
                        ready_codes.append(c.get("/readyz").status_code)

            watcher = threading.Thread(target=watch_ready, daemon=True)
            watcher.start()
            body = {"model": model, "prompt": "victim", "max_tokens": 200, "ignore_eos": True, "stream": True}
            with client.stream("POST", "/v1/completions", json=body, headers=serve.headers(victim)) as resp:
                lines = resp.iter_lines()
                assert next(line for line in lines if line).startswith("data: {")  # the victim is decoding
                for poison in POISON:
                    raw = json.dumps({"model": model, "prompt": "poison", "max_tokens": 4, **poison})
                    answer = client.post(
                        "/v1/completions",
                        content=raw,
                        headers={**attacker, "Content-Type": "application/json"},
                    )
                    assert answer.status_code in (200, 400), (poison, answer.text)
                    if answer.status_code == 400:
                        assert answer.json()["error"]["param"] in poison, (poison, answer.text)
                    else:
                        assert answer.json()["choices"][0]["finish_reason"] in ("length", "stop"), poison
                events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
            stop.set()
            watcher.join(10)
            assert events[-1]["choices"][0]["finish_reason"] == "length"
            assert "error" not in events[-1]
            assert ready_codes and set(ready_codes) == {200}
    finally:
        stop.set()
        serve.stop()


def test_a_request_whose_sampling_raises_ends_alone_with_an_error(
    server: Server, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injected into the real engine's sampler for bob's requests only: bob's stream gets finish_reason
    "error", an error event and a ledger row with status error; alice's concurrent request completes."""
    sampler = server.state.engine.engine.runner.sampler  # type: ignore[attr-defined]
    real = sampler._plan_row
    bob = server.tenants["bob"].id

    def faulty(request: Any, vocab: int, device: Any) -> Any:
        if request.meta.tenant_id == bob:
            raise RuntimeError("injected sampling fault")
        return real(request, vocab, device)

    monkeypatch.setattr(sampler, "_plan_row", faulty)
    result: dict[str, Any] = {}

    def alice() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as own:
            result["alice"] = _complete(
                own, server, "alice", prompt="fine", max_tokens=24, ignore_eos=True, temperature=0.9
            )

    thread = threading.Thread(target=alice)
    thread.start()
    request_id = f"faulty-{uuid.uuid4().hex[:8]}"
    body = {
        "model": server.model,
        "prompt": "doomed",
        "max_tokens": 24,
        "ignore_eos": True,
        "temperature": 0.9,
        "stream": True,
    }
    with client.stream(
        "POST", "/v1/completions", json=body, headers=server.headers("bob", **{"X-Request-Id": request_id})
    ) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    thread.join(60)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "engine_error"
    assert json.loads(events[-3])["choices"][0]["finish_reason"] == "error"
    assert result["alice"].status_code == 200
    assert result["alice"].json()["choices"][0]["finish_reason"] == "length"
    rows = server.usage_rows("request_id = :rid", rid=request_id)
    assert [r["status"] for r in rows] == ["error"]
    assert server.state.engine.is_alive
