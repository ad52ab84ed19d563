"""Request ids are scoped to the tenant: another tenant can neither probe nor squat an id (real HTTP)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import Server, wait_for


def _body(server: Server, **kw: object) -> dict[str, Any]:
    return {"model": server.model, "prompt": "hello", "max_tokens": 2, **kw}


def _post(client: httpx.Client, server: Server, tenant: str, request_id: str) -> httpx.Response:
    return client.post(
        "/v1/completions", json=_body(server), headers=server.headers(tenant, **{"X-Request-Id": request_id})
    )


def test_b_cannot_probe_a_finished_id(server: Server, client: httpx.Client) -> None:
    rid = f"probe-{uuid.uuid4().hex[:8]}"
    assert _post(client, server, "alice", rid).status_code == 200
    again = _post(client, server, "alice", rid)
    assert again.status_code == 409 and again.json()["error"]["code"] == "duplicate_request_id"  # own reuse
    bob = _post(client, server, "bob", rid)  # would have been 409 with global ids: that revealed alice's use
    assert bob.status_code == 200, bob.text
    assert bob.headers["x-request-id"] == rid
    rows = server.usage_rows("request_id = :r", r=rid)
    assert sorted(r["tenant_id"] for r in rows) == sorted(
        [server.tenants["alice"].id, server.tenants["bob"].id]
    )


def test_b_cannot_squat_an_id_a_uses_later(server: Server, client: httpx.Client) -> None:
    rid = f"squat-{uuid.uuid4().hex[:8]}"
    assert _post(client, server, "bob", rid).status_code == 200  # bob takes the predictable id first
    alice = _post(client, server, "alice", rid)
    assert alice.status_code == 200, alice.text
    assert len(server.usage_rows("request_id = :r", r=rid)) == 2


def test_b_cannot_probe_or_cancel_a_live_id(server: Server, client: httpx.Client) -> None:
    rid = f"live-{uuid.uuid4().hex[:8]}"
    done: list[int] = []
    long = _body(server, max_tokens=300, ignore_eos=True)

    def alice_long() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            done.append(
                c.post(
                    "/v1/completions", json=long, headers=server.headers("alice", **{"X-Request-Id": rid})
                ).status_code
            )

    t = threading.Thread(target=alice_long)
    t.start()
    try:
        server.engine_id("alice", rid)  # alice's request is live
        assert (tenant_b := _post(client, server, "bob", rid)).status_code == 200, tenant_b.text
        assert client.post(f"/v1/requests/{rid}/cancel", headers=server.headers("bob")).status_code == 404
        dup = _post(client, server, "alice", rid)
        assert dup.status_code == 409 and dup.json()["error"]["code"] == "duplicate_request_id"
    finally:
        client.post(f"/v1/requests/{rid}/cancel", headers=server.headers("alice"))
        t.join(60)
    assert done == [200]
    wait_for(lambda: len(server.usage_rows("request_id = :r", r=rid)) == 2, 10, "both rows")


def test_an_id_outside_the_alphabet_is_a_400_naming_it(server: Server) -> None:
    """Issue 54: an X-Request-Id the client cannot cancel or read back by (a `/`, a space, `.` or `..`, over
    128 characters) was silently replaced by a generated one; now it is refused as task ids are, on both
    endpoints, streamed or not, through the official client."""
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0)
    for bad in ("a/b", "has space", ".", "..", "r" * 129):
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as info:
                oa.completions.create(
                    model=server.model,
                    prompt="hi",
                    max_tokens=2,
                    stream=stream,
                    extra_headers={"X-Request-Id": bad},
                )
            assert info.value.param == "x-request-id" and info.value.code == "invalid_header", bad
            with pytest.raises(openai.BadRequestError) as chat:
                oa.chat.completions.create(
                    model=server.model,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=2,
                    stream=stream,
                    extra_headers={"X-Request-Id": bad},
                )
            assert chat.value.param == "x-request-id", bad
    good = f"a.b:c-{uuid.uuid4().hex[:8]}"
    answer = oa.completions.with_raw_response.create(
        model=server.model, prompt="hi", max_tokens=2, extra_headers={"X-Request-Id": good}
    )
    assert answer.headers["x-request-id"] == good
