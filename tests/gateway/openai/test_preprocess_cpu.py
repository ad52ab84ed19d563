"""Preprocessing CPU is the tenant's own, over real HTTP on the real engine (gateway/openai/preprocess.py):
charged as service in the ledger, served in fair order of what each tenant has spent, and refused 429
`preprocessing_busy` with Retry-After past its wait bound while another tenant is served."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.openai import preprocess
from tests.gateway.conftest import Server, wait_for

EMPTY = {"role": "user", "content": ""}
LARGE = 9000  # characters: over TOKENIZE_INLINE_CHARS, so tokenised through the gate


def _post(srv: Server, tenant: str, path: str, rid: str | None = None, **body: Any) -> httpx.Response:
    headers = srv.headers(tenant, **({"X-Request-Id": rid} if rid else {}))
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        return c.post(path, json={"model": srv.model, "max_tokens": 1, **body}, headers=headers)


def test_a_chats_preprocessing_cpu_is_charged_as_service_in_the_ledger(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 600 empty messages render to the same prompt as the completion of their token ids: the engine's
    # charges for the two are the same but for the chat's rendering, which the chat's row carries. Every
    # microsecond of it: with the free first 5 ms the chat's few milliseconds were sometimes all free on
    # a quick host (a clean run charged both rows 1,805), and the test is of the charge, not the allowance.
    monkeypatch.setattr(preprocess, "FREE_CPU_S", 0.0)
    tok = server.state.engine.tokenizer
    ids = tok.encode_rendered_chat(tok.apply_chat_template([dict(EMPTY)] * 600))
    assert len(ids) < server.state.engine.max_model_len - 1
    chat_id, ids_id = f"chat-{uuid.uuid4().hex}", f"ids-{uuid.uuid4().hex}"
    salt = uuid.uuid4().hex  # neither finds the other's prompt in the prefix cache
    chat = _post(server, "alice", "/v1/chat/completions", chat_id, messages=[EMPTY] * 600, cache_salt=salt)
    assert chat.status_code == 200, chat.text
    plain = _post(
        server, "alice", "/v1/completions", ids_id, prompt=ids, temperature=0, cache_salt=salt + "x"
    )
    assert plain.status_code == 200, plain.text
    assert chat.json()["usage"]["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"] == len(ids)
    rows = {r["request_id"]: r for r in server.usage_rows("request_id IN (:a, :b)", a=chat_id, b=ids_id)}
    assert rows[chat_id]["prompt_tokens"] == rows[ids_id]["prompt_tokens"]
    assert rows[chat_id]["charged_service"] > rows[ids_id]["charged_service"]


def _holding(
    srv: Server, monkeypatch: pytest.MonkeyPatch, spend_s: dict[str, float]
) -> tuple[threading.Event, list[str]]:
    """Patch the tokenizer's encode so a large prompt of letter L spends `spend_s[L]` seconds of its
    thread's CPU (the work under test), then, for `h`, holds its slot until the event is set; returns
    the event and the letters in the order their prompts were tokenised."""
    tok = srv.state.engine.tokenizer
    release, order = threading.Event(), []
    real = tok.encode

    def encode(text: str, *args: Any, **kwargs: Any) -> list[int]:
        letter = text[:1]
        if len(text) >= LARGE:
            order.append(letter)
            until = time.thread_time() + spend_s.get(letter, 0.0)
            while time.thread_time() < until:  # this tenant's preprocessing CPU
                pass
            if letter == "h":
                release.wait(30)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(tok, "encode", encode)
    return release, order


def _in_background(srv: Server, tenant: str, letter: str, answers: dict[str, int]) -> threading.Thread:
    def send() -> None:
        answers[letter] = _post(srv, tenant, "/v1/completions", prompt=letter * LARGE).status_code

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_a_free_slot_goes_to_the_tenant_that_has_spent_less(
    gateway: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = gateway(tokenize_workers=1, preprocess_cpu_share=1.0)
    release, order = _holding(srv, monkeypatch, {"a": 0.3})
    answers: dict[str, int] = {}
    _in_background(srv, "alice", "a", answers).join(60)  # alice spends 0.3 s of preprocessing CPU
    gate, tenants = srv.state.preprocess, srv.tenants
    assert gate.spent_s(tenants["alice"].id) >= 0.3
    threads = [_in_background(srv, "hog", "h", answers)]  # holds the only slot
    wait_for(lambda: order[-1:] == ["h"], 20, "hog's prompt holding the slot")
    threads.append(_in_background(srv, "alice", "a", answers))
    wait_for(lambda: gate.tokenizing_now(tenants["alice"].id) == 1, 20, "alice waiting")
    threads.append(_in_background(srv, "bob", "b", answers))  # after alice, but bob has spent nothing
    wait_for(lambda: gate.tokenizing_now(tenants["bob"].id) == 1, 20, "bob waiting")
    release.set()
    for t in threads:
        t.join(60)
    assert order == ["a", "h", "b", "a"]  # bob served before alice, who came first but had spent more
    assert answers == {"a": 400, "h": 400, "b": 400}  # 9,000 tokens: over the context, once tokenised


def test_a_tenant_whose_wait_passes_its_bound_gets_429_while_another_is_served(
    gateway: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = gateway(tokenize_workers=1, preprocess_max_wait_s=0.5)
    release, order = _holding(srv, monkeypatch, {})
    answers: dict[str, int] = {}
    holder = _in_background(srv, "hog", "h", answers)
    try:
        wait_for(lambda: order == ["h"], 20, "hog's prompt holding the only slot")
        refused = _post(srv, "alice", "/v1/completions", prompt="a" * LARGE)
        served = _post(srv, "bob", "/v1/completions", prompt="a short prompt")  # on the loop: not waiting
    finally:
        release.set()
        holder.join(60)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "preprocessing_busy"
    assert int(refused.headers["retry-after"]) >= 1
    assert order == ["h"]  # alice's prompt was refused before any of its work ran
    assert served.status_code == 200, served.text
    assert _post(srv, "alice", "/v1/completions", prompt="a short prompt").status_code == 200
