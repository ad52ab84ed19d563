"""Fairness keys: which identity a request's service is counted against (tenant, API key or end user).

A two-level key `tenant/<flow>` (docs/fairness.md, "Two levels") keeps fair share among tenants and,
inside each tenant, among its flows: `user` (the request's end user), `workflow` (its X-Workflow-Run-Id)
or `api_key`. A request without one belongs to its tenant's unnamed flow, "".
"""

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


def user_flow(item: Any) -> str:
    """The request's end user ("" when it names none)."""
    return str(item.meta.user or "")


def workflow_flow(item: Any) -> str:
    """The request's X-Workflow-Run-Id ("" when it has none)."""
    return str(getattr(item.meta, "workflow_run_id", None) or "")


def api_key_flow(item: Any) -> str:
    """The API key the request came with ("" when none)."""
    return str(item.meta.api_key_id or "")


FLOW_FUNCTIONS: dict[str, KeyFn] = {"user": user_flow, "workflow": workflow_flow, "api_key": api_key_flow}
TWO_LEVEL_KEYS = tuple(f"tenant/{flow}" for flow in FLOW_FUNCTIONS)
# Separates a tenant from its flow in a flow's counter name ("<tenant>/<flow>"); tenant ids never hold it.
FLOW_SEPARATOR = "/"


def flow_function(name: str) -> KeyFn | None:
    """The inner-level function of a two-level key name (`tenant/user` -> `user_flow`); None for a flat one."""
    outer, sep, inner = name.partition("/")
    if not sep:
        return None
    if outer != "tenant" or inner not in FLOW_FUNCTIONS:
        raise FairnessError(f"unknown fairness key {name!r}; two-level keys are {' | '.join(TWO_LEVEL_KEYS)}")
    return FLOW_FUNCTIONS[inner]


def key_function(name: str) -> KeyFn:
    """The key function called `name` (tenant | api_key | user); a two-level key's outer level is the tenant."""
    if flow_function(name) is not None:
        return tenant_key
    try:
        return KEY_FUNCTIONS[name]
    except KeyError:
        choices = " | ".join(KEY_FUNCTIONS)
        raise FairnessError(f"unknown fairness key {name!r}; expected one of {choices}") from None
