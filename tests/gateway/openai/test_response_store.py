"""The stored Responses' bounds: per tenant, by count and by size, least recently used first, so one tenant's
traffic never evicts another's, and another tenant's id is simply not there."""

from __future__ import annotations

from typing import Any

from gateway.openai.responses_api.store import ResponseStore


def _response(rid: str, text: str = "x") -> dict[str, Any]:
    return {"id": rid, "output": [text]}


def test_a_tenants_flood_evicts_only_its_own_oldest() -> None:
    store = ResponseStore(entries=3, chars=10_000)
    store.put("b", "resp_b", [], _response("resp_b"))
    for i in range(10):
        store.put("a", f"resp_a{i}", [], _response(f"resp_a{i}"))
    assert store.get("b", "resp_b") is not None
    assert [i for i in range(10) if store.get("a", f"resp_a{i}") is not None] == [7, 8, 9]
    assert store.get("a", "resp_b") is None and store.get("b", "resp_a9") is None


def test_the_size_bound_evicts_the_least_recently_used() -> None:
    store = ResponseStore(entries=100, chars=200)
    store.put("a", "old", [], _response("old", "y" * 60))
    store.put("a", "mid", [], _response("mid", "y" * 60))
    assert store.get("a", "old") is not None  # now the most recently used
    store.put("a", "new", [], _response("new", "y" * 60))
    assert store.get("a", "mid") is None and store.get("a", "old") is not None
    assert not store.put("a", "huge", [], _response("huge", "y" * 500))  # alone over the bound: not kept
    assert store.get("a", "huge") is None and store.get("a", "new") is not None


def test_delete_is_per_tenant() -> None:
    store = ResponseStore(entries=4, chars=10_000)
    store.put("a", "r", [{"role": "user", "content": "hi"}], _response("r"))
    assert not store.delete("b", "r")
    assert store.delete("a", "r") and store.get("a", "r") is None and not store.delete("a", "r")
