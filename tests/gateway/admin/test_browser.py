"""The /admin dashboard in a real headless Chromium: login, tenants, keys, and the live fairness chart."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from tests.gateway.admin.conftest import ARTIFACTS, Load
from tests.gateway.conftest import Server, wait_for

# The page shows everything the shared server has seen: run where only the serial part has used it
# (scripts/test.sh), as in a serial run, not after whatever the other files on its worker left there.
pytestmark = pytest.mark.serial


def test_dashboard_end_to_end(server: Server, browser: Any) -> None:
    token = server.state.admin_token
    name = f"web-{uuid.uuid4().hex[:6]}"
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    urls: list[str] = []
    page.on("request", lambda req: urls.append(req.url))
    script_errors: list[str] = []
    page.on("pageerror", lambda exc: script_errors.append(str(exc)))
    failed: list[str] = []
    page.on(
        "response", lambda resp: failed.append(f"{resp.status} {resp.url}") if resp.status >= 400 else None
    )
    admin = httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {token}"})
    try:
        page.goto(f"{server.url}/admin")
        page.wait_for_selector("body[data-ready='true']")

        # Log in: a wrong token is refused, the admin token opens the dashboard.
        page.fill("#token", "fsa-not-the-token")
        page.click("#login-form button[type=submit]")
        page.wait_for_function(
            "() => document.getElementById('login-error').textContent.includes('not the admin token')"
        )
        page.fill("#token", token)
        page.fill("#actor", "browser-test")
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#dashboard", state="visible")
        page.wait_for_function("() => document.getElementById('conn').textContent === 'live'")

        # The engines panel: this gateway's only engine is one entry, up, with nothing routed to count.
        local = "#engines tr[data-key='local']"
        page.wait_for_selector(local)
        assert page.inner_text(f"{local} .c-status") == "up"
        assert page.inner_text(f"{local} .c-routed") == "–"
        assert page.inner_text(f"{local} .c-kv").startswith("0 / ")
        assert page.inner_text("#engines-status") == "1 of 1 up"

        # Create a tenant, then set its weight inline.
        page.fill("#new-tenant [name=name]", name)
        page.click("#new-tenant button[type=submit]")
        row = f"#tenants tr[data-name='{name}']"
        page.wait_for_selector(row)
        page.fill(f"{row} [name=weight]", "3")
        # The save re-renders the row after its message shows: wait for the new row, or the next edit
        # lands in the old one (a race a loaded machine loses).
        page.eval_on_selector(row, "r => r.dataset.stale = '1'")
        page.click(f"{row} button.save")
        page.wait_for_function(
            f'() => {{ const r = document.querySelector("{row}"); '
            "return r && !r.dataset.stale && r.querySelector('.row-msg').textContent.includes('saved'); }"
        )
        tenant = admin.get(f"/admin/api/tenants/{name}").json()
        assert tenant["weight"] == 3.0
        audit = admin.get("/admin/api/audit", params={"tenant": tenant["id"], "limit": 1}).json()["entries"][
            0
        ]
        assert audit["actor"] == "admin:browser-test" and audit["after"]["weight"] == 3.0
        row = f"#tenants tr[data-name='{name}']"
        page.fill(f"{row} [name=cache_group]", "acme")  # share prefix-cache blocks with group acme
        page.select_option(f"{row} [name=on_infeasible]", "fallback")  # its default X-On-Infeasible
        page.eval_on_selector(row, "r => r.dataset.stale = '1'")  # the save re-renders the row: wait for that
        page.click(f"{row} button.save")
        page.wait_for_function(
            f'() => {{ const r = document.querySelector("{row}"); '
            "return r && !r.dataset.stale && r.querySelector('.row-msg').textContent.includes('saved'); }"
        )
        saved = admin.get(f"/admin/api/tenants/{name}").json()
        assert (saved["cache_group"], saved["on_infeasible"]) == ("acme", "fallback")
        assert page.eval_on_selector(f"{row} [name=on_infeasible]", "s => s.value") == "fallback"
        page.fill(f"{row} [name=weight]", "0")
        page.click(f"{row} button.save")
        page.wait_for_function(
            f"() => document.querySelector(\"{row} .row-msg\").textContent.includes('weight must be')"
        )

        # Create a key for it: the secret is shown once, and it works.
        page.select_option("#key-tenant", tenant["id"])
        page.fill("#new-key [name=name]", "browser")
        page.click("#new-key button[type=submit]")
        page.wait_for_selector("#new-key-box", state="visible")
        secret = page.inner_text("#new-key-secret").strip()
        assert secret.startswith("fsk_")
        page.click("#new-key-dismiss")
        assert page.inner_text("#new-key-secret") == ""

        # Load from the new tenant (weight 3) and bob (weight 1): the chart must pick the tenant up.
        chart = page.locator("#share-chart")
        updates_before = int(chart.get_attribute("data-updates") or "0")
        # More streams than engine slots (8), so the tenants are backlogged and VTC decides who runs.
        with Load(server, [secret, server.keys["bob"]], per_tenant=6, max_tokens=32):
            page.wait_for_function(
                "([n, before]) => { const d = document.getElementById('share-chart').dataset;"
                " const latest = JSON.parse(d.latest || '{}');"
                " return Number(d.updates) > before && (latest[n] || 0) > 0 && Number(d.series) >= 1; }",
                arg=[name, updates_before],
                timeout=45_000,
            )
            page.wait_for_function("() => document.getElementById('g-running').textContent !== '0'")
            page.wait_for_function(
                "() => document.querySelector(\"#engines tr[data-key='local'] .c-running\")"
                ".textContent !== '0'"
            )
            assert page.inner_text("#engines tr[data-key='local'] .c-model") == server.model
            # A few more seconds of points so the screenshot shows lines, not dots.
            page.wait_for_function(
                "() => Number(document.getElementById('share-chart').dataset.points) >= 5", timeout=30_000
            )
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "admin-dashboard.png"), full_page=True)
            latest = json.loads(chart.get_attribute("data-latest") or "{}")
            weights = json.loads(chart.get_attribute("data-latest-weight") or "{}")
        assert 0 < latest[name] <= 1 and sum(latest.values()) == pytest.approx(1.0, abs=1e-3)
        if "bob" in weights:
            assert weights[name] == pytest.approx(3 * weights["bob"], rel=1e-3)
        assert int(chart.get_attribute("data-points") or "0") >= 1

        # Revoke the key from the keys table: it stops working at once.
        prefix = secret[:12]
        page.once("dialog", lambda dialog: dialog.accept())
        page.click(f"#keys tr[data-prefix='{prefix}'] button.revoke")
        page.wait_for_function(
            f"() => document.querySelector(\"#keys tr[data-prefix='{prefix}'] .c-status\").textContent.startsWith('revoked')"
        )
        resp = httpx.post(
            f"{server.url}/v1/completions",
            headers={"Authorization": f"Bearer {secret}"},
            json={"model": server.model, "prompt": "x", "max_tokens": 1},
            timeout=30,
        )
        assert resp.status_code == 401

        # The token never travels in a URL.
        assert urls and not [u for u in urls if token in u]
        assert token not in page.url
        assert not script_errors, script_errors
        # Only the two refusals this test provoked: the wrong token and the zero weight.
        assert [f.split(" ")[0] for f in failed] == ["403", "400"], failed
    finally:
        admin.close()
        context.close()
    wait_for(lambda: server.state.engine.stats().running == 0, 60, "load to drain")
