"""Public prefixes over real HTTP on the real engine: the admin registers a system prompt, every tenant's
request that starts with it reuses its blocks, nothing after it is shared, and tenants cannot touch the
registry. Usage reports public and private cache hits separately."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.prefixes import PrefixRegistry
from tests.gateway.conftest import Server


@pytest.fixture()
def admin(server: Server) -> Iterator[httpx.Client]:
    """A client that sends the admin token."""
    headers = {"Authorization": f"Bearer {server.state.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
        yield c


def _details(client: httpx.Client, server: Server, tenant: str, prompt: str) -> dict[str, int]:
    resp = client.post(
        "/v1/completions",
        json={"model": server.model, "prompt": prompt, "max_tokens": 1},
        headers=server.headers(tenant),
    )
    assert resp.status_code == 200, resp.text
    details: dict[str, int] = resp.json()["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] == details["public_cached_tokens"] + details["private_cached_tokens"]
    return details


def _register(admin: httpx.Client, server: Server, **body: Any) -> httpx.Response:
    return admin.post("/admin/api/prefixes", json={"model": server.model, **body})


def test_a_registered_prefix_is_shared_and_what_follows_it_is_not(
    server: Server, client: httpx.Client, admin: httpx.Client
) -> None:
    system = f"You are the helpdesk of {uuid.uuid4().hex}. Answer politely and briefly. " * 5 + "\n"
    name = f"helpdesk-{uuid.uuid4().hex[:6]}"
    created = _register(admin, server, name=name, text=system)
    assert created.status_code == 201, created.text
    assert created.json()["tokens"] >= 300
    secret = f"alice account {uuid.uuid4().hex} pin 4821. " * 4
    first = _details(client, server, "alice", system + secret)
    assert first["private_cached_tokens"] == 0
    bob = _details(client, server, "bob", system + secret)  # alice's exact prompt, from bob
    assert bob["public_cached_tokens"] >= 256  # the system prompt: computed once, for everyone
    assert bob["private_cached_tokens"] == 0  # alice's suffix stays hers
    again = _details(client, server, "alice", system + secret)
    assert again["public_cached_tokens"] == bob["public_cached_tokens"]
    assert again["private_cached_tokens"] >= 128  # her own blocks after the prefix still hit
    listed = admin.get("/admin/api/prefixes").json()["prefixes"]
    assert name in [p["name"] for p in listed]
    # The registry is in SQL: a fresh registry on the same database (a restart, another gateway) has it.
    assert name in [p.name for p in PrefixRegistry(server.state.db).reload()]
    removed = admin.delete(f"/admin/api/prefixes/{name}", params={"model": server.model})
    assert removed.status_code == 200, removed.text
    other = f"carol question {uuid.uuid4().hex}"
    assert _details(client, server, "bob", system + other)["public_cached_tokens"] == 0
    assert admin.delete(f"/admin/api/prefixes/{name}").status_code == 404


def test_a_partial_prefix_is_no_match(server: Server, client: httpx.Client, admin: httpx.Client) -> None:
    """A tenant that knows only the start of a registered prompt learns nothing from usage."""
    system = f"Internal runbook {uuid.uuid4().hex}: escalate to tier two. " * 8
    assert _register(admin, server, name=f"runbook-{uuid.uuid4().hex[:6]}", text=system).status_code == 201
    _details(client, server, "alice", system + " hello")
    half = system[: len(system) // 2]
    assert _details(client, server, "bob", half + " what comes next?")["cached_tokens"] == 0


def test_token_ids_register_and_bad_bodies_name_the_field(server: Server, admin: httpx.Client) -> None:
    ids = server.state.engine.tokenizer.encode(f"ids prefix {uuid.uuid4().hex} " * 3)
    name = f"ids-{uuid.uuid4().hex[:6]}"
    assert _register(admin, server, name=name, token_ids=ids).status_code == 201
    duplicate = _register(admin, server, name=name, token_ids=ids)
    assert duplicate.status_code == 409 and duplicate.json()["error"]["param"] == "name"
    for body, field in (
        ({"name": "x", "text": "abc", "colour": 1}, "colour"),
        ({"name": "x"}, "text"),
        ({"name": "x", "text": "abc", "token_ids": [1, 2]}, "text"),
        ({"name": "", "text": "abc"}, "name"),
        ({"name": "x", "token_ids": [1, -2]}, "token_ids"),
        ({"name": "x", "token_ids": [1]}, "token_ids"),
        ({"name": "x", "token_ids": "1,2"}, "token_ids"),
        ({"name": "x", "text": ""}, "text"),
    ):
        resp = _register(admin, server, **body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == field, (body, resp.text)
    wrong_model = admin.post("/admin/api/prefixes", json={"model": "nope", "name": "x", "text": "abc"})
    assert wrong_model.status_code == 400 and wrong_model.json()["error"]["param"] == "model"
    assert admin.delete(f"/admin/api/prefixes/{name}").status_code == 200
