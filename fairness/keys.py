"""Fairness keys: which identity a request's service is counted against (tenant, API key or end user)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fairness.errors import FairnessError

KeyFn = Callable[[Any], str]


def tenant_key(item: Any) -> str:
    """The tenant that owns the request."""
    return str(item.meta.tenant_id)


def api_key_key(item: Any) -> str:
    """The API key the request came with, or its tenant when it came without one."""
    meta = item.meta
    return str(meta.api_key_id) if meta.api_key_id else str(meta.tenant_id)


def user_key(item: Any) -> str:
    """The end user, namespaced by tenant (`tenant/user`), or the tenant when no user is given.

    End-user names are chosen by clients, so they are qualified by tenant: tenant A naming a
    user "alice" must not share (or drain) tenant B's "alice" counter.
    """
    meta = item.meta
    return f"{meta.tenant_id}/{meta.user}" if meta.user else str(meta.tenant_id)


KEY_FUNCTIONS: dict[str, KeyFn] = {"tenant": tenant_key, "api_key": api_key_key, "user": user_key}


def key_function(name: str) -> KeyFn:
    """The key function called `name` (tenant | api_key | user)."""
    try:
        return KEY_FUNCTIONS[name]
    except KeyError:
        choices = " | ".join(KEY_FUNCTIONS)
        raise FairnessError(f"unknown fairness key {name!r}; expected one of {choices}") from None
