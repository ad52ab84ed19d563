"""Refusal is cheap and charged, over real HTTP on the real engine: a prompt proved too long by its size is
refused without tokenising, large prompts are tokenised under a per-tenant bound, and refused requests
spend a per-tenant budget answered 429 + Retry-After."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Server, wait_for


def _post(srv: Server, tenant: str, path: str = "/v1/completions", **body: Any) -> httpx.Response:
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        return c.post(path, json={"model": srv.model, "max_tokens": 1, **body}, headers=srv.headers(tenant))


def _counting(real: Callable[..., list[int]], calls: list[int]) -> Callable[..., list[int]]:
    def counted(*args: Any, **kwargs: Any) -> list[int]:
        calls.append(1)
        return real(*args, **kwargs)

    return counted


def test_a_prompt_too_long_by_its_size_is_refused_without_tokenising(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = server.state.engine.tokenizer
    encoded: list[int] = []
    for name in ("encode", "encode_chat"):
        monkeypatch.setattr(tok, name, _counting(getattr(tok, name), encoded))
    proof = (server.state.engine.max_model_len - 1) * tok.longest_token_bytes
    resp = _post(server, "bob", prompt="x" * (proof + 1))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "context_length_exceeded"
    assert resp.json()["error"]["param"] == "prompt"
    chat = _post(server, "bob", "/v1/chat/completions", messages=[{"role": "user", "content": "y" * proof}])
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages", chat.text
    assert encoded == []  # neither was tokenised
    assert _post(server, "bob", prompt="z" * 9000).status_code == 400  # over the context, found by encoding
    assert encoded == [1]


def test_large_prompts_of_one_tenant_are_tokenised_under_its_bound(
    gateway: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = gateway(tokenize_concurrency_per_tenant=2, tokenize_workers=4)
    tok = srv.state.engine.tokenizer
    release = threading.Event()
    inside: list[int] = []
    real = tok.encode

    def held(*args: Any, **kwargs: Any) -> list[int]:
        inside.append(1)
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(tok, "encode", held)
    tenant = srv.tenants["alice"].id
    answers: list[int] = []
    threads = [
        threading.Thread(target=lambda: answers.append(_post(srv, "alice", prompt="w" * 9000).status_code))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: srv.state.preprocess.tokenizing_now(tenant) == 4, 20, "four large prompts in")
        wait_for(lambda: len(inside) == 2, 20, "two tokenising")
        assert len(inside) == 2  # the other two wait for the tenant's slots
    finally:
        release.set()
    for t in threads:
        t.join(60)
    assert len(inside) == 4 and sorted(answers) == [400] * 4  # 9,000 tokens: over the context
    assert srv.state.preprocess.tokenizing_now(tenant) == 0


def test_refused_requests_spend_a_per_tenant_budget(gateway: Callable[..., Server]) -> None:
    srv = gateway(refusal_burst=3, refusal_rate_per_s=0.2)
    bad = [_post(srv, "alice", prompt="hi", top_p=5).status_code for _ in range(3)]
    assert bad == [400, 400, 400]
    limited = _post(srv, "alice", prompt="hi")  # even a good request waits out the budget
    assert limited.status_code == 429, limited.text
    assert limited.json()["error"]["code"] == "too_many_refusals"
    assert 1 <= int(limited.headers["retry-after"]) <= 5
    assert _post(srv, "bob", prompt="hi").status_code == 200  # another tenant is not charged


def test_a_spent_tenant_is_refused_before_its_body_is_read(gateway: Callable[..., Server]) -> None:
    srv = gateway(refusal_burst=1, refusal_rate_per_s=0.2)
    assert _post(srv, "alice", prompt="hi", top_p=5).status_code == 400
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {srv.keys['alice']}\r\n"
            "Content-Type: application/json\r\nContent-Length: 200000\r\n\r\n"
        )
        sock.sendall(head.encode())  # and none of the 200,000 bytes it announces
        reply = b""
        while chunk := sock.recv(65536):  # the server closes after its answer
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 429"), reply[:200]
    assert b"too_many_refusals" in reply and b"connection: close" in reply.lower()
