"""The admin API over real HTTP: auth, tenants, keys, usage, audit, live snapshot and SSE stream."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine import AsyncEngine
from gateway.admin.live import ServiceHistory, ServiceSample, share_point
from tests.gateway.conftest import Server, wait_for

ALL_ENDPOINTS = [
    ("GET", "/admin/api/engine"),
    ("GET", "/admin/api/engines"),
    ("GET", "/admin/api/live"),
    ("GET", "/admin/api/live/stream"),
    ("GET", "/admin/api/tenants"),
    ("POST", "/admin/api/tenants"),
    ("GET", "/admin/api/tenants/alice"),
    ("PATCH", "/admin/api/tenants/alice"),
    ("POST", "/admin/api/tenants/alice/disable"),
    ("POST", "/admin/api/tenants/alice/enable"),
    ("GET", "/admin/api/tenants/alice/keys"),
    ("POST", "/admin/api/tenants/alice/keys"),
    ("GET", "/admin/api/keys"),
    ("POST", "/admin/api/keys/x/revoke"),
    ("GET", "/admin/api/usage"),
    ("GET", "/admin/api/audit"),
    ("GET", "/admin/api/prefixes"),
    ("POST", "/admin/api/prefixes"),
    ("DELETE", "/admin/api/prefixes/x"),
    ("GET", "/admin/api/adapters"),
    ("POST", "/admin/api/adapters"),
    ("DELETE", "/admin/api/adapters/x"),
]


@pytest.fixture()
def admin(server: Server) -> Iterator[httpx.Client]:
    """A client that sends the admin token."""
    with httpx.Client(
        base_url=server.url, timeout=60.0, headers={"Authorization": f"Bearer {server.state.admin_token}"}
    ) as c:
        yield c


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _error(resp: httpx.Response, status: int, code: str, param: str | None = None) -> str:
    assert resp.status_code == status, resp.text[:500]
    err = resp.json()["error"]
    assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    assert "Traceback" not in resp.text
    return str(err["message"])


def _new_tenant(admin: httpx.Client, **fields: Any) -> dict[str, Any]:
    resp = admin.post("/admin/api/tenants", json={"name": _name("t"), **fields})
    assert resp.status_code == 201, resp.text
    return resp.json()  # type: ignore[no-any-return]


def _new_key(admin: httpx.Client, tenant: str, name: str = "k") -> tuple[str, dict[str, Any]]:
    resp = admin.post(f"/admin/api/tenants/{tenant}/keys", json={"name": name})
    assert resp.status_code == 201, resp.text
    return resp.json()["secret"], resp.json()["key"]


def _complete(server: Server, secret: str, max_tokens: int = 6) -> httpx.Response:
    body = {"model": server.model, "prompt": "fair share", "max_tokens": max_tokens, "ignore_eos": True}
    return httpx.post(
        f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {secret}"}, timeout=60
    )


# -- auth -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), ALL_ENDPOINTS)
def test_every_endpoint_needs_the_admin_token(server: Server, method: str, path: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        _error(c.request(method, path, json={}), 401, "invalid_admin_token")
        tenant_key = {"Authorization": f"Bearer {server.keys['alice']}"}
        _error(c.request(method, path, json={}, headers=tenant_key), 403, "forbidden")
        _error(
            c.request(method, path, json={}, headers={"Authorization": "Bearer fsa-wrong"}), 403, "forbidden"
        )


def test_dashboard_page_and_assets_are_local_and_token_free(server: Server) -> None:
    page = httpx.get(f"{server.url}/admin", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp
    assert server.state.admin_token not in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no CDN, nothing remote
    for asset in ("admin.js", "live.js", "chart.js", "util.js", "admin.css"):
        resp = httpx.get(f"{server.url}/admin/static/{asset}", timeout=30)
        assert resp.status_code == 200, asset
        assert "https://" not in resp.text and "cdn" not in resp.text.lower(), asset
    assert httpx.get(f"{server.url}/admin/static/nope.js", timeout=30).status_code == 404


def test_engine_endpoint_still_serves_raw_stats(server: Server, admin: httpx.Client) -> None:
    body = admin.get("/admin/api/engine").json()
    assert body["model"] == server.model
    assert body["stats"]["kv_blocks_total"] == server.state.engine.stats().kv_blocks_total


def test_engines_endpoint_lists_a_lone_engine_as_one_entry(server: Server, admin: httpx.Client) -> None:
    [row] = admin.get("/admin/api/engines").json()["engines"]
    assert row["key"] == "local" and row["alive"] and row["routed"] is None and row["in_flight"] is None
    assert row["kv_blocks_total"] == server.state.engine.stats().kv_blocks_total and 0 <= row["kv_use"] <= 1


# -- tenants ----------------------------------------------------------------------------------------


def test_create_list_get_tenant(admin: httpx.Client) -> None:
    t = _new_tenant(admin, weight=2.5, priority_class=0, tokens_per_minute=1000, max_queued_requests=3)
    assert (t["weight"], t["priority_class"], t["tokens_per_minute"], t["max_queued_requests"]) == (
        2.5,
        0,
        1000,
        3,
    )
    listed = {row["name"]: row for row in admin.get("/admin/api/tenants").json()["tenants"]}
    assert listed[t["name"]]["id"] == t["id"] and listed[t["name"]]["active_keys"] == 0
    assert admin.get(f"/admin/api/tenants/{t['name']}").json()["id"] == t["id"]
    assert admin.get(f"/admin/api/tenants/{t['id']}").json()["name"] == t["name"]


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"weight": 0}, "weight", "weight must be"),
        ({"weight": -1.5}, "weight", "weight must be"),
        ({"weight": "heavy"}, "weight", "weight must be"),
        ({"weight": True}, "weight", "weight must be"),
        ({"priority_class": 10}, "priority_class", "0..9"),
        ({"tokens_per_minute": -5}, "tokens_per_minute", ">= 0"),
        ({"tokens_per_day": -1}, "tokens_per_day", ">= 0"),
        ({"max_queued_requests": -2}, "max_queued_requests", ">= 0"),
        ({"tokens_per_minute": 1.5}, "tokens_per_minute", "integer"),
        ({"colour": "red"}, "colour", "unknown field"),
    ],
)
def test_bad_tenant_fields_are_400_naming_the_field(
    admin: httpx.Client, body: dict[str, Any], param: str, needle: str
) -> None:
    msg = _error(
        admin.post("/admin/api/tenants", json={"name": _name("bad"), **body}), 400, "invalid_value", param
    )
    assert needle in msg
    existing = _new_tenant(admin)
    msg = _error(admin.patch(f"/admin/api/tenants/{existing['id']}", json=body), 400, "invalid_value", param)
    assert needle in msg
    assert admin.get(f"/admin/api/tenants/{existing['id']}").json()["weight"] == 1.0  # nothing half-applied


def test_tenant_request_errors(admin: httpx.Client) -> None:
    t = _new_tenant(admin)
    assert "already exists" in _error(
        admin.post("/admin/api/tenants", json={"name": t["name"]}), 409, "tenant_exists"
    )
    other = _new_tenant(admin)
    _error(admin.patch(f"/admin/api/tenants/{other['id']}", json={"name": t["name"]}), 409, "tenant_exists")
    _error(admin.post("/admin/api/tenants", json={"weight": 2}), 400, "invalid_value", "name")
    _error(admin.post("/admin/api/tenants", content=b"{not json"), 400, "invalid_json")
    _error(admin.post("/admin/api/tenants", json=[1, 2]), 400, "invalid_json")
    _error(admin.patch(f"/admin/api/tenants/{t['id']}", json={}), 400, "invalid_value")
    for method, path, body in [
        ("GET", "/admin/api/tenants/nobody", None),
        ("PATCH", "/admin/api/tenants/nobody", {"weight": 2}),
        ("POST", "/admin/api/tenants/nobody/disable", None),
        ("GET", "/admin/api/tenants/nobody/keys", None),
        ("POST", "/admin/api/tenants/nobody/keys", {"name": "k"}),
    ]:
        assert "nobody" in _error(admin.request(method, path, json=body), 404, "tenant_not_found")
    _error(admin.get("/admin/api/no-such-endpoint"), 404, "not_found")


def test_weight_change_reaches_the_running_scheduler_and_the_audit_log(
    server: Server, admin: httpx.Client
) -> None:
    t = _new_tenant(admin)
    secret, _ = _new_key(admin, t["id"])
    served = server.state.engine
    assert isinstance(served, AsyncEngine)  # the suite's in-process engine: its scheduler is in reach
    policy = served.engine.policy
    started = threading.Event()
    result: dict[str, Any] = {}

    def stream() -> None:
        body = {
            "model": server.model,
            "prompt": "weights",
            "max_tokens": 120,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream(
            "POST",
            f"{server.url}/v1/completions",
            json=body,
            timeout=120,
            headers={"Authorization": f"Bearer {secret}"},
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    started.set()
            result["status"] = resp.status_code

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert started.wait(60), "no first token"
    resp = admin.patch(
        f"/admin/api/tenants/{t['id']}", json={"weight": 4}, headers={"X-Admin-Actor": "carol"}
    )
    assert resp.status_code == 200 and resp.json()["weight"] == 4.0 and resp.json()["engine_updated"] is True
    thread.join(120)
    assert result["status"] == 200
    wait_for(lambda: server.state.engine.stats().running == 0, 30, "request to finish")
    # Prefill was charged at weight 1, most decode tokens at weight 4 (counter grows by cost / weight).
    # Had the change not reached the scheduler, the in-flight request would still be charged at 1 (ratio 1).
    ratio = policy.counters()[t["id"]] / policy.service()[t["id"]]
    assert 0.25 < ratio < 0.9, ratio
    entry = admin.get("/admin/api/audit", params={"tenant": t["id"], "limit": 1}).json()["entries"][0]
    assert entry["actor"] == "admin:carol" and entry["action"] == "tenant.update"
    assert entry["before"]["weight"] == 1.0 and entry["after"]["weight"] == 4.0 and entry["at"]
    resp = admin.patch(f"/admin/api/tenants/{t['id']}", json={"tokens_per_day": 5000})
    assert resp.json()["engine_updated"] is False and resp.json()["tokens_per_day"] == 5000


def test_quota_change_and_disable_apply_to_the_next_request(server: Server, admin: httpx.Client) -> None:
    t = _new_tenant(admin)
    secret, _ = _new_key(admin, t["id"])
    assert _complete(server, secret).status_code == 200  # the key is now in the gateway's key cache
    admin.patch(f"/admin/api/tenants/{t['id']}", json={"tokens_per_minute": 3}).raise_for_status()
    resp = _complete(server, secret)  # larger than the whole quota: never admissible, no Retry-After
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "quota_exceeds_limit"
    snap = admin.get("/admin/api/live").json()
    recent = [r for r in snap["rejections"]["recent"] if r["tenant_id"] == t["id"]]
    assert recent and recent[0]["reason"] == "quota_exceeds_limit" and recent[0]["status"] == 400
    assert recent[0]["retry_after_s"] is None and "retry-after" not in resp.headers
    assert snap["rejections"]["by_reason"]["quota_exceeds_limit"] >= 1
    admin.patch(f"/admin/api/tenants/{t['id']}", json={"tokens_per_minute": None}).raise_for_status()
    assert _complete(server, secret).status_code == 200
    resp = admin.post(f"/admin/api/tenants/{t['id']}/disable")
    assert resp.status_code == 200 and resp.json()["disabled"] is True
    assert _complete(server, secret).status_code == 401
    assert admin.post(f"/admin/api/tenants/{t['id']}/enable").json()["disabled"] is False
    assert _complete(server, secret).status_code == 200


# -- keys -------------------------------------------------------------------------------------------


def test_key_lifecycle(server: Server, admin: httpx.Client) -> None:
    t = _new_tenant(admin)
    secret, key = _new_key(admin, t["name"], "ci")
    assert secret.startswith("fsk_") and secret.startswith(key["prefix"]) and key["tenant_name"] == t["name"]
    listed = admin.get(f"/admin/api/tenants/{t['id']}/keys").json()["keys"]
    assert [k["id"] for k in listed] == [key["id"]] and listed[0]["last_used_at"] is None
    assert secret not in admin.get("/admin/api/keys").text
    assert _complete(server, secret).status_code == 200
    listed = admin.get("/admin/api/keys", params={"tenant": t["name"]}).json()["keys"]
    assert listed[0]["last_used_at"] is not None and listed[0]["name"] == "ci" and listed[0]["created_at"]
    revoked = admin.post(f"/admin/api/keys/{key['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    assert _complete(server, secret).status_code == 401  # at once, not after the key cache TTL
    again = admin.post(f"/admin/api/keys/{key['prefix']}/revoke")
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]
    _error(admin.post("/admin/api/keys/fsk_nope/revoke"), 404, "key_not_found")
    _error(admin.post(f"/admin/api/tenants/{t['id']}/keys", json={"name": ""}), 400, "invalid_value", "name")
    _error(
        admin.post(f"/admin/api/tenants/{t['id']}/keys", json={"label": "x"}), 400, "invalid_value", "label"
    )
    _error(admin.get("/admin/api/keys", params={"tenant": "nobody"}), 404, "tenant_not_found")
    actions = [
        e["action"] for e in admin.get("/admin/api/audit", params={"tenant": t["id"]}).json()["entries"]
    ]
    assert actions[:2] == ["key.revoke", "key.create"]


# -- usage and audit --------------------------------------------------------------------------------


def test_usage_from_the_ledger(server: Server, admin: httpx.Client) -> None:
    t = _new_tenant(admin)
    secret, _ = _new_key(admin, t["id"])
    completions = [_complete(server, secret, n).json()["usage"] for n in (3, 5)]

    def summary() -> dict[str, Any] | None:
        rows = admin.get("/admin/api/usage", params={"window": "15m", "tenant": t["name"]}).json()["tenants"]
        return rows[0] if rows and rows[0]["requests"] == 2 else None

    row = wait_for(summary, 20, "ledger rows")
    assert row["tenant_name"] == t["name"] and row["requests_by_status"] == {"completed": 2}
    assert row["completion_tokens"] == sum(u["completion_tokens"] for u in completions)
    assert row["prompt_tokens"] == sum(u["prompt_tokens"] for u in completions)
    assert row["charged_service"] > 0
    future = admin.get("/admin/api/usage", params={"since": "2999-01-01", "tenant": t["id"]}).json()
    assert future["tenants"] == []
    _error(admin.get("/admin/api/usage", params={"window": "fortnight"}), 400, "invalid_value", "window")
    _error(
        admin.get("/admin/api/usage", params={"window": "1h", "since": "2h"}), 400, "invalid_value", "window"
    )
    _error(
        admin.get("/admin/api/usage", params={"since": "1h", "until": "2h"}), 400, "invalid_value", "until"
    )
    _error(admin.get("/admin/api/usage", params={"tenant": "nobody"}), 404, "tenant_not_found")


def test_audit_limits(admin: httpx.Client) -> None:
    _new_tenant(admin)
    _new_tenant(admin)
    assert len(admin.get("/admin/api/audit", params={"limit": 2}).json()["entries"]) == 2
    _error(admin.get("/admin/api/audit", params={"limit": 0}), 400, "invalid_value", "limit")
    _error(admin.get("/admin/api/audit", params={"limit": "many"}), 400, "invalid_value", "limit")
    resp = admin.post("/admin/api/tenants", json={"name": _name("a")}, headers={"X-Admin-Actor": "x" * 65})
    _error(resp, 400, "invalid_value", "X-Admin-Actor")


# -- live -------------------------------------------------------------------------------------------


def test_live_snapshot_tracks_queues_service_and_shares(server: Server, admin: httpx.Client) -> None:
    t = _new_tenant(admin, weight=3)
    secret, _ = _new_key(admin, t["id"])
    admin.get("/admin/api/live")  # a sample before the load, so a share point can span it
    assert _complete(server, secret, 4).status_code == 200
    wait_for(lambda: server.state.engine.stats().running == 0, 30, "engine idle")

    def with_share() -> dict[str, Any] | None:
        snap = admin.get("/admin/api/live").json()
        points = [p for p in snap["share"]["points"] if t["id"] in p["share"]]
        return snap if points else None

    snap = wait_for(with_share, 10, "a share point for the tenant")
    row = next(r for r in snap["tenants"] if r["id"] == t["id"])
    assert row["weight"] == 3.0 and row["service"] == server.state.engine.stats().service[t["id"]] > 0
    enabled = [r["weight"] for r in snap["tenants"] if not r["disabled"]]
    assert row["weight_share"] == pytest.approx(3.0 / sum(enabled))
    point = [p for p in snap["share"]["points"] if t["id"] in p["share"]][-1]
    assert sum(point["share"].values()) == pytest.approx(1.0)
    assert sum(point["weight_share"].values()) == pytest.approx(1.0)
    engine = snap["engine"]
    assert engine["kv_blocks_used"] + engine["kv_blocks_free"] == engine["kv_blocks_total"] > 0
    served = server.state.engine
    assert isinstance(served, AsyncEngine)  # the suite's in-process engine, with its config
    assert engine["max_num_seqs"] == served.config.max_num_seqs
    assert snap["iterations"] and {"waiting", "running", "kv_blocks_used", "preemptions"} <= set(
        snap["iterations"][0]
    )
    assert admin.get("/admin/api/live", params={"history": 0}).json()["share"]["points"] == []
    _error(admin.get("/admin/api/live", params={"history": -1}), 400, "invalid_value", "history")


def test_live_stream_sends_snapshots(server: Server, admin: httpx.Client) -> None:
    _error(
        admin.get("/admin/api/live/stream", params={"interval_ms": 5}), 400, "invalid_value", "interval_ms"
    )
    snaps: list[dict[str, Any]] = []
    with admin.stream("GET", "/admin/api/live/stream", params={"interval_ms": 200}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                snaps.append(json.loads(line[6:]))
            if len(snaps) == 3:
                break
    assert snaps[0]["time"] < snaps[1]["time"] < snaps[2]["time"]
    assert {"engine", "tenants", "rejections", "iterations", "share"} <= set(snaps[-1])
    assert len(snaps[-1]["share"]["points"]) <= 1


def test_share_point_and_history() -> None:
    before = ServiceSample(0.0, {"a": 10.0, "b": 5.0}, {"a": 1.0, "b": 3.0})
    now = ServiceSample(30.0, {"a": 40.0, "b": 15.0, "c": 0.0}, {"a": 1.0, "b": 3.0})
    point = share_point(before, now)
    assert point is not None
    assert point["share"] == pytest.approx({"a": 0.75, "b": 0.25})
    assert point["weight_share"] == pytest.approx({"a": 0.25, "b": 0.75})
    assert share_point(now, now) is None
    history = ServiceHistory(capacity=10, min_interval_s=1.0)
    for i in range(8):
        history.observe(float(i * 10), {"a": float(i), "b": float(2 * i)}, {})
    history.observe(70.5, {"a": 100.0}, {})  # too soon after the previous sample: dropped
    assert len(history) == 8
    points = history.share_points(window_s=20.0)
    assert len(points) == 7 and all(p["window_s"] <= 20.0 for p in points)
    assert points[-1]["share"] == pytest.approx({"a": 1 / 3, "b": 2 / 3})
    assert len(history.share_points(window_s=20.0, last=2)) == 2


def test_backlogged_share_and_weight_changes_of_the_history() -> None:
    # a had work queued 27 of 30 s, b 3 of 30 s; b's weight went from 3 to 5 at the last sample.
    history = ServiceHistory(capacity=10, min_interval_s=1.0)
    history.observe(0.0, {"a": 0.0, "b": 0.0}, {"a": 1.0, "b": 3.0}, {"a": 0.0, "b": 0.0})
    history.observe(15.0, {"a": 50.0, "b": 10.0}, {"a": 1.0, "b": 3.0}, {"a": 13.0, "b": 1.0})
    history.observe(30.0, {"a": 90.0, "b": 30.0}, {"a": 1.0, "b": 5.0}, {"a": 27.0, "b": 3.0})
    points = history.share_points(window_s=30.0)
    assert points[-1]["backlogged"] == pytest.approx({"a": 0.9, "b": 0.1})
    assert points[-1]["weight_changes"] == {"b": [3.0, 5.0]}
    assert "weight_changes" not in points[0]
    assert history.backlog_share(30.0) == pytest.approx({"a": 0.9, "b": 0.1})
    # An engine restart starts its counters again: never a negative share.
    history.observe(45.0, {"a": 95.0, "b": 31.0}, {"a": 1.0, "b": 5.0}, {"a": 2.0, "b": 0.0})
    assert history.share_points(window_s=15.0)[-1]["backlogged"] == {"a": 0.0, "b": 0.0}
