"""Every field a request carries is bounded, over real HTTP on the real engine: integers fit the engine's
wire types, identifiers fit their ledger columns, and the live view stays bounded however many fairness
keys the engine holds."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest

from billing.models import UsageRow
from engine.serving.boundary.messages import WIRE_INT_MAX
from gateway.openai.schemas import USER_MAX_CHARS
from tests.gateway.conftest import Server

HUGE = 2**70


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"top_k": HUGE}, "top_k"),
        ({"top_k": WIRE_INT_MAX + 1}, "top_k"),
        ({"max_tokens": HUGE}, "max_tokens"),
        ({"seed": HUGE}, "seed"),
        ({"stop_token_ids": [HUGE]}, "stop_token_ids.0"),
        ({"prompt": [1, HUGE]}, "prompt"),
        ({"best_of": HUGE}, "best_of"),
        ({"user": "u" * (USER_MAX_CHARS + 1)}, "user"),
    ],
)
def test_an_integer_beyond_the_wire_or_an_overlong_user_is_a_400_naming_it(
    server: Server, client: httpx.Client, body: dict[str, Any], param: str
) -> None:
    resp = client.post(
        "/v1/completions",
        json={"model": server.model, "prompt": "hi", "max_tokens": 2, **body},
        headers=server.headers("alice"),
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_chat_integers_are_bounded(server: Server, client: httpx.Client) -> None:
    resp = client.post(
        "/v1/chat/completions",
        json={
            "model": server.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": HUGE,
        },
        headers=server.headers("alice"),
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_completion_tokens", resp.text


@pytest.mark.parametrize(
    ("header", "column"), [("X-Task-Id", "task_id"), ("X-Workflow-Run-Id", "workflow_run_id")]
)
def test_identifier_headers_fit_their_ledger_columns(
    server: Server, client: httpx.Client, header: str, column: str
) -> None:
    width = getattr(UsageRow, column).type.length
    body = {"model": server.model, "prompt": "hi", "max_tokens": 1}
    over = client.post(
        "/v1/completions", json=body, headers=server.headers("alice", **{header: "t" * (width + 1)})
    )
    assert over.status_code == 400 and over.json()["error"]["param"] == header.lower(), over.text
    fits = client.post("/v1/completions", json=body, headers=server.headers("alice", **{header: "t" * width}))
    assert fits.status_code == 200, fits.text


def test_live_view_is_bounded_however_many_keys_the_engine_holds(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.state.engine
    real = engine.stats

    def crowded() -> Any:  # the engine's stats as a user-keyed flood would leave them
        stats = real()
        service = {**stats.service, **{f"user-{i}": float(i) for i in range(20_000)}}
        return dataclasses.replace(stats, service=service)

    monkeypatch.setattr(engine, "stats", crowded)
    token = server.state.admin_token
    for _ in range(2):  # the second snapshot also carries a share point of the crowded history
        resp = httpx.get(f"{server.url}/admin/api/live", headers={"Authorization": f"Bearer {token}"})
    snap = resp.json()
    assert snap["other_keys"] >= 20_000
    assert len(snap["other_service"]) == 50 and "user-19999" in snap["other_service"]
    assert len(resp.content) < 200_000  # 20,000 keys listed would be over 400 KB
