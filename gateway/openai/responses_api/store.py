"""Stored responses, for `previous_response_id` and `GET /v1/responses/{id}`: in memory, per gateway, per tenant.

Kept in this process, not in SQL: a stored response is the conversation a later request continues (its chat
turns) and the Response body, written once at the reply's end and read back by the same client within a
conversation, which an agent runs against one gateway; SQL would add a write per response for a read that
rarely comes. Behind several replicas without session affinity a continuation can reach a gateway that
never saw the response: it gets the same 404 as an unknown id (docs/gateway.md, "The Responses API").

Each tenant has a bounded store of its own (least recently used evicted first, by count and by the size of
what it holds), so one tenant's traffic never evicts another's responses, and the memory is at most the
tenants times the bound. The key is (tenant, response id): another tenant's id is not found, exactly as an
unknown one.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    """A finished response: the chat turns a continuation starts from, and the Response body."""

    turns: list[dict[str, Any]]  # every turn but the instructions (OpenAI does not carry those over)
    response: dict[str, Any]
    size: int  # characters of both as JSON: what the tenant's byte bound counts


class _TenantStore:
    def __init__(self) -> None:
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.size = 0


class ResponseStore:
    """Per-tenant LRU stores of finished responses, each bounded by `entries` and `chars`."""

    def __init__(self, entries: int, chars: int) -> None:
        self.max_entries = entries
        self.max_chars = chars
        self._tenants: dict[str, _TenantStore] = {}

    def put(
        self, tenant_id: str, response_id: str, turns: list[dict[str, Any]], response: dict[str, Any]
    ) -> bool:
        """Keep a response; False (not kept) when it alone is over the tenant's bound."""
        size = len(json.dumps(turns)) + len(json.dumps(response))
        if size > self.max_chars or self.max_entries < 1:
            return False
        store = self._tenants.setdefault(tenant_id, _TenantStore())
        old = store.entries.pop(response_id, None)
        if old is not None:
            store.size -= old.size
        store.entries[response_id] = StoredResponse(turns, response, size)
        store.size += size
        while len(store.entries) > self.max_entries or store.size > self.max_chars:
            _, evicted = store.entries.popitem(last=False)
            store.size -= evicted.size
        return True

    def get(self, tenant_id: str, response_id: str) -> StoredResponse | None:
        """The tenant's response by id (another tenant's is None, as an unknown one)."""
        store = self._tenants.get(tenant_id)
        found = None if store is None else store.entries.get(response_id)
        if found is not None and store is not None:
            store.entries.move_to_end(response_id)
        return found

    def delete(self, tenant_id: str, response_id: str) -> bool:
        """Forget the tenant's response; False when it has none of that id."""
        store = self._tenants.get(tenant_id)
        found = None if store is None else store.entries.pop(response_id, None)
        if found is None or store is None:
            return False
        store.size -= found.size
        return True
