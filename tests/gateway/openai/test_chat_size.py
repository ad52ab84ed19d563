"""A chat's size is what its template renders, and its validation is bounded, over real HTTP on the real
engine: more messages (or text parts) than `--max-chat-messages` is a 400 naming `messages` before they
are validated; a chat whose rendered template proves it too long is refused without encoding, and the
template is rendered on the tokenising executor, not the event loop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.openai.body_shape import SHAPE_SCAN_BYTES, BodyCount, count_body
from tests.gateway.conftest import Server

EMPTY = {"role": "user", "content": ""}


def _chat(srv: Server, messages: list[Any], tenant: str = "alice") -> httpx.Response:
    body = {"model": srv.model, "max_tokens": 1, "messages": messages}
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        return c.post("/v1/chat/completions", json=body, headers=srv.headers(tenant))


def _refused(resp: httpx.Response, code: str) -> str:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and error["param"] == "messages", error
    return str(error["message"])


@pytest.mark.parametrize("count", [2049, 30_000])
def test_more_messages_than_the_cap_are_refused_naming_messages(server: Server, count: int) -> None:
    assert server.state.settings.max_chat_messages == 2048  # the default: OpenAI's own limit
    assert f"{count} messages; at most 2048" in _refused(_chat(server, [EMPTY] * count), "invalid_value")


def test_the_cap_counts_text_parts_and_small_bodies_alike(gateway: Callable[..., Server]) -> None:
    srv = gateway(max_chat_messages=8)
    parts = [{"type": "text", "text": "a"}] * 9
    assert "9 text parts" in _refused(_chat(srv, [{"role": "user", "content": parts}]), "invalid_value")
    assert "9 messages" in _refused(_chat(srv, [EMPTY] * 9), "invalid_value")  # a small body, counted after
    large = [{"role": "user", "content": "x" * (SHAPE_SCAN_BYTES // 8)}] * 9
    assert "9 messages" in _refused(_chat(srv, large), "invalid_value")  # a large one, counted before
    ok = _chat(srv, [{"role": "user", "content": parts[:4]}, {"role": "user", "content": "hi"}])
    assert ok.status_code == 200, ok.text


def test_counting_skims_whatever_shape_it_is_given() -> None:
    body = b'{"messages": [{"content": [1, 2]}, 7, {"role": "user"}], "stop": ["a"], "logit_bias": {"1": 0, "2": 0}}'
    assert count_body(body, 10) == BodyCount(3, 2, ("logit_bias", 2))
    assert count_body(b'{"messages": "no", "prompt": [1, 2, 3]}', 10) == BodyCount(0, 0, None, 3)
    assert count_body(b"[1]", 10) is None and count_body(b'{"messages": [', 10) is None  # pydantic's 400s


def test_any_field_with_more_entries_than_the_cap_is_refused_unvalidated(server: Server) -> None:
    bias = {str(i): 0 for i in range(100_000)}  # 1.2 MB... within the body cap once compact
    body = {
        "model": server.model,
        "prompt": "hi",
        "max_tokens": 1,
        "logit_bias": dict(list(bias.items())[:60_000]),
    }
    with httpx.Client(base_url=server.url, timeout=120) as c:
        resp = c.post("/v1/completions", json=body, headers=server.headers("alice"))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "logit_bias" and "60000 entries; at most 2048" in error["message"], error


def test_empty_messages_count_as_what_the_template_renders(
    gateway: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = gateway(max_chat_messages=40_000)
    tok = srv.state.engine.tokenizer
    rendered_on: list[str] = []
    encoded: list[int] = []
    real_render, real_encode = tok.apply_chat_template, tok.encode

    def render(*args: Any, **kwargs: Any) -> str:
        rendered_on.append(threading.current_thread().name)
        return real_render(*args, **kwargs)

    def encode(*args: Any, **kwargs: Any) -> list[int]:
        encoded.append(1)
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(tok, "apply_chat_template", render)
    monkeypatch.setattr(tok, "encode", encode)
    # 30,000 empty messages: no text at all, 300,014 rendered bytes (90,003 tokens)
    message = _refused(_chat(srv, [EMPTY] * 30_000), "context_length_exceeded")
    assert "300014 bytes" in message, message
    assert encoded == []  # proved too long by the rendered size: never encoded
    assert len(rendered_on) == 1 and rendered_on[0].startswith("fairserve-preprocess")
    assert _chat(srv, [EMPTY] * 3).status_code == 200  # a small chat is still rendered (inline) and served
    assert not rendered_on[1].startswith("fairserve-preprocess")


def test_a_token_prompt_longer_than_any_context_is_refused_unvalidated(server: Server) -> None:
    body = {"model": server.model, "prompt": [65] * 20_000, "max_tokens": 1}  # 60 KB, over the 32 KiB skim
    with httpx.Client(base_url=server.url, timeout=120) as c:
        resp = c.post("/v1/completions", json=body, headers=server.headers("alice"))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt", error
    assert f"the longest context served here is {server.state.engine.max_model_len}" in error["message"]
